"""``MemoryStore``: the public API. Input is checked here (:mod:`~agentmemory.validation`), before
any query; every change goes to the one write path (:mod:`~agentmemory.writes`); reads go to the
database, through the cache tier's read-through protocol when there is one
(:meth:`~agentmemory.cache.MemoryCache.read_through`); transient errors are retried by
:mod:`~agentmemory.retries`."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.models import Q
from django.db.models.functions import Lower

from . import aio, clock, validation
from .cache import MemoryCache
from .conf import get_config
from .defects import Defect, Defects
from .errors import EmbeddingFailed, InvalidMemory, VersionConflict, VersionPruned
from .models import Memory, MemoryState, MemoryVersion, Op, is_live
from .records import MemoryRecord, MemoryVersionRecord, ScoredMemory
from .retries import Retrier
from .semantic import (
    MISSING,
    MODELS_SESSION,
    SAME_MODEL_COSINE,
    SEARCH_LIMIT_MAX,
    Index,
    check_filter,
    fields_of,
    matches,
    model_of,
    parse_path,
    settings_index,
    unpack,
    vector_cache,
)
from .sql import decode_json, run, statements_for, to_datetime
from .vendors import prefix_filter
from .writes import Change, WritePath, default_ttl

T = TypeVar("T")
#: Fields to index: None (the index's own), False (not indexed) or a list of JSON paths.
IndexFields = bool | list[str] | tuple[str, ...] | None
#: The largest page ``history(limit=...)`` returns.
HISTORY_PAGE_MAX = 10_000
_CACHE_FROM_SETTINGS: Any = object()
_INDEX_FROM_SETTINGS: Any = object()


class MemoryStore:
    """Versioned key-value memory for one database alias.

    Every write takes the row lock of its ``(session_id, key)`` inside ``transaction.atomic``
    (``select_for_update``; SQLite serializes with ``BEGIN IMMEDIATE``), appends exactly one history
    version and retries deadlocks, serialization failures and dropped connections with jittered
    backoff. Callers see the write's :class:`MemoryRecord`, a :class:`VersionConflict`, an
    :class:`InvalidMemory` raised before any query, or :class:`MemoryUnavailable` -- never a
    half-write.
    """

    def __init__(
        self,
        using: str | None = None,
        cache: str | None = _CACHE_FROM_SETTINGS,
        *,
        namespace: str | None = None,
        row_lock: bool = True,
        defects: Iterable[Defect | str] = (),
        index: Index | None = _INDEX_FROM_SETTINGS,
    ) -> None:
        """``using``: the database alias (default ``AGENTMEMORY["DATABASE"]``); ``cache``: the
        cache alias of the Redis tier, or None (default ``AGENTMEMORY["CACHE"]``);
        ``namespace``: a name that separates this store's Redis entries from other stores' on the
        same cache (the test plugin gives each test one). ``row_lock=False`` is the unsafe seam
        (see :class:`~agentmemory.writes.WritePath`) and ``defects`` the planted bugs of
        :mod:`agentmemory.defects`: for memcheck and tests, never for data. ``index``: the
        semantic index of :meth:`search` (default ``AGENTMEMORY["SEARCH"]``; None: no search)."""
        config = get_config()
        #: How values are embedded for :meth:`search`, or None.
        self.index: Index | None = settings_index() if index is _INDEX_FROM_SETTINGS else index
        if self.index is not None and not isinstance(self.index, Index):
            raise ImproperlyConfigured(
                f"MemoryStore(index=...) takes an agentmemory.Index or None, got {index!r}"
            )
        self.defects = Defects(defects)
        row_lock = row_lock and Defect.NO_ROW_LOCK not in self.defects
        self.using: str = using or config["DATABASE"]
        self.cache_alias: str | None = config["CACHE"] if cache is _CACHE_FROM_SETTINGS else cache
        #: The Redis tier, or None: the store is correct without it.
        self.cache: MemoryCache | None = (
            MemoryCache(self.cache_alias, self.using, namespace=namespace, defects=self.defects)
            if self.cache_alias
            else None
        )
        self.row_lock = row_lock
        self._retrier = Retrier(self.using, retry=Defect.NOT_RETRIED not in self.defects)
        self._writes = WritePath(
            self.using, self.cache, self._retrier, row_lock=row_lock, defects=self.defects
        )
        self._local = threading.local()

    @property
    def retries(self) -> Counter[str]:
        """Transient errors absorbed by retries, by kind; read by memcheck and the benchmarks."""
        return self._retrier.counts

    @property
    def last_read_source(self) -> str | None:
        """Where this thread's last ``recall``/``recall_many`` was answered from: ``"cache"``
        (every key from Redis) or ``"database"``; None before the first read. For diagnostics
        and memcheck's histories."""
        return getattr(self._local, "source", None)

    def __repr__(self) -> str:
        unsafe = "" if self.row_lock else " row_lock=False"
        if self.defects:
            unsafe += f" defects={self.defects!r}"
        return f"<MemoryStore using={self.using!r} cache={self.cache_alias!r}{unsafe}>"

    # ------------------------------------------------------------------ writes

    def remember(
        self,
        session_id: str,
        key: str,
        value: Any,
        *,
        ttl: float | timedelta | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        index: IndexFields = None,
    ) -> MemoryRecord:
        """Write ``value`` as the next version of ``(session_id, key)``.

        ``expected_version=N`` writes only if the current version is N (0: the memory must not
        exist); otherwise :class:`VersionConflict` and nothing is written. A repeated call with
        the same ``idempotency_key`` returns the version the first call wrote and writes nothing.
        With a semantic index, the value is embedded before the write (``index``: None for the
        index's fields, a list of JSON paths for these, False for none) and an embedder failure
        raises :class:`EmbeddingFailed` with nothing written.
        """
        session_id, key = self._check_ids(session_id, key)
        value = self._check_value(value)
        ttl_, expected = self._check_ttl(ttl), self._check_expected(expected_version)
        request = self._request(idempotency_key)
        fields = self._check_index(index)
        change = Change(
            Op.WRITE,
            compute=lambda _current: value,
            ttl=ttl_,
            expected_version=expected,
            blind=True,
            **request,
            **self._indexing(fields, [value])[0],
        )
        return self._writes.write(session_id, {key: change})[key]

    def update(
        self,
        session_id: str,
        key: str,
        fn: Callable[[Any], Any],
        *,
        default: Any = None,
        ttl: float | timedelta | None = None,
        index: IndexFields = None,
    ) -> MemoryRecord:
        """Write ``fn(current value)`` (``fn(default)`` when the memory does not exist) under the
        row lock, so concurrent updates never lose each other. ``fn`` may run more than once if
        the database asks for a retry: keep it free of side effects. With a semantic index, the
        new value is embedded under the row lock (it is known only there): writers of this key
        wait for the embedder, writers of other keys do not."""
        session_id, key = self._check_ids(session_id, key)
        if not callable(fn):
            raise InvalidMemory("fn", f"must be callable, got {type(fn).__name__}")
        change = Change(
            Op.WRITE,
            compute=lambda current: self._check_value(fn(current)),
            default=self._check_value(default),
            ttl=self._check_ttl(ttl),
            embed=self._embedder(self._check_index(index)),
        )
        return self._writes.write(session_id, {key: change})[key]

    def remember_many(
        self,
        session_id: str,
        items: Mapping[str, Any],
        *,
        ttl: float | timedelta | None = None,
        index: IndexFields = None,
    ) -> dict[str, MemoryRecord]:
        """Write several keys of one session in one transaction: all of them or none. With a
        semantic index, every value is embedded first, in one embedder call."""
        session_id = validation.check_session_id(session_id)
        if not isinstance(items, Mapping):
            raise InvalidMemory(
                "items", f"must be a mapping of key to value, got {type(items).__name__}"
            )
        ttl = self._check_ttl(ttl)
        fields = self._check_index(index)
        checked = {}
        for key, value in items.items():
            key = validation.check_key(key)
            try:
                checked[key] = self._check_value(value)
            except InvalidMemory as error:
                raise InvalidMemory(error.field, f"of key {key!r}: {error.message}") from None
        vectors = self._indexing(fields, list(checked.values()))
        changes = {
            key: Change(
                Op.WRITE, compute=lambda _current, v=value: v, ttl=ttl, blind=True, **indexing
            )
            for (key, value), indexing in zip(checked.items(), vectors, strict=True)
        }
        return self._writes.write(session_id, changes) if changes else {}

    def revert(
        self, session_id: str, key: str, version: int, *, expected_version: int | None = None
    ) -> MemoryRecord:
        """Write a NEW version holding the value that ``version`` held (history stays linear);
        with ``expected_version``, only if the memory is still at that version."""
        session_id, key = self._check_ids(session_id, key)
        version = validation.check_version("version", version, minimum=1)
        change = Change(
            Op.REVERT,
            ttl=default_ttl(),
            create=False,
            expected_version=self._check_expected(expected_version),
            embed=self._embedder(None),
        )
        change.compute = lambda _current: self._value_of_version(session_id, key, version)
        return self._writes.write(session_id, {key: change})[key]

    def forget(self, session_id: str, key: str, *, expected_version: int | None = None) -> bool:
        """Record a ``forget`` version; True if a live memory was forgotten."""
        session_id, key = self._check_ids(session_id, key)
        change = Change(
            Op.FORGET, expected_version=self._check_expected(expected_version), create=False
        )
        return self._writes.write(session_id, {key: change})[key] is not None

    def expire(self, session_id: str, key: str, *, expected_version: int | None = None) -> bool:
        """Expire the memory now, whatever its TTL: an ``expire`` version, as if its TTL had just
        passed. True if a live memory was expired."""
        session_id, key = self._check_ids(session_id, key)
        change = Change(
            Op.EXPIRE,
            expected_version=self._check_expected(expected_version),
            create=False,
            due_only=False,
        )
        return self._writes.write(session_id, {key: change})[key] is not None

    def forget_session(self, session_id: str) -> int:
        """Forget every live memory of the session (each gets a ``forget`` version); the count."""
        session_id = validation.check_session_id(session_id)
        keys = (
            self._memories()
            .filter(session_id=session_id, state=MemoryState.LIVE)
            .values_list("key", flat=True)
        )
        return sum(self._expire_or_forget(session_id, key, Op.FORGET) for key in sorted(keys))

    def purge_expired(self, *, batch: int = 1000) -> int:
        """Record an ``expire`` version for each memory past its TTL and retire its live row."""
        batch = validation.check_version("batch", batch, minimum=1, maximum=validation.BATCH_MAX)
        purged = 0
        while True:
            due = list(
                self._memories()
                .filter(state=MemoryState.LIVE, expires_at__lte=clock.now())
                .order_by("expires_at")
                .values_list("session_id", "key")[:batch]
            )
            for session_id, key in due:
                purged += self._expire_or_forget(session_id, key, Op.EXPIRE)
            if len(due) < batch:
                return purged

    def prune_history(
        self,
        *,
        keep_last: int | None = None,
        keep_days: float | None = None,
        batch: int = 1000,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
        session_id: str | None = None,
    ) -> int:
        """Apply the history retention policy to every memory: keep the newest ``keep_last``
        versions and/or those younger than ``keep_days`` days (a version either rule keeps is
        kept; the newest always is); both None: ``AGENTMEMORY["HISTORY_RETENTION"]``, and if that
        keeps everything, nothing happens. Version numbers never restart: the live row records
        the lowest version kept (``history_from``), and ``recall(version=)``/``revert`` of a
        pruned version raise :class:`VersionPruned`. One memory at a time under its row lock, so
        it runs beside live writers; resumable (it only ever removes what the policy drops).
        Returns the number of versions removed (or, with ``dry_run``, that would be).
        ``progress(done, total)`` is called after each batch of memories; ``session_id`` limits
        it to one session's memories."""
        policy = get_config()["HISTORY_RETENTION"]
        if keep_last is None and keep_days is None:
            keep_last, keep_days = policy["KEEP_LAST"], policy["KEEP_DAYS"]
        if keep_last is not None:
            keep_last = validation.check_version("keep_last", keep_last, minimum=1)
        if keep_days is not None:
            keep_days = validation.check_days("keep_days", keep_days)
        batch = validation.check_version("batch", batch, minimum=1, maximum=validation.BATCH_MAX)
        if keep_last is None and keep_days is None:
            return 0
        memories = self._memories()
        if session_id is not None:
            memories = memories.filter(session_id=validation.check_session_id(session_id))
        pruned = 0
        for found in _batches(memories, (), batch, progress):
            for (memory_id,) in found:
                pruned += self._writes.prune(memory_id, keep_last, keep_days, dry_run=dry_run)
        return pruned

    def reindex(
        self,
        *,
        batch: int = 500,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
        session_id: str | None = None,
    ) -> int:
        """Embed again, with this store's index, every live memory whose vectors another model
        made (or that carry no fingerprint, written before 0.6), from the paths each was indexed
        by; in place, one memory at a time, beside live writers (a memory written meanwhile
        keeps the vectors its write made). Resumable: it only ever touches vectors of another
        model. Returns how many memories were (or, with ``dry_run``, would be) embedded again.
        ``progress(done, total)`` is called after each batch of ``batch`` memories, one
        embedder call each."""
        index = self.index
        if index is None:
            raise ImproperlyConfigured("reindex needs a semantic index (AGENTMEMORY['SEARCH'])")
        batch = validation.check_version("batch", batch, minimum=1, maximum=validation.BATCH_MAX)
        if not dry_run:
            self._check_model()
        rows = self._memories().live().filter(embedding_key__isnull=False)
        if session_id is not None:
            rows = rows.filter(session_id=validation.check_session_id(session_id))
        changed = 0
        for found in _batches(rows, ("version", "value", "embedding"), batch, progress):
            stale = [row for row in found if model_of(row[3]) != index.tag]
            if dry_run:
                changed += len(stale)
            else:
                by_fields: dict[Any, list[tuple[Any, ...]]] = {}
                for row in stale:
                    fields = fields_of(row[3])
                    by_fields.setdefault(None if fields is None else tuple(fields), []).append(row)
                for fields, group in by_fields.items():
                    vectors = index.vectors([row[2] for row in group], fields)
                    for (memory_id, version, _, _), vector in zip(group, vectors, strict=True):
                        changed += self._writes.reindex(memory_id, version, vector)
        return changed

    def erase_session(self, session_id: str) -> int:
        """Delete every row and every version of the session, irreversibly: for data-erasure
        requests and throw-away sessions (memcheck's). Returns the number of memories deleted."""
        session_id = validation.check_session_id(session_id)
        return self._writes.erase(session_id)

    # ------------------------------------------------------------------ reads

    def recall(
        self, session_id: str, key: str, *, version: int | None = None
    ) -> MemoryRecord | None:
        """The live memory (or, with ``version=N``, that version as it was); None when it does not
        exist, was forgotten, or has expired."""
        session_id, key = self._check_ids(session_id, key)
        if version is not None:
            version = validation.check_version("version", version, minimum=1)
            self._local.source = "database"
            return self._reading(lambda: self._recall_version(session_id, key, version))
        return self._recall(session_id, [key]).get(key)

    def recall_many(
        self, session_id: str, keys: Iterable[str] | None = None, *, prefix: str | None = None
    ) -> dict[str, MemoryRecord]:
        """Live memories of the session: the given ``keys``, those starting with ``prefix``, or
        all of them. Missing, forgotten and expired keys are absent from the result."""
        session_id = validation.check_session_id(session_id)
        if keys is not None and prefix is not None:
            raise InvalidMemory("prefix", "pass keys or prefix, not both")
        if keys is not None:
            if isinstance(keys, str):
                raise InvalidMemory("keys", "must be an iterable of keys, not a single str")
            wanted = sorted({validation.check_key(k) for k in keys})
            return self._recall(session_id, wanted) if wanted else {}
        rows = self._memories().filter(state=MemoryState.LIVE)
        if Defect.SESSION_PREFIX_MATCH in self.defects:
            rows = rows.filter(session_id__startswith=session_id)
        else:
            rows = rows.filter(session_id=session_id)
        if prefix is not None:
            prefix = validation.check_prefix(prefix)
            if Defect.CASE_INSENSITIVE_PREFIX in self.defects:
                # LOWER(key) LIKE 'prefix%': case-insensitive whatever the column's collation.
                rows = rows.alias(lower_key=Lower("key")).filter(
                    lower_key__startswith=prefix.lower()
                )
                prefix = None  # and no exact test after it
            else:
                rows = rows.filter(prefix_filter(connections[self.using], "key", prefix))
        self._local.source = "database"
        return self._reading(lambda: self._recall_rows(session_id, rows, prefix))

    def _recall(self, session_id: str, keys: list[str]) -> dict[str, MemoryRecord]:
        """Validated ids in, live records out: through the cache tier when there is one."""
        # Inside the caller's transaction Redis is bypassed: it holds only committed versions
        # (the caller must read its own writes), and a fill from this transaction's view could
        # publish data that is later rolled back.
        connection = connections[self.using]
        in_transaction = connection.in_atomic_block
        if Defect.TRANSACTION_READS_CACHE in self.defects:
            in_transaction = False
        cache = self.cache
        if cache is not None and not in_transaction:
            # Redis first, outside the retry loop (a Redis failure is a miss, never retried):
            # a hit of one key is answered at once, anything else reads through with the leases
            # this round trip took.
            reads = cache.read(session_id, keys)
            if len(keys) == 1 and (only := reads.get(keys[0])) is not None and only.hit:
                self._local.source = "cache"
                return self._renewed({} if only.record is None else {keys[0]: only.record})
            found, source = self._reading(
                lambda: cache.read_through(session_id, keys, self._load, reads)
            )
            self._local.source = source
            return self._renewed(found)
        self._local.source = "database"

        def live(_retry: bool) -> dict[str, MemoryRecord]:
            loaded = self._load(session_id, keys, connection)
            return {key: record for key, _, record in loaded if record is not None}

        return self._renewed(self._retrier.run(live, connection))

    def _renewed(self, found: dict[str, MemoryRecord]) -> dict[str, MemoryRecord]:
        """With the TTL_RENEWED_ON_READ defect, a sliding TTL: each live memory read with an
        expiry gets it pushed forward by its TTL. Otherwise ``found`` as it is."""
        if Defect.TTL_RENEWED_ON_READ not in self.defects:
            return found
        now = clock.now()
        for key, record in list(found.items()):
            if record.expires_at is None:
                continue
            renewed = now + (record.expires_at - record.updated_at)
            self._memories().filter(
                session_id=record.session_id, key=key, version=record.version
            ).update(expires_at=renewed)
            found[key] = dataclasses.replace(record, expires_at=renewed)
        return found

    def _recall_rows(
        self, session_id: str, rows: Any, prefix: str | None
    ) -> dict[str, MemoryRecord]:
        now = clock.now()
        found = {}
        for key, state, value, version, created, updated, expires in rows.values_list(
            "key", "state", "value", "version", "created_at", "updated_at", "expires_at"
        ):
            # The exact prefix test once more, whatever the database's collation.
            if is_live(state, expires, now) and (prefix is None or key.startswith(prefix)):
                found[key] = MemoryRecord(
                    session_id, key, value, version, created, updated, expires
                )
        return found

    def _load(
        self, session_id: str, keys: list[str], connection: Any = None
    ) -> list[tuple[str, int, MemoryRecord | None]]:
        """(key, version, record) of each key as the database holds it now: the record when the
        memory is live, None otherwise; a key with no row is version 0. ``connection``: this
        store's, when the caller has it at hand."""
        if connection is None:
            connection = connections[self.using]
        found = run(
            connection, statements_for(connection).read_keys(len(keys)), [session_id, *keys]
        )
        now = clock.now()
        rows: dict[str, tuple[int, MemoryRecord | None]] = {}
        for key, state, raw, version, created, updated, expires in found:
            expires_at = to_datetime(expires)
            record = None
            if is_live(state, expires_at, now):
                record = MemoryRecord(
                    session_id,
                    key,
                    decode_json(raw),
                    version,
                    to_datetime(created),  # type: ignore[arg-type]
                    to_datetime(updated),  # type: ignore[arg-type]
                    expires_at,
                )
            rows[key] = (version, record)
        return [(key, *rows.get(key, (0, None))) for key in keys]

    def history(
        self,
        session_id: str,
        key: str,
        *,
        limit: int | None = None,
        before_version: int | None = None,
    ) -> list[MemoryVersionRecord]:
        """The versions of ``(session_id, key)``; [] if it never existed.

        Without arguments: every version, oldest first -- its cost grows with the history (a
        key updated every few seconds has a million versions after a month). To page through
        it, pass ``limit`` (1 to 10,000): the newest ``limit`` versions, **newest first**; then
        ``before_version=`` the last version of that page for the next one (a keyset over the
        ``(memory, version)`` index: every page costs the same, however deep); ``before_version``
        alone gives a page of 100. Versions written meanwhile never shift a later page."""
        session_id, key = self._check_ids(session_id, key)
        fields = ("version", "op", "value", "created_at", "expires_at")
        if limit is None and before_version is None:
            ordered = (
                MemoryVersion.objects.using(self.using)
                .filter(memory__session_id=session_id, memory__key=key)
                .order_by("version")
                .values_list(*fields)
            )
            return self._reading(lambda: [MemoryVersionRecord(*row) for row in ordered])
        limit = validation.check_version(
            "limit", 100 if limit is None else limit, minimum=1, maximum=HISTORY_PAGE_MAX
        )
        if before_version is not None:
            before_version = validation.check_version("before_version", before_version, minimum=1)

        def read_page() -> list[MemoryVersionRecord]:
            # The memory's id first (the unique index): the page is then a range of the
            # (memory, version) index from a constant memory -- a join let MariaDB walk the
            # versions down from the newest (a page half-way down 1M versions took 381 ms).
            found = (
                self._memories()
                .filter(session_id=session_id, key=key)
                .values_list("id", "version")
                .first()
            )
            if found is None:
                return []
            memory_id, current = found
            page = MemoryVersion.objects.using(self.using).filter(memory_id=memory_id)
            if before_version is not None:
                # Versions have no gap (semantic 1), so the page is exactly the `limit` versions
                # below before_version: a bounded range, which every backend reads in `limit`
                # rows (MariaDB otherwise walked half a million to find a page half-way down).
                # A before_version past the newest means "from the newest" (read under the
                # same statement's snapshot as the row: a version written since is not in it).
                below = min(before_version, current + 1)
                page = page.filter(version__lt=below, version__gte=below - limit)
            ordered = page.order_by("-version").values_list(*fields)[:limit]
            return [MemoryVersionRecord(*row) for row in ordered]

        return self._reading(read_page)

    # ------------------------------------------------------------------ semantic recall

    def search(
        self,
        session_id: str,
        query: str,
        *,
        prefix: str | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[ScoredMemory]:
        """The session's live memories ranked by meaning: the ``limit`` best matches for
        ``query`` (after ``offset``), best first (equal scores: the memory created first, first),
        each with its ``score`` (cosine similarity, -1 to 1). ``prefix`` keeps the keys that
        start with it; ``filter`` the values that meet ``{"field": value}`` or
        ``{"field": {"$gt": 3}}`` conditions. Only memories written with the index are found.

        As consistent as :meth:`recall`: each score is computed from the vectors of the very
        version returned; forgotten, expired and erased memories are never returned; a write
        acknowledged before the search began is seen (it reads the database, never the cache)."""
        session_id = validation.check_session_id(session_id)
        return self._search(Q(session_id=session_id), None, query, prefix, filter, limit, offset)

    def search_sessions(
        self,
        session_prefix: str,
        query: str,
        *,
        prefix: str | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[ScoredMemory]:
        """:meth:`search` over every session whose id starts with ``session_prefix`` (case and
        all; ``""``: every session) -- a LangGraph namespace prefix, a user's sessions. Each
        result names its session."""
        session_prefix = validation.check_prefix(session_prefix)
        sessions = prefix_filter(connections[self.using], "session_id", session_prefix)
        return self._search(sessions, session_prefix, query, prefix, filter, limit, offset)

    def _search(
        self,
        sessions: Q,
        session_prefix: str | None,
        query: Any,
        prefix: Any,
        conditions: Any,
        limit: Any,
        offset: Any,
    ) -> list[ScoredMemory]:
        index = self.index
        if index is None:
            raise ImproperlyConfigured(
                "this MemoryStore has no semantic index: set AGENTMEMORY['SEARCH'] = {'EMBED': "
                "..., 'DIMS': ...} or pass MemoryStore(index=agentmemory.Index(...))"
            )
        if not isinstance(query, str) or not query.strip():
            raise InvalidMemory("query", f"must be a non-empty str, got {query!r}")
        if prefix is not None:
            prefix = validation.check_prefix(prefix)
        conditions = check_filter(conditions)
        limit = validation.check_version("limit", limit, minimum=1, maximum=SEARCH_LIMIT_MAX)
        offset = validation.check_version("offset", offset, minimum=0, maximum=100_000)
        self._check_model()
        # The query is embedded before the database is read: every write acknowledged before
        # this call is in what the read sees.
        wanted = index.query_vector(query)
        self._local.source = "database"
        return self._reading(
            lambda: self._ranked(
                index, wanted, sessions, session_prefix, prefix, conditions, limit, offset
            )
        )

    def _ranked(
        self,
        index: Index,
        wanted: Any,
        sessions: Q,
        session_prefix: str | None,
        prefix: str | None,
        conditions: dict[str, Any],
        limit: int,
        offset: int,
    ) -> list[ScoredMemory]:
        """Two reads. The first lists the candidates -- each live, indexed memory's id and the
        name of its vectors, from an index, without reading rows -- and ranks them by vectors
        taken from the process's cache by name (those it lacks are read from the database).
        The second reads the best candidates whole, a chunk at a time in rank order, with
        their vectors *in the same statement*, and scores each again by them: a
        memory rewritten between the two reads is returned as it is now, scored as what it is
        now -- never a value with another version's vectors. It stops once no unread candidate
        could rank among the results."""
        import numpy as np

        listed = self._first_scores(index, wanted, sessions, prefix)
        if listed is None:
            return []
        ids, first = listed
        # Best first; equal scores in the order the memories were created (by id).
        order = np.lexsort((ids, -np.nan_to_num(first, nan=-np.inf)))
        ranked = order[~np.isnan(first[order])].tolist()
        needed = offset + limit
        chunk = min(max(2 * needed, 20) if not conditions else max(8 * needed, 200), 1000)
        # (score, id, session_id, key, (row, decoded value)), kept sorted by (-score, id).
        found: list[tuple[float, int, str, str, Any]] = []
        columns = (
            "id",
            "embedding_key",
            "session_id",
            "key",
            "value",
            "version",
            "created_at",
            "updated_at",
            "expires_at",
            "embedding",
        )
        for start in range(0, len(ranked), chunk):
            chosen = [int(ids[at]) for at in ranked[start : start + chunk]]
            by_id = {
                row[0]: row for row in self._indexed_rows(sessions, prefix, columns, ids=chosen)
            }
            rows = [by_id[i] for i in chosen if i in by_id]
            # The vectors read in the same statement as the value (a few rows: no cache).
            vectors = [unpack(row[9], index.tag) for row in rows]
            scores = index.scores(wanted, vectors) if rows else []
            for row, score in zip(rows, scores, strict=True):
                _, _, session_id, key, raw, *_ = row
                if np.isnan(score):
                    continue  # rewritten under another configuration meanwhile
                if session_prefix is not None and not session_id.startswith(session_prefix):
                    continue  # the exact prefix test once more, whatever the collation
                if prefix is not None and not key.startswith(prefix):
                    continue
                value = decode_json(raw)
                if conditions and not matches(value, conditions):
                    continue
                found.append((float(score), row[0], session_id, key, (row, value)))
            found.sort(key=lambda item: (-item[0], item[1]))
            unread = start + chunk
            # Done when the next unread candidate ranks after the last result needed (it does
            # unless a result was rewritten meanwhile and scores lower now).
            if len(found) >= needed and (
                unread >= len(ranked)
                or (-found[needed - 1][0], found[needed - 1][1])
                < (-first[ranked[unread]], ids[ranked[unread]])
            ):
                break
        results = []
        for score, _, session_id, key, (row, value) in found[offset:needed]:
            version, created, updated, expires = row[5:9]
            results.append(
                ScoredMemory(
                    session_id,
                    key,
                    value,
                    version,
                    to_datetime(created),  # type: ignore[arg-type]
                    to_datetime(updated),  # type: ignore[arg-type]
                    to_datetime(expires),
                    score,
                )
            )
        return results

    def _first_scores(
        self, index: Index, wanted: Any, sessions: Q, prefix: str | None
    ) -> tuple[Any, Any] | None:
        """Read 1: the candidates' ids (ascending) and their scores, or None if there is none.

        The vectors come as one matrix. The process keeps the last few (per session filter) with
        the names they were built from: a session searched again reuses its matrix, and after a
        few writes only the rows whose name changed are taken from the cache (or read)."""
        import numpy as np

        listed = self._indexed_rows(sessions, prefix, ("id", "embedding_key"))
        if not listed:
            return None
        pairs = np.array(listed, dtype=np.int64)
        pairs = pairs[np.argsort(pairs[:, 0])]
        ids, names = np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])
        cache = vector_cache()
        scope = f"{self.using}|{index.tag}|{sessions}|{prefix}"
        kept = cache.stacked(scope)
        todo = np.arange(len(ids))
        matrix = None
        if kept is not None and kept[2].shape[1] == index.dims:
            old_ids, old_names, old_matrix = kept
            at = np.minimum(np.searchsorted(old_ids, ids), len(old_ids) - 1)
            same = (old_ids[at] == ids) & (old_names[at] == names)
            if same.all() and len(ids) == len(old_ids):
                return ids, (old_matrix @ wanted).astype(np.float64)
            matrix = np.empty((len(ids), index.dims), dtype=np.float32)
            matrix[same] = old_matrix[at[same]]
            todo = np.nonzero(~same)[0]
        exact = True
        if len(todo):
            rows = [(int(ids[i]), int(names[i])) for i in todo]
            vectors, exact = self._vectors(index.tag, rows, sessions, prefix)
            fresh = index.stacked(vectors)
            if fresh is None:
                # Several texts per memory, or vectors of other dims, among them: each alone.
                pairs_ = list(zip(ids.tolist(), names.tolist(), strict=True))
                return ids, index.scores(
                    wanted, self._vectors(index.tag, pairs_, sessions, prefix)[0]
                )
            if matrix is None:
                matrix = fresh
            else:
                matrix[todo] = fresh
        if exact:
            cache.stack(scope, ids, names, matrix)
        return ids, (matrix @ wanted).astype(np.float64)

    def _vectors(
        self, model: int, rows: list[tuple[Any, ...]], sessions: Q, prefix: str | None
    ) -> tuple[list[Any], bool]:
        """The vectors named by each row's ``(id, embedding_key, ...)``: from the process's
        cache, the rest read from the database -- by id, or, when many are missing (a cold
        cache), in one scan. A row rewritten since it was listed gets its new vectors (a search
        concurrent with the write may rank by either; its result is scored again anyway); a row
        gone since gets None, and so do vectors of another ``model`` (they are never compared).
        And whether every row got the vectors of its own name."""
        cache = vector_cache()
        vectors = cache.get_many([row[1] for row in rows], model)
        missing = [at for at, found in enumerate(vectors) if found is MISSING]
        if not missing:
            return vectors, True
        columns = ("id", "embedding_key", "embedding")
        if len(missing) > 500:
            read = self._indexed_rows(sessions, prefix, columns)
        else:
            ids = [rows[at][0] for at in missing]
            read = self._indexed_rows(sessions, prefix, columns, ids=ids)
        by_id = {}
        for row_id, name, blob in read:
            matrix = unpack(blob, model)
            cache.put(name, matrix, model)
            by_id[row_id] = (name, matrix)
        exact = True
        for at in missing:
            name, vectors[at] = by_id.get(rows[at][0], (None, None))
            exact = exact and name == rows[at][1]
        return vectors, exact

    def _indexed_rows(
        self,
        sessions: Q,
        prefix: str | None,
        columns: tuple[str, ...],
        *,
        ids: list[int] | None = None,
    ) -> list[tuple[Any, ...]]:
        """The live, indexed memories' ``columns`` (``ids``: of these rows only), in no
        particular order (so that the search index alone can answer), as the driver returns
        them: values are decoded for the results only."""
        if Defect.SEARCH_IGNORES_EXPIRY in self.defects:
            rows = self._memories().filter(state=MemoryState.LIVE)
        else:
            rows = self._memories().live()
        rows = rows.filter(sessions, embedding_key__isnull=False)
        if prefix:
            rows = rows.filter(prefix_filter(connections[self.using], "key", prefix))
        if ids is not None:
            rows = rows.filter(id__in=ids)
        rows = rows.order_by().values_list(*columns)
        sql, params = rows.query.get_compiler(using=self.using).as_sql()
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    async def asearch(self, session_id: str, query: str, **kwargs: Any) -> list[ScoredMemory]:
        return await aio.run(self.search, session_id, query, **kwargs)

    async def asearch_sessions(
        self, session_prefix: str, query: str, **kwargs: Any
    ) -> list[ScoredMemory]:
        return await aio.run(self.search_sessions, session_prefix, query, **kwargs)

    # ------------------------------------------------------------------ async twins

    async def aremember(self, session_id: str, key: str, value: Any, **kwargs: Any) -> MemoryRecord:
        return await aio.run(self.remember, session_id, key, value, **kwargs)

    async def aupdate(
        self, session_id: str, key: str, fn: Callable[[Any], Any], **kwargs: Any
    ) -> MemoryRecord:
        return await aio.run(self.update, session_id, key, fn, **kwargs)

    async def aremember_many(
        self, session_id: str, items: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, MemoryRecord]:
        return await aio.run(self.remember_many, session_id, items, **kwargs)

    async def arecall(self, session_id: str, key: str, **kwargs: Any) -> MemoryRecord | None:
        return await aio.run(self.recall, session_id, key, **kwargs)

    async def arecall_many(
        self, session_id: str, keys: Iterable[str] | None = None, **kwargs: Any
    ) -> dict[str, MemoryRecord]:
        return await aio.run(self.recall_many, session_id, keys, **kwargs)

    async def aforget(self, session_id: str, key: str, **kwargs: Any) -> bool:
        return await aio.run(self.forget, session_id, key, **kwargs)

    async def ahistory(self, session_id: str, key: str, **kwargs: Any) -> list[MemoryVersionRecord]:
        return await aio.run(self.history, session_id, key, **kwargs)

    async def arevert(self, session_id: str, key: str, version: int, **kwargs: Any) -> MemoryRecord:
        return await aio.run(self.revert, session_id, key, version, **kwargs)

    async def aexpire(self, session_id: str, key: str, **kwargs: Any) -> bool:
        return await aio.run(self.expire, session_id, key, **kwargs)

    async def aforget_session(self, session_id: str) -> int:
        return await aio.run(self.forget_session, session_id)

    # ------------------------------------------------------------------ semantic index

    def _check_index(self, index: Any) -> Any:
        """``index=``: None (the index's fields), False (not indexed) or a list of JSON paths.
        False when the store has no index: nothing is embedded."""
        if index is None or index is False:
            return index if self.index is not None else False
        if index is True:
            return None if self.index is not None else False
        if isinstance(index, str) or not isinstance(index, list | tuple):
            raise InvalidMemory(
                "index", f"must be None, False or a list of JSON paths, got {index!r}"
            )
        for path in index:
            try:
                parse_path(path)
            except ValueError as error:
                raise InvalidMemory("index", str(error)) from None
        return list(index) if self.index is not None else False

    def _indexing(self, fields: Any, values: list[Any]) -> list[dict[str, Any]]:
        """The ``Change`` arguments that index each value known up front (one embedder call
        for all of them)."""
        if fields is False or self.index is None or not values:
            return [{} for _ in values]
        vectors = self.index.vectors(values, fields)
        self._check_model()
        # The stale-vector defect needs the value under the lock: it embeds there again.
        embed = self._embedder(fields) if Defect.STALE_VECTOR in self.defects else None
        return [{"vector": vector, "embed": embed} for vector in vectors]

    def _embedder(self, fields: Any) -> Callable[[Any], bytes | None] | None:
        """For a value computed under the row lock: the function that embeds it there."""
        index = self.index
        if fields is False or index is None:
            return None
        self._check_model()  # before the write path: it writes, and fn runs under a row lock
        return lambda value: index.vectors([value], fields)[0]

    def _check_model(self) -> None:
        """Once per index and database (the settings' index is one per process: a store made
        per request checks it once): the embedder gives the probe text the vector its model
        gave it when the store first met that model (kept in :data:`MODELS_SESSION`, one key
        per fingerprint) -- or :class:`EmbeddingFailed`, before anything is written: an
        embedder that changed under the same name would make vectors no search may compare
        with the stored ones."""
        index = self.index
        if index is None or self.using in index.checked:
            return
        import numpy as np

        key = f"model-{index.tag:08x}"
        probe = index.probe
        record = self.recall(MODELS_SESSION, key)
        if record is None:
            value = {
                "model": index.model_name,
                "dims": index.dims,
                "probe": [round(float(x), 6) for x in probe],
            }
            try:
                record = self.remember(MODELS_SESSION, key, value, expected_version=0, index=False)
            except VersionConflict:
                record = self.recall(MODELS_SESSION, key)
        known = np.asarray((record.value or {}).get("probe", []) if record else [], np.float32)
        similarity = float(known @ probe) if known.shape == probe.shape else -1.0
        if similarity < SAME_MODEL_COSINE:
            raise EmbeddingFailed(
                f"the embedder gives other vectors than the model {index.model_name!r} "
                f"({index.dims} dims) gave when its memories were indexed (probe similarity "
                f"{similarity:.3f}): name the new model in AGENTMEMORY['SEARCH']['MODEL'] (or "
                "Index(model=...)) and run `manage.py reindex`; nothing was written"
            )
        index.checked.add(self.using)

    # ------------------------------------------------------------------ helpers

    def _expire_or_forget(self, session_id: str, key: str, op: str) -> bool:
        return bool(self._writes.write(session_id, {key: Change(op, create=False)})[key])

    def _value_of_version(self, session_id: str, key: str, version: int) -> Any:
        old = (
            MemoryVersion.objects.using(self.using)
            .filter(memory__session_id=session_id, memory__key=key, version=version)
            .values_list("op", "value")
            .first()
        )
        if old is None:
            self._check_not_pruned(session_id, key, version)
            raise InvalidMemory("version", f"({session_id!r}, {key!r}) has no version {version}")
        if old[0] not in (Op.WRITE, Op.REVERT):
            raise InvalidMemory(
                "version", f"version {version} is a {old[0]}; it holds no value to revert to"
            )
        return old[1]

    def _check_not_pruned(self, session_id: str, key: str, version: int) -> None:
        """A version that is not in the history: pruned (a clear answer), or never written."""
        kept_from = (
            self._memories()
            .filter(session_id=session_id, key=key)
            .values_list("history_from", flat=True)
            .first()
        )
        if kept_from is not None and version < kept_from:
            raise VersionPruned(session_id, key, version=version, kept_from=kept_from)

    def _reading(self, work: Callable[[], T]) -> T:
        """Run a read, retried like a write when its connection drops or a lock times out (a
        connection killed between two calls fails the next one, whichever it is)."""
        return self._retrier.run(lambda _retry: work())

    def _memories(self) -> Any:
        return Memory.objects.using(self.using)

    def _recall_version(self, session_id: str, key: str, version: int) -> MemoryRecord | None:
        found = (
            MemoryVersion.objects.using(self.using)
            .filter(
                memory__session_id=session_id,
                memory__key=key,
                version=version,
                op__in=[Op.WRITE, Op.REVERT],
            )
            .values_list("value", "created_at", "expires_at", "memory__created_at")
            .first()
        )
        if found is None:
            self._check_not_pruned(session_id, key, version)
            return None
        value, created, expires, memory_created = found
        if expires is not None and expires <= clock.now():
            return None
        return MemoryRecord(
            session_id, key, value, version, min(memory_created, created), created, expires
        )

    def _check_ids(self, session_id: Any, key: Any) -> tuple[str, str]:
        return validation.check_session_id(session_id), validation.check_key(key)

    def _check_value(self, value: Any) -> Any:
        # A decoded copy: the caller's later mutations cannot reach what was stored or returned.
        limit = get_config()["MAX_VALUE_BYTES"]  # read at each use: override_settings applies
        return json.loads(validation.encode_value(value, limit))

    def _check_ttl(self, ttl: Any) -> timedelta | None:
        if Defect.TTL_ZERO_IS_FOREVER in self.defects and isinstance(ttl, int | float):
            ttl = None if ttl <= 0 else ttl
        return validation.check_ttl(ttl)

    def _check_expected(self, expected_version: Any) -> int | None:
        if expected_version is None:
            return None
        return validation.check_version("expected_version", expected_version, minimum=0)

    def _request(self, idempotency_key: str | None) -> dict[str, Any]:
        """The caller's idempotency key as the change's request id (otherwise ``Change``
        generates one)."""
        if idempotency_key is None or Defect.IDEMPOTENCY_IGNORED in self.defects:
            return {}
        return {
            "request_id": "k:" + validation.check_idempotency_key(idempotency_key),
            "caller_request_id": True,
        }


def _batches(
    rows: Any,
    columns: tuple[str, ...],
    batch: int,
    progress: Callable[[int, int], None] | None,
) -> Iterator[list[tuple[Any, ...]]]:
    """``rows`` as lists of ``(id, *columns)`` of at most ``batch``, in id order, by keyset (each
    batch costs the same however far in); ``progress(done, total)`` after each is processed."""
    total = rows.count()
    done, after = 0, 0
    while True:
        found = list(rows.filter(id__gt=after).order_by("id").values_list("id", *columns)[:batch])
        yield found
        done += len(found)
        if progress is not None:
            progress(done, total)
        if len(found) < batch:
            return
        after = found[-1][0]
