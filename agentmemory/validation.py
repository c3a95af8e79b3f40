"""Input rules of the contract. Every check runs before any query, so bad input changes nothing."""

from __future__ import annotations

import functools
import json
import math
import string
import unicodedata
from datetime import timedelta
from typing import Any

from .conf import get_config
from .errors import InvalidMemory

SESSION_ID_MAX = 128
#: An MCP principal's name (agentmemory.integrations.mcp): ASCII letters, digits and ``_.@+-``.
PRINCIPAL_MAX = 32
KEY_MAX = 255
IDEMPOTENCY_KEY_MAX = 64
#: Longest LangGraph ``thread_id`` and ``checkpoint_ns`` (a nested subgraph's namespace is
#: ``outer:<task id>|inner:<task id>``, about 40 characters a level). Together they fit the MySQL
#: family's 3,072-byte index key (4 bytes a character).
THREAD_ID_MAX = 255
CHECKPOINT_NS_MAX = 500
#: Longest checkpoint id, channel name, channel version and task id.
CHECKPOINT_NAME_MAX = 255
#: Shortest TTL: Redis keeps expiries in milliseconds, and a shorter one would round to "never".
TTL_MIN_SECONDS = 0.001
#: Longest TTL: 100 years, far inside every backend's date range (and Python's).
TTL_MAX_SECONDS = 100 * 365 * 24 * 3600
#: Deepest nesting of arrays and objects in a value. MariaDB refuses JSON nested past 31
#: containers (error 4025); one limit for every backend, checked before any query.
MAX_DEPTH = 30
#: Largest ``batch`` of ``purge_expired`` (one query reads that many rows).
BATCH_MAX = 100_000
#: The largest version number (the columns are unsigned 63-bit integers on every backend):
#: ``expected_version``, ``version``, ``before_version`` above it are refused.
VERSION_MAX = 2**63 - 1
#: Most texts one value may have embedded (the paths of ``index=`` / ``FIELDS`` can match a
#: whole list): each is a vector of DIMS floats stored on the live row and on the version.
INDEX_TEXTS_MAX = 256
#: Longest vector an index may make (``DIMS``; 16,000 float32 are 64 KB a text).
DIMS_MAX = 16_000
#: The largest page ``history(limit=...)`` returns.
HISTORY_PAGE_MAX = 10_000
#: The most results one search returns, and the furthest one may page (``offset``): a search
#: reads and scores ``offset + limit`` memories whole.
SEARCH_LIMIT_MAX = 1000
SEARCH_OFFSET_MAX = 100_000
#: Bidirectional-text controls: they make an id display as another ("live" reads "evil") in the
#: admin, logs and terminals.
BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_ZWNJ, _ZWJ = "\u200c", "\u200d"
_TAG_BASE, _TAG_END = "\U0001f3f4", "\U000e007f"


def visible(text: str) -> str:
    """``text`` with every character an id may not hold spelled out (``\\u202e``): the admin,
    ``str()`` of a row and error messages show ids stored before a rule existed as they are."""
    if _forbidden_character(text) is None:
        return text
    return "".join(
        _escaped(c) if _refused_at(text, at) is not None else c for at, c in enumerate(text)
    )


def _escaped(char: str) -> str:
    return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"


def _check_name(field: str, text: Any, limit: int, *, minimum: int = 1) -> str:
    if not isinstance(text, str):
        raise InvalidMemory(field, f"must be a str, got {type(text).__name__}")
    if not minimum <= len(text) <= limit:
        raise InvalidMemory(field, f"must be {minimum} to {limit} characters, got {len(text)}")
    problem = _forbidden_character(text)
    if problem is not None:
        raise InvalidMemory(field, problem)
    return text


def check_name(field: str, text: Any, limit: int, *, minimum: int = 1) -> str:
    """An id of an adapter (a thread, a checkpoint, a channel, an ADK app): the rules of a
    session id (a ``str`` in NFC, no control characters, lone surrogates, bidirectional or
    invisible format characters), ``minimum`` to ``limit`` characters."""
    return _check_name(field, text, limit, minimum=minimum)


