"""Semantic recall: what a memory is indexed by, how it is embedded, how a search scores it.

An :class:`Index` says which texts of a value are embedded (``fields``: JSON paths, ``"$"`` for the
whole value), by which embedder and into how many dimensions. A memory's vectors are computed
**before** its write takes the row lock whenever the value is known up front (``remember``,
``remember_many``) and, for ``update(fn)`` and ``revert``, under the lock from the value just
computed; they are stored in the same statements as the version they belong to, on the live row
and on the history version. A search reads values and vectors in one statement, so a score is
always computed from the vector of the version it returns. The embedder failing or timing out
fails the write (:class:`EmbeddingFailed`) before anything is written.

Vectors are stored L2-normalized as little-endian float32, one row per indexed text; a memory's
score is its best text's cosine similarity to the query (LangGraph's max pooling).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import json
import math
import re
import secrets
import struct
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .errors import EmbeddingFailed, InvalidMemory
from .validation import DIMS_MAX, INDEX_TEXTS_MAX

#: Fields of a value that a filter may name: letters, digits, ``_``, ``.``, ``-``.
FILTER_FIELD = re.compile(r"^[a-zA-Z0-9_.-]+$")
OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "$eq": lambda a, b: a == b,
    "$ne": lambda a, b: a != b,
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}
_PATH_TOKEN = re.compile(r"\[(\*|-?\d+)\]|([^.\[\]]+)")


@dataclass(frozen=True)
class Index:
    """How memories are embedded for :meth:`~agentmemory.MemoryStore.search`.

    ``embed``: a callable ``list[str] -> list[list[float]]``, a LangChain ``Embeddings`` (its
    ``embed_documents`` and ``embed_query``), or the dotted path of either; ``dims``: the
    vectors' length; ``fields``: the JSON paths of a value to embed (``"$"``: the whole value,
    ``"text"``, ``"a.b"``, ``"items[*].text"``, ``"items[0]"``); ``timeout``: seconds an embedder
    call may take (None: no limit)."""

    embed: Any
    dims: int
    fields: tuple[str, ...] = ("$",)
    timeout: float | None = 30.0
    #: The embedding model's name (``SEARCH["MODEL"]``): vectors are stored with a fingerprint of
    #: it and ``dims``, and a search compares only vectors of its own model. None: the embedder's
    #: own name (its class or function, and its ``model``/``model_name`` attribute if it has one).
    model: str | None = None
    _paths: tuple[tuple[str, tuple[str, ...]], ...] = field(init=False, repr=False, compare=False)
    #: The database aliases where a store checked this index's probe (``MemoryStore``).
    checked: set[str] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        problems = index_problems(self.embed, self.dims, self.fields, self.timeout)
        if problems:
            raise InvalidMemory("index", "; ".join(problems))
        if isinstance(self.embed, str):
            object.__setattr__(self, "embed", import_string(self.embed))
        object.__setattr__(self, "_paths", tuple((f, parse_path(f)) for f in self.fields))

    @classmethod
    def from_settings(cls, config: Mapping[str, Any] | None) -> Index | None:
        """``AGENTMEMORY["SEARCH"]`` as :func:`~agentmemory.conf.get_config` merged it over
        :data:`~agentmemory.conf.SEARCH_DEFAULTS`, as an Index (None: no index)."""
        if not config:
            return None
        return cls(
            embed=config["EMBED"],
            dims=config["DIMS"],
            fields=tuple(config["FIELDS"] or ("$",)),
            timeout=config["TIMEOUT"],
            model=config["MODEL"],
        )

    # ---------------------------------------------------------------- the model's fingerprint

    @functools.cached_property
    def model_name(self) -> str:
        """``model``, or the embedder's own name."""
        return self.model or embedder_name(self.embed)

    @functools.cached_property
    def tag(self) -> int:
        """The fingerprint stored with every vector this index makes (32 bits of the model's
        name and ``dims``): a search scores only vectors of its own tag."""
        return zlib.crc32(f"{self.model_name}|{self.dims}".encode())

    @functools.cached_property
    def probe(self) -> Any:
        """The embedder's unit vector of :data:`PROBE_TEXT` (one call, once per Index): the
        store keeps the first one it sees per tag and checks every later process against it,
        so that an embedder that changed under the same name is told apart."""
        return self._call(self._documents, [PROBE_TEXT])[0]

    # ---------------------------------------------------------------- texts

    def texts(self, value: Any, fields: Sequence[str] | None = None) -> list[str]:
        """The texts of ``value`` this index embeds (``fields`` overrides the index's own)."""
        paths = self._paths if fields is None else [(f, parse_path(f)) for f in fields]
        found: list[str] = []
        for name, tokens in paths:
            found += _texts_at(value, tokens) if name != "$" else [_as_text(value)]
        return found

    # ---------------------------------------------------------------- embedding

    def vectors(self, values: Sequence[Any], fields: Sequence[str] | None = None) -> list[Any]:
        """The stored form of each value's vectors -- one embedder call for all of them; None
        for a value with no text to index."""
        texts_of = [self.texts(value, fields) for value in values]
        for texts in texts_of:
            if len(texts) > INDEX_TEXTS_MAX:
                raise InvalidMemory(
                    "index",
                    f"the value has {len(texts)} texts to embed at "
                    f"{list(fields or self.fields)}, over the limit of {INDEX_TEXTS_MAX} per "
                    "value (each is a vector stored with every version); index fewer paths",
                )
        flat = [text for texts in texts_of for text in texts]
        if not flat:
            return [None] * len(values)
        matrix = self._call(self._documents, flat)
        out, at = [], 0
        for texts in texts_of:
            rows = matrix[at : at + len(texts)]
            out.append(pack(rows, self.tag, fields) if texts else None)
            at += len(texts)
        return out

    def query_vector(self, query: str) -> Any:
        """The query's unit vector (float32)."""
        return self._call(self._query, [query])[0]

    def _documents(self, texts: list[str]) -> Any:
        embed = self.embed
        if hasattr(embed, "embed_documents"):
            return embed.embed_documents(texts)
        return embed(texts)

    def _query(self, texts: list[str]) -> Any:
        embed = self.embed
        if hasattr(embed, "embed_query"):
            return [embed.embed_query(texts[0])]
        return embed(texts)

    def _call(self, fn: Callable[[list[str]], Any], texts: list[str]) -> Any:
        """Run the embedder (on a worker thread when there is a timeout), then check and
        normalize what it returned: a (len(texts), dims) float32 matrix of unit rows."""
        import numpy as np

        try:
            if self.timeout is None:
                raw = fn(texts)
            else:
                raw = _pool().submit(fn, texts).result(timeout=self.timeout)
        except concurrent.futures.TimeoutError as error:
            raise EmbeddingFailed(
                f"the embedder did not answer within {self.timeout} s (AGENTMEMORY['SEARCH']"
                f"['TIMEOUT']) for {len(texts)} text(s); nothing was written",
                cause=error,
            ) from error
        except Exception as error:
            raise EmbeddingFailed(
                f"the embedder raised {type(error).__name__}: {error} (for {len(texts)} "
                "text(s)); nothing was written",
                cause=error,
            ) from error
        try:
            matrix = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise EmbeddingFailed(
                f"the embedder returned {type(raw).__name__}, not a list of vectors of numbers",
                cause=error,
            ) from error
        if matrix.ndim != 2 or matrix.shape[0] != len(texts):
            raise EmbeddingFailed(
                f"the embedder returned {matrix.shape[0] if matrix.ndim else 0} vector(s) of "
                f"shape {matrix.shape[1:]} for {len(texts)} text(s); expected {len(texts)} "
                f"vectors of {self.dims} numbers"
            )
        if matrix.shape[1] != self.dims:
            raise EmbeddingFailed(
                f"the embedder returned vectors of {matrix.shape[1]} dimensions; the index has "
                f"dims={self.dims}"
            )
        if not np.isfinite(matrix).all():
            raise EmbeddingFailed("the embedder returned a vector with NaN or infinity")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        norms[norms == 0] = 1.0  # a zero vector stays zero: it scores 0 against anything
        return (matrix / norms).astype(np.float32)

    # ---------------------------------------------------------------- scoring

    def stacked(self, vectors: Sequence[Any]) -> Any:
        """The vectors as one (n, dims) matrix when every memory has exactly one vector of
        these dims (the common case: one indexed text); otherwise None."""
        import numpy as np

        shape = (1, self.dims)
        if vectors and all(v is not None and v.shape == shape for v in vectors):
            return np.concatenate(vectors)
        return None

    def scores(self, query: Any, vectors: Sequence[Any]) -> Any:
        """Each memory's score: the best cosine similarity of its vectors (a matrix from
        :func:`unpack`, or None) to ``query``. A memory without vectors, or with vectors of
        other dimensions (written under another configuration), scores NaN: it is not returned."""
        import numpy as np

        matrix = self.stacked(vectors)
        if matrix is not None:
            return (matrix @ query).astype(np.float64)
        result = np.full(len(vectors), np.nan)
        for at, rows in enumerate(vectors):
            if rows is not None and rows.shape[1] == self.dims:
                result[at] = float((rows @ query).max())
        return result


