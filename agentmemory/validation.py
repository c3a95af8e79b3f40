"""Input rules of the contract. Every check runs before any query, so bad input changes nothing."""

from __future__ import annotations

import json
import math
import unicodedata
from datetime import timedelta
from typing import Any

from .errors import InvalidMemory

SESSION_ID_MAX = 128
KEY_MAX = 255
IDEMPOTENCY_KEY_MAX = 64


def _check_name(field: str, text: Any, limit: int) -> str:
    if not isinstance(text, str):
        raise InvalidMemory(field, f"must be a str, got {type(text).__name__}")
    if not 1 <= len(text) <= limit:
        raise InvalidMemory(field, f"must be 1 to {limit} characters, got {len(text)}")
    for position, char in enumerate(text):
        # Cc: control characters (NUL, newline, DEL...); Cs: lone surrogates no database stores.
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise InvalidMemory(
                field, f"must not contain control characters (found {char!r} at {position})"
            )
    return text


def check_session_id(session_id: Any) -> str:
    return _check_name("session_id", session_id, SESSION_ID_MAX)


def check_key(key: Any) -> str:
    return _check_name("key", key, KEY_MAX)


def check_idempotency_key(idempotency_key: Any) -> str | None:
    if idempotency_key is None:
        return None
    return _check_name("idempotency_key", idempotency_key, IDEMPOTENCY_KEY_MAX)


def check_version(field: str, version: Any, *, minimum: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidMemory(field, f"must be an int, got {type(version).__name__}")
    if version < minimum:
        raise InvalidMemory(field, f"must be >= {minimum}, got {version}")
    return version


def check_ttl(ttl: Any) -> timedelta | None:
    """``ttl`` in seconds (int/float) or a timedelta, > 0; None passes through."""
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        seconds = ttl.total_seconds()
    elif isinstance(ttl, int | float) and not isinstance(ttl, bool):
        seconds = float(ttl)
    else:
        raise InvalidMemory("ttl", f"must be seconds (int or float) or a timedelta, got {ttl!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidMemory("ttl", f"must be > 0 seconds, got {ttl!r}")
    return timedelta(seconds=seconds)


def _check_json(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidMemory("value", f"{path} is {value!r}; JSON has no NaN or Infinity")
        return
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidMemory(
                "value", f"{path} contains a NUL character, which PostgreSQL cannot store"
            )
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                raise InvalidMemory(
                    "value",
                    f"{path} has a {type(name).__name__} key {name!r}; JSON keys are strings",
                )
            if "\x00" in name:
                raise InvalidMemory("value", f"{path} has a key with a NUL character")
            _check_json(item, f"{path}.{name}")
        return
    raise InvalidMemory("value", f"{path} is a {type(value).__name__}, which is not JSON")


def encode_value(value: Any, max_bytes: int) -> str:
    """``value`` as JSON text, if it is strict JSON (no NaN/Infinity, bytes, sets, non-string
    keys) of at most ``max_bytes`` UTF-8 bytes."""
    try:
        _check_json(value, "$")
    except RecursionError:
        raise InvalidMemory("value", "is nested too deeply to be JSON") from None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
    except (UnicodeEncodeError, ValueError, RecursionError) as exc:
        raise InvalidMemory("value", f"cannot be encoded as JSON: {exc}") from None
    if size > max_bytes:
        raise InvalidMemory(
            "value", f"is {size} bytes as JSON, over the limit of {max_bytes} (MAX_VALUE_BYTES)"
        )
    return text