def check_text(field: str, text: Any, limit: int) -> str:
    """Free text a database must store as given (a path, a query): a ``str`` of at most
    ``limit`` characters without NUL (PostgreSQL refuses it) or lone surrogates (no database
    stores them)."""
    if not isinstance(text, str):
        raise InvalidMemory(field, f"must be a str, got {type(text).__name__}")
    if len(text) > limit:
        raise InvalidMemory(field, f"must be at most {limit} characters, got {len(text)}")
    if "\x00" in text:
        raise InvalidMemory(field, "contains a NUL character, which PostgreSQL cannot store")
    try:
        _check_encodable("$", text)
    except InvalidMemory as error:
        raise InvalidMemory(field, error.message.removeprefix("$ ")) from None
    return text


#: The latest POSIX timestamp a date can hold (9999-12-31T23:59:59 UTC).
TIMESTAMP_MAX = 253_402_300_799


def check_timestamp(field: str, timestamp: Any) -> float:
    """POSIX seconds (int or float) a date can hold: finite, from 0 to year 9999."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
        raise InvalidMemory(field, f"must be POSIX seconds, got {type(timestamp).__name__}")
    if not 0 <= timestamp <= TIMESTAMP_MAX:  # NaN compares false: refused too
        raise InvalidMemory(
            field, f"must be from 0 to {TIMESTAMP_MAX} (year 9999), got {short_repr(timestamp)}"
        )
    return float(timestamp)


@functools.lru_cache(maxsize=4096)
def _forbidden_character(text: str) -> str | None:
    """What is wrong with the characters of an id, or None. Cached: an agent recalls the same
    few ids over and over, and the scan was a tenth of a ``recall`` from SQLite."""
    if text.isascii():
        if text.isprintable():
            return None
    elif not unicodedata.is_normalized("NFC", text):
        # Refused, not normalized: a store that rewrote ids would hand back records whose key is
        # not the one asked for (a dict of recall_many results would miss it).
        return (
            "must be in Unicode normalization form NFC (the same text can be written with "
            "combining characters, and the two would be two ids that display alike): pass "
            "unicodedata.normalize('NFC', text)"
        )
    for position in range(len(text)):
        problem = _refused_at(text, position)
        if problem is not None:
            return problem
    return None


def _refused_at(text: str, at: int) -> str | None:
    """Why the character at ``at`` may not stand there, or None. Refused: control characters,
    lone surrogates, line and paragraph separators, bidirectional-text controls, and every other
    invisible format character (zero-width space, soft hyphen, word joiner, BOM, tag
    characters...) -- each makes an id display as another -- except where text needs them: a
    zero-width joiner between two symbols (emoji sequences), a zero-width non-joiner after a
    letter of a script that uses it (Persian, Indic), tag characters in an emoji flag."""
    char = text[at]
    category = unicodedata.category(char)
    if category == "Cc":
        return f"must not contain control characters (found {char!r} at {at})"
    if category == "Cs":
        return f"must not contain lone surrogates (found U+{ord(char):04X} at {at})"
    if char in BIDI_CONTROLS:
        return f"must not contain bidirectional-text controls (found U+{ord(char):04X} at {at})"
    if category in ("Zl", "Zp"):
        return f"must not contain line or paragraph separators (found U+{ord(char):04X} at {at})"
    if category != "Cf" or _format_character_allowed(text, at):
        return None
    name = unicodedata.name(char, "a format character")
    return (
        f"must not contain invisible format characters (found U+{ord(char):04X} {name} at {at}): "
        "they make an id display as another"
    )


def _format_character_allowed(text: str, at: int) -> bool:
    char = text[at]
    before = text[at - 1] if at else ""
    after = text[at + 1] if at + 1 < len(text) else ""
    if char == _ZWJ:
        # 👨\u200d👩: the previous symbol may carry a variation selector or a skin tone.
        base = text[at - 2] if before in ("\ufe0f", "\ufe0e") and at >= 2 else before
        return _is_symbol(base) and _is_symbol(after)
    if char == _ZWNJ:
        return bool(before) and unicodedata.category(before) in ("Lo", "Mn", "Mc")
    if "\U000e0020" <= char <= _TAG_END:
        # 🏴 + tag letters + CANCEL TAG (the flags of England, Scotland, Wales).
        start = at
        while start and "\U000e0020" <= text[start - 1] <= "\U000e007e":
            start -= 1
        end = at
        while end + 1 < len(text) and "\U000e0020" <= text[end] <= "\U000e007e":
            end += 1
        return start > 0 and text[start - 1] == _TAG_BASE and text[end] == _TAG_END
    return False


def _is_symbol(char: str) -> bool:
    return bool(char) and unicodedata.category(char) in ("So", "Sk")


def check_session_id(session_id: Any) -> str:
    return _check_name("session_id", session_id, SESSION_ID_MAX)


_PRINCIPAL_CHARS = frozenset(string.ascii_letters + string.digits + "_.@+-")


def check_principal(principal: Any) -> str:
    """An MCP principal's name: 1 to :data:`PRINCIPAL_MAX` ASCII letters, digits and ``_.@+-``
    (no space, no accent, no ``:`` -- the separator of the session ids it owns). Case counts:
    ``Alice`` and ``alice`` are two principals."""
    if not isinstance(principal, str):
        raise InvalidMemory("principal", f"must be a str, got {type(principal).__name__}")
    if not 1 <= len(principal) <= PRINCIPAL_MAX:
        raise InvalidMemory(
            "principal", f"must be 1 to {PRINCIPAL_MAX} characters, got {len(principal)}"
        )
    wrong = sorted(set(principal) - _PRINCIPAL_CHARS)
    if wrong:
        raise InvalidMemory(
            "principal",
            f"may hold only ASCII letters, digits and _.@+- (found {''.join(wrong)!r} in "
            f"{principal!r})",
        )
    return principal


def check_key(key: Any) -> str:
    return _check_name("key", key, KEY_MAX)


def check_stream(stream: Any) -> str:
    """A log's name within its session: the rules of a key."""
    return _check_name("stream", stream, KEY_MAX)