#: Before the vectors, as written before 0.6: their dimensions and how many there are (uint16
#: each). Such vectors carry no model fingerprint: they are compared as before, with any model of
#: their dims, until ``manage.py reindex`` rewrites them.
_HEADER = struct.Struct("<HH")
#: Since 0.6: a marker where the old header had the dimensions (no index has 65,535), then the
#: dimensions, the count, the model's fingerprint (:attr:`Index.tag`) and the length of the JSON
#: paths the vectors were made from (empty: the index's own fields), padded to 4 bytes.
_HEADER_V2 = struct.Struct("<HHHIH")
_V2 = 0xFFFF
#: The text whose vector tells one embedding model from another under the same name.
PROBE_TEXT = "agentmemory probe: the quick brown fox jumps over the lazy dog, 0123456789"
#: Below this cosine similarity of the probe's vectors, two embedders are two models.
SAME_MODEL_COSINE = 0.99
#: The session where the store keeps each model's probe vector (one key per tag).
MODELS_SESSION = "agentmemory:index-models"


def vector_key() -> int:
    """A new random name for vectors about to be stored: 63 bits, so no two writes ever share
    one -- not even a rolled-back write and the one that reuses its row id and version number."""
    return secrets.randbits(63)


def named(vector: bytes | None) -> int | None:
    """A new name for vectors about to be written, and, in a process that searches, the vectors
    into its cache under it (a search here will not read them back; a name is never reused, so
    even a write that rolls back leaves nothing wrong there)."""
    if vector is None:  # every write without a semantic index: nothing to name or keep
        return None
    name = vector_key()
    cache = vector_cache()
    if cache.searched:
        cache.put(name, unpack(vector), model_of(vector))
    return name


