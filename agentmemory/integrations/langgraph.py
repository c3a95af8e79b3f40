"""agentmemory as a LangGraph ``BaseStore``: LangGraph agents keep their code, and every ``put``
becomes a versioned write (history, revert, admin and memcheck see it), with a compare-and-set put
and a read-modify-write helper for parallel nodes that update shared memory.

    from agentmemory.integrations.langgraph import AgentMemoryStore
    graph = builder.compile(store=AgentMemoryStore())

Namespaces map to sessions reversibly: ``("users", "ada")`` is session ``lg:users/ada/`` (each label
percent-encoded, so look-alike labels never meet). Items are memories whose values are dicts.

Semantic search as LangGraph's stores do it: ``AgentMemoryStore(index={"dims": 1536, "embed":
..., "fields": ["text"]})``, ``put(..., index=False | [fields])``, ``search(prefix, query=...)``
ranked by cosine similarity, each item's ``score`` computed from the vectors of the very version it
returns (:meth:`agentmemory.MemoryStore.search`). Without an index, ``search(query=...)`` raises
``NotImplementedError`` rather than silently returning unranked items.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote

from django.db import connections
from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    NotProvided,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import ensure_embeddings

from .. import aio, clock, validation
from ..errors import InvalidMemory, VersionConflict
from ..semantic import FILTER_FIELD, Index, matches
from ..validation import SESSION_ID_MAX
from ..vendors import prefix_filter
from .langgraph_saver import AgentMemorySaver
from .threads import aliases_of, call_sync

if TYPE_CHECKING:  # the models need Django's settings: imported once a store is made
    from ..store import MemoryStore

PREFIX = "lg:"
T = TypeVar("T")


def session_of(namespace: tuple[str, ...]) -> str:
    """The session id of a namespace: reversible, and distinct for distinct namespaces. A
    ``str`` is refused (each of its characters would be taken for a label)."""
    if isinstance(namespace, str | bytes) or not isinstance(namespace, tuple | list):
        raise InvalidNamespaceError(
            f"a namespace is a tuple of str labels, got {type(namespace).__name__} "
            f"{namespace!r:.60}"
        )
    try:
        session = PREFIX + "".join(quote(label, safe="") + "/" for label in namespace)
    except (UnicodeEncodeError, TypeError) as error:  # a lone surrogate, a label not a str
        raise InvalidNamespaceError(
            f"namespace {namespace!r} has a label that is not text a database can store: {error}"
        ) from None
    if len(session) > SESSION_ID_MAX:
        raise InvalidNamespaceError(
            f"namespace {namespace!r} is {len(session)} characters as an agentmemory session "
            f"id ({session!r}); the limit is {SESSION_ID_MAX}"
        )
    return session


def namespace_of(session_id: str) -> tuple[str, ...]:
    return tuple(unquote(label) for label in session_id[len(PREFIX) :].split("/")[:-1])


class AgentMemoryStore(BaseStore):
    """LangGraph's store interface over a :class:`~agentmemory.MemoryStore`.

    ``ttl`` follows LangGraph's ``TTLConfig``: ``default_ttl`` in minutes for puts that give none,
    ``refresh_on_read`` to push an item's expiry back when it is read (a new version, written with
    compare-and-set so that it never overwrites a newer write).

    ``index`` follows LangGraph's ``IndexConfig``: ``dims``, ``embed`` (an ``Embeddings``, a
    function of texts, or a ``"provider:model"`` string as LangGraph takes it) and ``fields``
    (default ``["$"]``, the whole value; ``text_fields`` as LangGraph's SQL stores spell it) and
    ``distance_type`` (``cosine``, ``l2`` or ``inner_product``: vectors are kept as unit
    vectors, so the three rank alike and each scores in its own terms). Or give the
    :class:`~agentmemory.MemoryStore` an :class:`~agentmemory.Index` of its own."""

    supports_ttl = True

    def __init__(
        self,
        store: MemoryStore | None = None,
        *,
        ttl: TTLConfig | None = None,
        index: IndexConfig | None = None,
    ) -> None:
        from ..store import MemoryStore

        if index is not None:
            if store is not None:
                raise ValueError(
                    "pass index= to AgentMemoryStore or an Index to MemoryStore(index=...), "
                    "not a store and an index"
                )
            store = MemoryStore(index=index_of(index))
        self.store = store or MemoryStore()
        self.ttl_config = ttl or TTLConfig(refresh_on_read=True)
        self.index_config = index
        #: The embedder, as LangGraph's stores expose it (None without an index).
        self.embeddings = (
            None if self.store.index is None else ensure_embeddings(self.store.index.embed)
        )
        self._distance = (index or {}).get("distance_type", "cosine")  # type: ignore[typeddict-item]

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        ttl: TTLConfig | None = None,
        index: IndexConfig | None = None,
        cache: str | None = None,
    ) -> Iterator[AgentMemoryStore]:
        """A store on the database of a URL (and the Redis tier of ``cache``), as LangGraph's
        stores are made, without a Django project (:func:`agentmemory.setup`):
        ``with AgentMemoryStore.from_conn_string("sqlite:///memory.db") as store``."""
        from ..standalone import setup

        memory = setup(conn_string, cache=cache, index=None if index is None else index_of(index))
        made = cls(memory, ttl=ttl)
        made.index_config = index
        made._distance = (index or {}).get("distance_type", "cosine")  # type: ignore[typeddict-item]
        yield made

    # ---------------------------------------------------------------- BaseStore

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return self._call("batch", self._batch, list(ops))

    def _call(self, method: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` where a synchronous call of ``method`` runs (:func:`call_sync`)."""
        use = (
            "`await store.aget(...)`, `aput`, `asearch`, `adelete`, `alist_namespaces`, `abatch`"
            if method == "batch"
            else f"`await store.a{method}(...)`"
        )
        return call_sync(type(self).__name__, aliases_of(self.store), use, fn, *args)

    def _batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:  # every op's page checked before any op runs: a bad one writes nothing
            if isinstance(op, SearchOp | ListNamespacesOp):
                _check_page(op.limit, op.offset)
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise TypeError(f"unknown LangGraph store operation {op!r}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await aio.run(self.batch, list(ops))

    # ---------------------------------------------------------------- what LangGraph's stores lack

    def put_if_version(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        expected_version: int,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> int:
        """Compare-and-set put: write only if the item is at ``expected_version`` (0: absent);
        returns the new version, or raises :class:`~agentmemory.VersionConflict`."""
        record = self._call(
            "put_if_version",
            lambda: self.store.remember(
                session_of(namespace),
                key,
                dict(value),
                ttl=self._ttl_seconds(ttl),
                expected_version=expected_version,
            ),
        )
        return record.version

    def modify(
        self,
        namespace: tuple[str, ...],
        key: str,
        fn: Callable[[dict[str, Any] | None], Mapping[str, Any]],
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> Item:
        """Read-modify-write under the row lock: ``fn(current value or None)`` -> new value.
        Parallel nodes calling this never lose each other's updates."""

        def compute(current: Any) -> dict[str, Any]:
            new = fn(current)
            if not isinstance(new, Mapping):
                raise InvalidMemory(
                    "fn",
                    f"must return the item's new value, a dict; it returned {_kind(new)} "
                    "(nothing was written)",
                )
            return dict(new)

        ttl_ = self._ttl_seconds(ttl)
        record = self._call(
            "modify", lambda: self.store.update(session_of(namespace), key, compute, ttl=ttl_)
        )
        return self._item(namespace, record)

    def version_of(self, namespace: tuple[str, ...], key: str) -> int:
        """The item's current version (0 if absent), for :meth:`put_if_version`."""
        record = self._call("version_of", self.store.recall, session_of(namespace), key)
        return record.version if record else 0

    def history(self, namespace: tuple[str, ...], key: str, **page: Any) -> list[Any]:
        """The item's versions: all, oldest first; or a page, newest first (``limit``,
        ``before_version``), as :meth:`agentmemory.MemoryStore.history`."""
        return self._call("history", lambda: self.store.history(session_of(namespace), key, **page))

    async def aput_if_version(self, *args: Any, **kwargs: Any) -> int:
        return await aio.run(self.put_if_version, *args, **kwargs)

    async def amodify(self, *args: Any, **kwargs: Any) -> Item:
        return await aio.run(self.modify, *args, **kwargs)

    async def aversion_of(self, namespace: tuple[str, ...], key: str) -> int:
        return await aio.run(self.version_of, namespace, key)

    async def ahistory(self, namespace: tuple[str, ...], key: str, **page: Any) -> list[Any]:
        return await aio.run(self.history, namespace, key, **page)

    # ---------------------------------------------------------------- operations

    def _get(self, op: GetOp) -> Item | None:
        session = session_of(op.namespace)
        record = self.store.recall(session, op.key)
        if record is None:
            return None
        if op.refresh_ttl and self.ttl_config.get("refresh_on_read"):
            record = self._refresh(record)
        return self._item(op.namespace, record)

    def _put(self, op: PutOp) -> None:
        session = session_of(op.namespace)
        if op.value is None:
            self.store.forget(session, op.key)
            return
        if not isinstance(op.value, Mapping):
            raise InvalidMemory(
                "value", f"LangGraph items are dicts, got {type(op.value).__name__}"
            )
        self.store.remember(
            session, op.key, dict(op.value), ttl=self._ttl_seconds(op.ttl), index=op.index
        )

    def _ttl_seconds(self, minutes: Any) -> float | None:
        """LangGraph's TTL in minutes -> seconds. As in LangGraph: omitted means the configured
        ``default_ttl``, ``None`` means never expires (``BaseStore.put`` has already applied the
        default to an omitted TTL before the ``PutOp`` reaches :meth:`batch`)."""
        if minutes is NOT_PROVIDED:
            minutes = self.ttl_config.get("default_ttl")
        if minutes is None:
            return None
        if isinstance(minutes, bool) or not isinstance(minutes, int | float):
            raise InvalidMemory("ttl", f"must be minutes (int or float) or None, got {minutes!r}")
        return float(minutes) * 60

    def _refresh(self, record: Any) -> Any:
        """Push the expiry back by the item's own TTL: a new version, only if none came since."""
        if record.expires_at is None:
            return record
        ttl = record.expires_at - record.updated_at
        try:
            return self.store.remember(
                record.session_id,
                record.key,
                record.value,
                ttl=ttl,
                expected_version=record.version,
            )
        except VersionConflict:
            return record  # a newer write set its own expiry

    def _search(self, op: SearchOp) -> list[SearchItem]:
        from ..models import is_live

        for field in op.filter or {}:
            # As LangGraph's SQL stores: a filter names JSON fields, nothing else.
            if not isinstance(field, str) or not FILTER_FIELD.match(field):
                raise ValueError(
                    f"Invalid filter key: {field!r}. Filter keys must contain only alphanumeric "
                    "characters, underscores, dots, and hyphens."
                )
        under = session_of(op.namespace_prefix) if op.namespace_prefix else PREFIX
        if op.limit == 0:
            return []
        if op.query:
            return self._semantic_search(op, under)
        now = clock.now()
        found = []
        # Each database's rows in (namespace, key) order, merged (a ShardedStore's shards).
        rows = heapq.merge(
            *(
                self._rows_under(under, alias)
                .order_by("session_id", "key")
                .iterator(chunk_size=500)
                for alias in aliases_of(self.store)
            ),
            key=lambda row: (row.session_id, row.key),
        )
        last = None
        for row in rows:
            # A namespace being moved is on two shards for a moment: each item once.
            if (row.session_id, row.key) == last:
                continue
            last = (row.session_id, row.key)
            if not is_live(row.state, row.expires_at, now):
                continue
            if op.filter and not matches(row.value, op.filter):
                continue
            found.append(row)
            if len(found) >= op.offset + op.limit:
                break
        items = []
        refresh = op.refresh_ttl and self.ttl_config.get("refresh_on_read")
        for row in found[op.offset : op.offset + op.limit]:
            value, created, updated = row.value, row.created_at, row.updated_at
            if refresh and row.expires_at is not None:
                record = self.store.recall(row.session_id, row.key)
                if record is None:
                    continue
                record = self._refresh(record)
                value, created, updated = record.value, record.created_at, record.updated_at
            items.append(SearchItem(namespace_of(row.session_id), row.key, value, created, updated))
        return items

    def _semantic_search(self, op: SearchOp, under: str) -> list[SearchItem]:
        """Items ranked by cosine similarity to ``op.query`` (only items that were indexed, as
        LangGraph's PostgresStore)."""
        if self.store.index is None:
            raise NotImplementedError(
                "this AgentMemoryStore has no index: search(query=...) needs "
                'AgentMemoryStore(index={"dims": ..., "embed": ..., "fields": [...]}). Without '
                "a query, search by namespace_prefix and filter."
            )
        found = self.store.search_sessions(
            under, op.query or "", filter=op.filter, limit=op.limit, offset=op.offset
        )
        refresh = op.refresh_ttl and self.ttl_config.get("refresh_on_read")
        items = []
        for result in found:
            record: Any = result
            if refresh and result.expires_at is not None:
                record = self._refresh(result)
            items.append(
                SearchItem(
                    namespace_of(result.session_id),
                    result.key,
                    record.value,
                    record.created_at,
                    record.updated_at,
                    score=_scored(result.score, self._distance),
                )
            )
        return items

    def _rows_under(self, prefix: str, using: str) -> Any:
        """Live rows on database ``using`` of every session starting with ``prefix``: a range over
        the unique index where the database orders session ids by code point (SQLite, MySQL
        family's binary collation), ``LIKE 'prefix%'`` on PostgreSQL."""
        from ..models import Memory

        rows = Memory.objects.using(using).live()
        return rows.filter(prefix_filter(connections[using], "session_id", prefix))

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        if op.max_depth is not None:
            validation.check_version("max_depth", op.max_depth, minimum=1)
        validation.check_version("limit", op.limit, minimum=0)
        validation.check_version("offset", op.offset, minimum=0)
        for condition in op.match_conditions or ():
            if isinstance(condition.path, str | bytes) or not isinstance(
                condition.path, tuple | list
            ):
                raise InvalidNamespaceError(
                    f"a namespace {condition.match_type} is a tuple of str labels, got "
                    f"{type(condition.path).__name__} {condition.path!r:.60}"
                )
        # Each database's sessions in order, merged (a ShardedStore's shards hold apart ones).
        sessions = heapq.merge(
            *(
                self._rows_under(PREFIX, alias)
                .values_list("session_id", flat=True)
                .distinct()
                .order_by("session_id")
                .iterator(chunk_size=1000)
                for alias in aliases_of(self.store)
            )
        )
        namespaces: list[tuple[str, ...]] = []
        seen = set()
        for session in sessions:
            namespace = namespace_of(session)
            if op.max_depth is not None:
                namespace = namespace[: op.max_depth]
            if namespace in seen or not all(
                _matches_path(namespace, c.path, c.match_type) for c in op.match_conditions or ()
            ):
                continue
            seen.add(namespace)
            namespaces.append(namespace)
        return namespaces[op.offset : op.offset + op.limit]

    def _item(self, namespace: tuple[str, ...], record: Any) -> Item:
        return Item(
            value=record.value,
            key=record.key,
            namespace=namespace,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )


#: The distances LangGraph's PostgresStore offers. Vectors are stored as unit vectors, so all
#: three rank alike; each reports its own score (as PostgresStore does): cosine similarity, the
#: negated Euclidean distance, the inner product.
DISTANCES = ("cosine", "l2", "inner_product")


def index_of(config: IndexConfig) -> Index:
    """LangGraph's ``IndexConfig`` as an agentmemory :class:`~agentmemory.Index`: ``dims``,
    ``embed``, ``fields`` (or ``text_fields``, the SQL stores' spelling; a str is one path),
    ``distance_type`` one of :data:`DISTANCES`."""
    distance = config.get("distance_type", "cosine")  # type: ignore[typeddict-item]
    if distance not in DISTANCES:
        raise ValueError(
            f"index distance_type {distance!r}: agentmemory offers {', '.join(DISTANCES)}"
        )
    try:
        dims, embed = config["dims"], config["embed"]
    except KeyError as missing:
        raise ValueError(f"index config needs {missing.args[0]!r}") from None
    fields = config.get("fields") or config.get("text_fields") or ("$",)  # type: ignore[typeddict-item]
    if isinstance(fields, str):
        fields = (fields,)
    return Index(embed=ensure_embeddings(embed), dims=dims, fields=tuple(fields))


def _scored(cosine: float, distance: str) -> float:
    """A cosine similarity of unit vectors in the terms of ``distance``."""
    if distance == "l2":
        return -math.sqrt(max(0.0, 2.0 - 2.0 * cosine))
    return cosine  # cosine, and the inner product of unit vectors


def _matches_path(namespace: tuple[str, ...], path: tuple[str, ...], kind: str) -> bool:
    if len(path) > len(namespace):
        return False
    part = namespace[: len(path)] if kind == "prefix" else namespace[len(namespace) - len(path) :]
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


__all__ = [
    "DISTANCES",
    "AgentMemorySaver",
    "AgentMemoryStore",
    "index_of",
    "matches",
    "namespace_of",
    "session_of",
]


def _check_page(limit: Any, offset: Any) -> None:
    """A search's or namespace listing's page: ``limit`` >= 0 (0: an empty page, as LangGraph's
    own stores slice), ``offset`` >= 0; anything else is a ValueError naming it."""
    for name, number in (("limit", limit), ("offset", offset)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise InvalidMemory(name, f"must be an int >= 0, got {number!r}")


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"