def check_sequence(field: str, values: Any, what: str = "ids") -> list[Any]:
    """A list or tuple of ``what`` as a list -- never a ``str`` (whose characters would each be
    taken for an id: ``prune("abc")`` deleting threads ``a``, ``b``, ``c``), bytes, a mapping
    (its keys) or a set (no order); every public call that takes several ids checks with it
    before anything reaches a driver."""
    if isinstance(values, str | bytes | bytearray):
        raise InvalidMemory(
            field, f"must be a list of {what}, got a single {type(values).__name__} {values!r:.60}"
        )
    if not isinstance(values, list | tuple):
        raise InvalidMemory(field, f"must be a list of {what}, got {type(values).__name__}")
    return list(values)


def check_items(items: Any) -> list[Any]:
    """A log append's items: a list (or tuple) of at most :data:`BATCH_MAX` values, each one
    the rules of a memory's value (:func:`check_value`); decoded copies. The error names the
    item by its index."""
    items = check_sequence("items", items, "JSON values")
    if len(items) > BATCH_MAX:
        raise InvalidMemory("items", f"holds {len(items)} items, over the limit of {BATCH_MAX}")
    checked = []
    for index, item in enumerate(items):
        try:
            checked.append(check_value(item))
        except InvalidMemory as error:
            raise InvalidMemory(f"items[{index}]", error.message) from None
    return checked


def check_prefix(prefix: Any) -> str:
    """A key prefix: the rules of a key, but it may be empty (every key)."""
    return _check_name("prefix", prefix, KEY_MAX, minimum=0)


def check_idempotency_key(idempotency_key: Any) -> str | None:
    if idempotency_key is None:
        return None
    return _check_name("idempotency_key", idempotency_key, IDEMPOTENCY_KEY_MAX)