class VectorCache:
    """Vectors by their name (``Memory.embedding_key``), least recently used out past a budget
    of bytes (and, within another half of it, the last few stacked matrices). A name is written with its vectors and never reused, so an entry can never be
    stale: a search that reads a memory's current name gets that version's vectors, from here or
    from the database. Thread-safe; one per process."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.size = 0  # of the vectors kept by name
        self.stack_size = 0  # of the stacked matrices
        # Whether this process searches: only then do its writes keep their vectors here (a
        # process that only writes -- an importer, a worker -- keeps nothing).
        self.searched = False
        self._entries: collections.OrderedDict[tuple[int | None, int], Any] = (
            collections.OrderedDict()
        )
        self._stacks: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, names: Sequence[int], model: int | None = None) -> list[Any]:
        """Each name's vectors as ``model``'s index sees them (None: another model's), or
        ``MISSING``."""
        self.searched = True
        with self._lock:
            entries = self._entries
            found = [entries.get((model, name), MISSING) for name in names]
            for name, vectors in zip(names, found, strict=True):
                if vectors is not MISSING:
                    entries.move_to_end((model, name))
            return found

    def put(self, name: int, vectors: Any, model: int | None = None) -> None:
        """Keep a name's vectors as ``model``'s index sees them (``unpack(blob, model)``)."""
        if self.budget <= 0:
            return
        cost = 64 + (vectors.nbytes if vectors is not None else 0)
        key = (model, name)
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = vectors
            self.size += cost
            while self.size > self.budget and self._entries:
                _, old = self._entries.popitem(last=False)
                self.size -= 64 + (old.nbytes if old is not None else 0)

    def stacked(self, scope: str) -> tuple[Any, Any, Any] | None:
        """The matrix a search of ``scope`` (a database and a session filter) stacked lately,
        with the ids and names of its rows: ``(ids, names, matrix)``."""
        with self._lock:
            return self._stacks.get(scope)

    def stack(self, scope: str, ids: Any, names: Any, matrix: Any) -> None:
        """Keep ``matrix`` for ``scope``: at most STACKS of them, in at most half the budget (a
        matrix bigger than that is not kept)."""
        if matrix.nbytes > self.budget // 2:
            return
        with self._lock:
            old = self._stacks.pop(scope, None)
            if old is not None:
                self.stack_size -= old[2].nbytes
            self._stacks[scope] = (ids, names, matrix)
            self.stack_size += matrix.nbytes
            while len(self._stacks) > STACKS or self.stack_size > self.budget // 2:
                _, dropped = self._stacks.popitem(last=False)
                self.stack_size -= dropped[2].nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._stacks.clear()
            self.size = self.stack_size = 0


MISSING: Any = object()
#: Stacked matrices kept (session filters searched again and again): the newest few.
STACKS = 4


def pack(rows: Any, model: int = 0, fields: Sequence[str] | None = None) -> bytes:
    """Unit vectors (a float32 matrix) -> the stored bytes: the header (with the model's
    fingerprint and, when not the index's own, the fields they were made from), then the rows."""
    import numpy as np

    count, dims = rows.shape
    paths = b"" if fields is None else json.dumps(list(fields)).encode()
    paths += b" " * (-len(paths) % 4)  # the floats stay 4-byte aligned
    header = _HEADER_V2.pack(_V2, dims, count, model, len(paths))
    return header + paths + np.ascontiguousarray(rows, dtype="<f4").tobytes()


def _layout(blob: bytes) -> tuple[int, int, int | None, int, int] | None:
    """(dims, count, model or None, offset of the fields, offset of the floats), or None."""
    if len(blob) >= _HEADER_V2.size and _HEADER.unpack_from(blob)[0] == _V2:
        _, dims, count, model, paths = _HEADER_V2.unpack_from(blob)
        start = _HEADER_V2.size + paths
        return dims, count, model, _HEADER_V2.size, start
    if len(blob) < _HEADER.size:
        return None
    dims, count = _HEADER.unpack_from(blob)
    return dims, count, None, _HEADER.size, _HEADER.size


def unpack(blob: Any, model: int | None = None) -> Any:
    """The stored bytes -> a (count, dims) float32 matrix; None if they are not vectors -- or,
    with ``model``, if another model made them (vectors without a fingerprint, written before
    0.6, are any model's)."""
    import numpy as np

    if blob is None:
        return None
    blob = bytes(blob)
    layout = _layout(blob)
    if layout is None:
        return None
    dims, count, made_by, _, start = layout
    if not dims or not count or len(blob) != start + 4 * dims * count:
        return None
    if model is not None and made_by is not None and made_by != model:
        return None
    return np.frombuffer(blob, dtype="<f4", offset=start).reshape(count, dims)


def model_of(blob: Any) -> int | None:
    """The fingerprint of the model that made the stored vectors (None: written before 0.6)."""
    layout = None if blob is None else _layout(bytes(blob))
    return None if layout is None else layout[2]


def fields_of(blob: Any) -> list[str] | None:
    """The JSON paths the stored vectors were made from; None: the index's own."""
    blob = bytes(blob)
    layout = _layout(blob)
    if layout is None or layout[4] == layout[3]:
        return None
    return json.loads(blob[layout[3] : layout[4]].decode())


def embedder_name(embed: Any) -> str:
    """An embedder's name for its fingerprint: its function's or class's dotted name, and the
    model it names if it has a ``model``/``model_name`` attribute (LangChain's embeddings do)."""
    target = getattr(embed, "func", embed)  # LangGraph wraps a function in EmbeddingsLambda
    kind = target if callable(target) and hasattr(target, "__qualname__") else type(target)
    name = (
        f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', type(kind).__name__)}"
    )
    model = getattr(target, "model", None) or getattr(target, "model_name", None)
    return f"{name}:{model}" if isinstance(model, str) else name


@receiver(setting_changed)
def _reset_vector_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "AGENTMEMORY":
        vector_cache.cache_clear()
        settings_index.cache_clear()


@functools.cache
def settings_index() -> Index | None:
    """``AGENTMEMORY["SEARCH"]`` as an :class:`Index`, one per process (and settings): every
    ``MemoryStore()`` shares it, so its probe is embedded and checked once."""
    from .conf import get_config

    return Index.from_settings(get_config()["SEARCH"])


@functools.cache
def vector_cache() -> VectorCache:
    """The process's :class:`VectorCache`, of ``AGENTMEMORY["SEARCH"]["CACHE_MB"]`` (default
    256; 0: no cache, every search reads the vectors from the database)."""
    from .conf import SEARCH_DEFAULTS, get_config

    megabytes = (get_config()["SEARCH"] or SEARCH_DEFAULTS)["CACHE_MB"]
    return VectorCache(int(megabytes * 1024 * 1024))


def index_problems(embed: Any, dims: Any, fields: Any, timeout: Any) -> list[str]:
    """What is wrong with an index configuration, in words (system check E019 and
    :class:`Index` share them)."""
    problems = []
    if isinstance(embed, str):
        try:
            import_string(embed)
        except ImportError as error:
            problems.append(f"EMBED {embed!r} cannot be imported ({error})")
    elif not (callable(embed) or hasattr(embed, "embed_documents")):
        problems.append(
            f"EMBED must be a callable list[str] -> list[list[float]], a LangChain Embeddings "
            f"or a dotted path to one, got {type(embed).__name__}"
        )
    if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= DIMS_MAX:
        problems.append(f"DIMS must be an int from 1 to {DIMS_MAX}, got {dims!r}")
    if isinstance(fields, str) or not isinstance(fields, Sequence) or not fields:
        problems.append(
            f'FIELDS must be a non-empty list of JSON paths such as ["$"], got {fields!r}'
        )
    else:
        for path in fields:
            try:
                parse_path(path)
            except ValueError as error:
                problems.append(f"FIELDS: {error}")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        problems.append(f"TIMEOUT must be a number of seconds > 0 or None, got {timeout!r}")
    return problems


def parse_path(path: Any) -> tuple[str, ...]:
    """``"items[*].text"`` -> ``("items", "[*]", "text")``; ``"$"`` -> ``()``. JSONPath's own
    spelling is accepted too: ``"$.items[*].text"`` is ``"items[*].text"``."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"a path must be a non-empty str, got {path!r}")
    if path == "$":
        return ()
    text = path
    if path.startswith(("$.", "$[")):
        text = path[2:] if path[1] == "." else path[1:]
    tokens = []
    at = 0
    for match in _PATH_TOKEN.finditer(text):
        between = text[at : match.start()]
        if between not in ("", ".") or (between == "." and not tokens):
            break
        tokens.append(f"[{match.group(1)}]" if match.group(1) else match.group(2))
        at = match.end()
    else:
        if at == len(text) and tokens:
            return tuple(tokens)
    raise ValueError(f"{path!r} is not a JSON path ($, a.b, a[0], a[*].b, $.a.b)")


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _texts_at(value: Any, tokens: tuple[str, ...]) -> list[str]:
    if not tokens:
        if value is None:
            return []
        if isinstance(value, bool | int | float):
            return [json.dumps(value)]
        return [_as_text(value)]
    token, rest = tokens[0], tokens[1:]
    if token.startswith("["):
        if not isinstance(value, list):
            return []
        if token == "[*]":
            return [text for item in value for text in _texts_at(item, rest)]
        index = int(token[1:-1])
        return _texts_at(value[index], rest) if -len(value) <= index < len(value) else []
    if not isinstance(value, dict) or token not in value:
        return []
    return _texts_at(value[token], rest)


# ------------------------------------------------------------------ filters


def check_filter(conditions: Any) -> dict[str, Any]:
    """A filter: ``{"field": value}`` (equality) or ``{"field": {"$gt": 3, ...}}``."""
    if conditions is None:
        return {}
    if not isinstance(conditions, Mapping):
        raise InvalidMemory(
            "filter", f"must be a mapping of field to condition, got {conditions!r}"
        )
    for name, wanted in conditions.items():
        if not isinstance(name, str) or not FILTER_FIELD.match(name):
            raise InvalidMemory(
                "filter",
                f"field {name!r}: only letters, digits, underscores, dots and hyphens",
            )
        if isinstance(wanted, Mapping) and any(str(k).startswith("$") for k in wanted):
            unknown = sorted(str(k) for k in wanted if k not in OPERATORS)
            if unknown:
                raise InvalidMemory(
                    "filter",
                    f"unknown operator(s) {unknown} on {name!r}; known: {sorted(OPERATORS)}",
                )
    return dict(conditions)


def matches(value: Any, conditions: Mapping[str, Any]) -> bool:
    """Whether ``value`` meets every condition; numbers compare as numbers, values of types
    that do not compare never match."""
    if not isinstance(value, Mapping):
        return not conditions
    for name, wanted in conditions.items():
        actual: Any = value
        for part in name.split("."):
            actual = actual.get(part) if isinstance(actual, Mapping) else None
        if isinstance(wanted, Mapping) and wanted and all(k in OPERATORS for k in wanted):
            for operator, operand in wanted.items():
                try:
                    if actual is None or not OPERATORS[operator](actual, operand):
                        return False
                except TypeError:  # "3" > 2: not comparable, not a match
                    return False
        elif actual != wanted:
            return False
    return True


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """Where embedder calls with a timeout run (a call that times out keeps its thread until it
    returns; the caller has its answer already)."""
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=16, thread_name_prefix="agentmemory-embed"
    )