def check_version(field: str, version: Any, *, minimum: int, maximum: int = VERSION_MAX) -> int:
    """An int from ``minimum`` to ``maximum`` (default :data:`VERSION_MAX`, the columns' range:
    a larger one would overflow the driver's integer before any query)."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidMemory(field, f"must be an int, got {type(version).__name__}")
    if version < minimum:
        raise InvalidMemory(field, f"must be >= {minimum}, got {version}")
    if version > maximum:
        raise InvalidMemory(field, f"must be <= {maximum}, got {short_repr(version)}")
    return version


def check_ttl(ttl: Any) -> timedelta | None:
    """``ttl`` in seconds (int/float) or a timedelta, from :data:`TTL_MIN_SECONDS` to
    :data:`TTL_MAX_SECONDS`; None passes through."""
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        seconds: float = ttl.total_seconds()
    elif isinstance(ttl, int) and not isinstance(ttl, bool):
        # Compared as an int first: float(10**400) would raise OverflowError.
        seconds = (
            float(ttl) if abs(ttl) <= TTL_MAX_SECONDS else (math.inf if ttl > 0 else -math.inf)
        )
    elif isinstance(ttl, float):
        seconds = ttl
    else:
        raise InvalidMemory("ttl", f"must be seconds (int or float) or a timedelta, got {ttl!r}")
    if math.isnan(seconds) or not TTL_MIN_SECONDS <= seconds <= TTL_MAX_SECONDS:
        raise InvalidMemory(
            "ttl",
            f"must be from {TTL_MIN_SECONDS} to {TTL_MAX_SECONDS} seconds (100 years), got "
            f"{short_repr(ttl)}",
        )
    return timedelta(seconds=seconds)


def check_days(field: str, days: Any) -> float:
    """A number of days, > 0 and at most 100 years."""
    if isinstance(days, bool) or not isinstance(days, int | float):
        raise InvalidMemory(field, f"must be a number of days, got {short_repr(days)}")
    if math.isnan(days) or not 0 < days <= TTL_MAX_SECONDS / 86400:
        raise InvalidMemory(field, f"must be > 0 and at most 36500 days, got {short_repr(days)}")
    return float(days)


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters for a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_json(value: Any) -> None:
    """Strict JSON, at most :data:`MAX_DEPTH` containers deep. Iterative: the depth a value can
    reach does not depend on the caller's stack."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, path, depth = stack.pop()
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidMemory("value", f"{path} is {item!r}; JSON has no NaN or Infinity")
            continue
        if isinstance(item, str):
            if "\x00" in item:
                raise InvalidMemory(
                    "value", f"{path} contains a NUL character, which PostgreSQL cannot store"
                )
            _check_encodable(path, item)
            continue
        if isinstance(item, list | tuple | dict):
            if depth >= MAX_DEPTH:
                raise InvalidMemory(
                    "value", f"{path} nests arrays/objects deeper than the limit of {MAX_DEPTH}"
                )
            if isinstance(item, dict):
                for name, child in item.items():
                    if not isinstance(name, str):
                        raise InvalidMemory(
                            "value",
                            f"{path} has a {type(name).__name__} key {name!r}; JSON keys are "
                            "strings",
                        )
                    if "\x00" in name:
                        raise InvalidMemory("value", f"{path} has a key with a NUL character")
                    _check_encodable(f"{path} (a key)", name)
                    stack.append((child, f"{path}.{name}", depth + 1))
            else:
                stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
            continue
        raise InvalidMemory("value", f"{path} is a {type(item).__name__}, which is not JSON")


def _check_encodable(path: str, text: str) -> None:
    """A lone surrogate cannot be encoded as UTF-8 (no database stores it); the message names it
    by code point, never by the character itself (which no page or log could print)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidMemory(
            "value",
            f"{path} contains a lone surrogate (U+{ord(text[error.start]):04X} at "
            f"{error.start}), which is not Unicode text",
        ) from None


def check_value(value: Any) -> Any:
    """A decoded copy of ``value`` if it may be stored (:func:`encode_value` under
    ``MAX_VALUE_BYTES``, read at each use so that ``override_settings`` applies): the caller's
    later mutations cannot reach what was stored or returned."""
    return json.loads(encode_value(value, get_config()["MAX_VALUE_BYTES"]))


def encode_value(value: Any, max_bytes: int) -> str:
    """``value`` as JSON text, if it is strict JSON (no NaN/Infinity, bytes, sets, non-string
    keys, at most :data:`MAX_DEPTH` levels) of at most ``max_bytes`` UTF-8 bytes."""
    _check_json(value)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
    except (UnicodeEncodeError, ValueError) as exc:
        raise InvalidMemory("value", f"cannot be encoded as JSON: {exc}") from None
    if size > max_bytes:
        raise InvalidMemory(
            "value", f"is {size} bytes as JSON, over the limit of {max_bytes} (MAX_VALUE_BYTES)"
        )
    return text


def same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same JSON: objects by their members in any order,
    ``true`` never equal to ``1`` (Python's ``True == 1`` is), numbers by value, and a float
    equal to a number the database wrote out in full (PostgreSQL's ``jsonb`` turns ``1e300``
    into 301 digits, which decode to an int). An idempotency key's retry is recognised by it."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if isinstance(a, float) or isinstance(b, float):
            try:
                return float(a) == float(b)
            except OverflowError:
                return False
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if a is None or b is None:
        return a is None and b is None
    return type(a) is type(b) and a == b
