"""``MemoryStore``: the public API. Input is checked here (:mod:`~agentmemory.validation`), before
any query; then every change goes to the one write path (:mod:`~agentmemory.writes`), every read
to the one read path (:mod:`~agentmemory.reads`: Redis first when there is a tier, the database
behind it), and indexing and search to the search engine (:mod:`~agentmemory.search`). The store
runs no SQL and holds no transaction of its own; transient errors are retried by
:mod:`~agentmemory.retries` inside those paths."""

from __future__ import annotations

import contextlib
import math
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from . import aio, signals, validation
from .cache import MemoryCache
from .checkpoints import CheckpointPath
from .conf import get_config
from .defects import Defect, Defects
from .errors import InvalidMemory, SessionMoved
from .logs import LogPath
from .models import Op
from .reads import ReadPath
from .records import (
    LogEventRecord,
    LogItemRecord,
    MemoryRecord,
    MemoryVersionRecord,
    ScoredMemory,
)
from .retries import Retrier
from .search import IndexFields, SearchEngine
from .semantic import Index, check_filter, parse_path, settings_index
from .telemetry import KEYED, instrumented
from .writes import Change, WritePath, default_ttl

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
        gated: bool = False,
    ) -> None:
        """``using``: the database alias (default ``AGENTMEMORY["DATABASE"]``); ``cache``: the
        cache alias of the Redis tier, or None (default ``AGENTMEMORY["CACHE"]``);
        ``namespace``: a name that separates this store's Redis entries from other stores' on the
        same cache (the test plugin gives each test one): a test seam, never for data -- stores of
        two namespaces over one database do not invalidate each other's entries, so one serves
        what the other overwrote (each test has data of its own). ``row_lock=False`` is the unsafe seam
        (see :class:`~agentmemory.writes.WritePath`) and ``defects`` the planted bugs of
        :mod:`agentmemory.defects`: for memcheck and tests, never for data. ``index``: the
        semantic index of :meth:`search` (default ``AGENTMEMORY["SEARCH"]``; None: no search).
        ``gated``: a shard's store (a :class:`~agentmemory.ShardedStore` makes its own so):
        each write first passes its session's gate, so that sessions can be moved between
        shards online (:mod:`agentmemory.moves`); a write of a session moved away raises
        :class:`~agentmemory.SessionMoved`."""
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
        self._retrier.gated = gated and Defect.UNGATED_WRITES not in self.defects
        self._writes = WritePath(
            self.using, self.cache, self._retrier, row_lock=row_lock, defects=self.defects
        )
        self._reads = ReadPath(self.using, self.cache, self._retrier, defects=self.defects)
        self._logs = LogPath(self.using, self._retrier, row_lock=row_lock, defects=self.defects)
        #: The checkpoint chains of this database (LangGraph's checkpointer stores through it:
        #: :class:`~agentmemory.integrations.langgraph.AgentMemorySaver`).
        self.checkpoints = CheckpointPath(
            self.using, self._retrier, row_lock=row_lock, defects=self.defects
        )
        self._search: SearchEngine | None = (
            SearchEngine(self.using, self.index, self._reads, self._writes, defects=self.defects)
            if self.index is not None
            else None
        )

    @property
    def retries(self) -> Counter[str]:
        """Transient errors absorbed by retries, by kind; read by memcheck and the benchmarks."""
        return self._retrier.counts

    @property
    def last_read_source(self) -> str | None:
        """Where this thread's last ``recall``/``recall_many`` was answered from: ``"cache"``
        (every key from Redis) or ``"database"``; None before the first read. For diagnostics
        and memcheck's histories."""
        return self._reads.last_source

    def shard(self, session_id: str) -> MemoryStore:
        """The store that holds ``session_id``: this one (a
        :class:`~agentmemory.sharding.ShardedStore` answers with the session's shard's), so code
        can take either kind of store."""
        validation.check_session_id(session_id)
        return self

    def __repr__(self) -> str:
        unsafe = "" if self.row_lock else " row_lock=False"
        if self.defects:
            unsafe += f" defects={self.defects!r}"
        return f"<MemoryStore using={self.using!r} cache={self.cache_alias!r}{unsafe}>"

    # ------------------------------------------------------------------ writes

    @instrumented("remember", KEYED)
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
        value = validation.check_value(value)
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

    @instrumented("update", KEYED)
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
            compute=lambda current: validation.check_value(fn(current)),
            default=validation.check_value(default),
            ttl=self._check_ttl(ttl),
            embed=self._embedder(self._check_index(index)),
        )
        return self._writes.write(session_id, {key: change})[key]

    @instrumented("remember_many")
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
                checked[key] = validation.check_value(value)
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

    @instrumented("revert", KEYED)
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
        reads = self._reads
        change.compute = lambda _current: reads.value_of_version(session_id, key, version)
        return self._writes.write(session_id, {key: change})[key]

    @instrumented("forget", KEYED)
    def forget(self, session_id: str, key: str, *, expected_version: int | None = None) -> bool:
        """Record a ``forget`` version; True if a live memory was forgotten."""
        session_id, key = self._check_ids(session_id, key)
        change = Change(
            Op.FORGET, expected_version=self._check_expected(expected_version), create=False
        )
        return self._writes.write(session_id, {key: change})[key] is not None

    @instrumented("expire", KEYED)
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

    @instrumented("forget_session")
    def forget_session(self, session_id: str) -> int:
        """Forget every live memory of the session (each gets a ``forget`` version); the count."""
        session_id = validation.check_session_id(session_id)
        keys = self._reads.live_keys(session_id)
        return sum(self._writes.retire(session_id, key, Op.FORGET) for key in keys)

    @instrumented("purge_expired", ())
    def purge_expired(
        self,
        *,
        batch: int = 1000,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Record an ``expire`` version for each memory past its TTL and retire its live row,
        and an ``expire`` event for each log past its TTL (its items hidden); returns how many
        memories and logs with live items expired (``dry_run``: how many are past their TTL
        now, changing nothing). ``progress(done, total)`` after each batch. Each memory under
        its own row lock, so it runs beside live writers: one rewritten with a new TTL since
        the batch was read is left alone."""
        batch = validation.check_version("batch", batch, minimum=1, maximum=validation.BATCH_MAX)
        if dry_run:
            return sum(self.expired_counts())
        # The bar's total: counted only for a caller that draws one.
        total = sum(self.expired_counts()) if progress is not None else 0
        done, purged = 0, 0
        while True:
            due = self._reads.due(batch)
            for session_id, key in due:
                with contextlib.suppress(SessionMoved):  # moved since: its shard purges it
                    purged += self._writes.retire(session_id, key, Op.EXPIRE)
            done += len(due)
            if progress is not None and due:
                progress(done, max(total, done))
            if len(due) < batch:
                break
        while True:
            due_logs = self._logs.due(batch)
            for session_id, stream in due_logs:
                with contextlib.suppress(SessionMoved):
                    purged += self._logs.expire(session_id, stream)
            done += len(due_logs)
            if progress is not None:
                progress(done, max(total, done))
            if len(due_logs) < batch:
                return purged

    def expired_counts(self) -> tuple[int, int]:
        """How many live memories and how many logs with live items are past their TTL now:
        what :meth:`purge_expired` would expire."""
        return self._reads.due_count(), self._logs.due_count()

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
        if session_id is not None:
            session_id = validation.check_session_id(session_id)
        pruned = 0
        for found in self._reads.batches((), batch, progress, session_id=session_id):
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
        if self._search is None:
            raise ImproperlyConfigured("reindex needs a semantic index (AGENTMEMORY['SEARCH'])")
        batch = validation.check_version("batch", batch, minimum=1, maximum=validation.BATCH_MAX)
        if session_id is not None:
            session_id = validation.check_session_id(session_id)
        return self._search.reindex(batch, dry_run, progress, session_id)

    @instrumented("erase_session")
    def erase_session(self, session_id: str) -> int:
        """Delete every row and every version of the session, and every log with its items and
        events, irreversibly: for data-erasure requests and throw-away sessions (memcheck's).
        Returns the number of memories and logs deleted."""
        session_id = validation.check_session_id(session_id)
        erased = self._writes.erase(session_id) + self._logs.erase(session_id)
        signals.after_commit(signals.session_erased, self.using, session_id=session_id)
        return erased

    # ------------------------------------------------------------------ logs

    @instrumented("append")
    def append(
        self,
        session_id: str,
        stream: str,
        items: Sequence[Any],
        *,
        ttl: float | timedelta | None = None,
        idempotency_key: str | None = None,
    ) -> list[LogItemRecord]:
        """Append ``items`` (a list of JSON values) to the log ``(session_id, stream)``, all or
        nothing, as the next numbers of its sequence (1, 2, 3, ... with no gap and no reuse);
        returns them as stored. A repeated call with the same ``idempotency_key`` returns the
        items the first call appended and appends nothing. Each append sets the log's expiry
        anew (``ttl``; None: ``AGENTMEMORY["DEFAULT_TTL"]``): a log expires as a whole. An
        empty list appends nothing and returns ``[]``."""
        session_id, stream = self._check_log(session_id, stream)
        values = validation.check_items(items)
        ttl_ = self._check_ttl(ttl)
        request = self._log_request(idempotency_key)
        if not values:
            return []
        return self._logs.append(session_id, stream, values, ttl_, *request)

    @instrumented("pop")
    def pop(
        self, session_id: str, stream: str, *, idempotency_key: str | None = None
    ) -> LogItemRecord | None:
        """Remove the log's last live item and return it; None if the log is empty. Two pops
        never return the same item, and each removes exactly what it returned; a repeated call
        with the same ``idempotency_key`` returns what the first one popped."""
        session_id, stream = self._check_log(session_id, stream)
        return self._logs.pop(session_id, stream, *self._log_request(idempotency_key))

    @instrumented("clear_log")
    def clear_log(self, session_id: str, stream: str, *, idempotency_key: str | None = None) -> int:
        """Remove every live item of the log (one ``clear`` event; the numbering goes on after
        it); returns how many there were."""
        session_id, stream = self._check_log(session_id, stream)
        return self._logs.clear(session_id, stream, *self._log_request(idempotency_key))

    @instrumented("rewrite_log")
    def rewrite_log(
        self,
        session_id: str,
        stream: str,
        fn: Callable[[list[Any]], Sequence[Any]],
        *,
        ttl: float | timedelta | None = None,
    ) -> list[LogItemRecord]:
        """Replace the log's live items by ``fn(items)`` -- ``items``: their values, oldest
        first; ``fn`` returns the new list -- under the log's lock, all at once: a ``clear``
        event and an ``append`` event committed together, so a reader sees the items before or
        after, never between, and an append that races with it lands either before (``fn``
        sees it) or after (after the new items): none is lost or repeated. What an insert in the
        middle, a removal by position or a compaction needs. The new items are numbered after
        the log's last number (numbers are never reused); returns them as stored. ``fn`` may run
        more than once if the database asks for a retry: keep it free of side effects. What it
        returns is checked as :meth:`append`'s items (:class:`InvalidMemory`, nothing written).
        ``ttl`` as :meth:`append` (when items are written)."""
        return self._rewrite(session_id, stream, fn, ttl, replace=True)

    @instrumented("append_with")
    def append_with(
        self,
        session_id: str,
        stream: str,
        fn: Callable[[list[Any]], Sequence[Any]],
        *,
        ttl: float | timedelta | None = None,
    ) -> list[LogItemRecord]:
        """Append ``fn(items)`` -- ``items``: the live values, oldest first; ``fn`` returns what
        to append -- under the log's lock, so what ``fn`` saw is what the items follow: a save
        that leaves out what the log already holds (a framework that resends the whole
        transcript, or retries a save) appends each message once, however many savers race.
        Otherwise as :meth:`append` (all or nothing, numbered after the last item); returns the
        items appended. ``fn`` may run more than once if the database asks for a retry: keep it
        free of side effects."""
        return self._rewrite(session_id, stream, fn, ttl, replace=False)

    def _rewrite(
        self, session_id: Any, stream: Any, fn: Any, ttl: Any, *, replace: bool
    ) -> list[LogItemRecord]:
        session_id, stream = self._check_log(session_id, stream)
        if not callable(fn):
            raise InvalidMemory("fn", f"must be callable, got {type(fn).__name__}")
        ttl_ = self._check_ttl(ttl)
        return self._logs.rewrite(session_id, stream, fn, ttl_, uuid.uuid4().hex, replace=replace)

    @instrumented("read_log")
    def read_log(
        self,
        session_id: str,
        stream: str,
        *,
        limit: int | None = None,
        before: int | None = None,
        after: int | None = None,
        since: tuple[str, float] | None = None,
    ) -> list[LogItemRecord]:
        """The log's live items, oldest first: every one; with ``limit``, the latest ``limit``
        (before item number ``before``, if given); with ``after``, the first ``limit`` after
        item number ``after`` (every one after it without a limit). Keyset pages: a page
        costs the same at any length. ``since=(member, bound)``: only items that are objects
        whose numeric ``member`` is at least ``bound`` (a timestamp: ADK's ``after_timestamp``),
        judged by the database -- ``limit`` then counts those."""
        session_id, stream = self._check_log(session_id, stream)
        if since is not None:
            since = _check_since(since)
        if limit is not None:
            limit = validation.check_version("limit", limit, minimum=0)
        if before is not None:
            before = validation.check_version("before", before, minimum=1)
        if after is not None:
            after = validation.check_version("after", after, minimum=0)
        if limit == 0:
            return []
        return self._logs.read(session_id, stream, limit, before, after, since)

    def log_length(self, session_id: str, stream: str) -> int:
        """How many live items the log has (0 when it does not exist or has expired)."""
        session_id, stream = self._check_log(session_id, stream)
        return self._logs.length(session_id, stream)

    def log_streams(self, session_id: str) -> list[str]:
        """The names of the session's logs that hold live items, in the order the logs were
        created (a log emptied by pops or a clear, or expired, is left out)."""
        return self._logs.streams(validation.check_session_id(session_id))

    def log_history(
        self,
        session_id: str,
        stream: str,
        *,
        limit: int | None = None,
        before_version: int | None = None,
    ) -> list[LogEventRecord]:
        """The log's events (appends, pops, clears, expiries), as :meth:`history` lists a
        memory's versions: without ``limit``, every one oldest first; with it, a page newest
        first, before ``before_version``."""
        session_id, stream = self._check_log(session_id, stream)
        if limit is not None:
            limit = validation.check_version(
                "limit", limit, minimum=1, maximum=validation.HISTORY_PAGE_MAX
            )
        if before_version is not None:
            before_version = validation.check_version("before_version", before_version, minimum=1)
        return self._logs.history(session_id, stream, limit, before_version)

    # ------------------------------------------------------------------ reads

    @instrumented("recall", KEYED)
    def recall(
        self, session_id: str, key: str, *, version: int | None = None
    ) -> MemoryRecord | None:
        """The live memory (or, with ``version=N``, that version as it was); None when it does not
        exist, was forgotten, or has expired."""
        session_id, key = self._check_ids(session_id, key)
        if version is not None:
            version = validation.check_version("version", version, minimum=1)
            return self._reads.version(session_id, key, version)
        return self._reads.recall(session_id, [key]).get(key)

    @instrumented("recall_many")
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
            return self._reads.recall(session_id, wanted) if wanted else {}
        if prefix is not None:
            prefix = validation.check_prefix(prefix)
        return self._reads.recall_prefix(session_id, prefix)

    @instrumented("history", KEYED)
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
        if limit is None and before_version is None:
            return self._reads.history(session_id, key, None, None)
        limit = validation.check_version(
            "limit", 100 if limit is None else limit, minimum=1, maximum=validation.HISTORY_PAGE_MAX
        )
        if before_version is not None:
            before_version = validation.check_version("before_version", before_version, minimum=1)
        return self._reads.history(session_id, key, limit, before_version)

    # ------------------------------------------------------------------ semantic recall

    @instrumented("search")
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
        engine, checked = self._check_search(query, prefix, filter, limit, offset)
        return engine.search(query, session_id=session_id, **checked)

    @instrumented("search_sessions")
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
        engine, checked = self._check_search(query, prefix, filter, limit, offset)
        return engine.search(query, session_prefix=session_prefix, **checked)

    def _check_search(
        self, query: Any, prefix: Any, conditions: Any, limit: Any, offset: Any
    ) -> tuple[SearchEngine, dict[str, Any]]:
        """The search engine and a search's checked arguments."""
        if self._search is None:
            raise ImproperlyConfigured(
                "this MemoryStore has no semantic index: set AGENTMEMORY['SEARCH'] = {'EMBED': "
                "..., 'DIMS': ...} or pass MemoryStore(index=agentmemory.Index(...))"
            )
        if not isinstance(query, str) or not query.strip():
            raise InvalidMemory("query", f"must be a non-empty str, got {query!r}")
        return self._search, {
            "prefix": None if prefix is None else validation.check_prefix(prefix),
            "conditions": check_filter(conditions),
            "limit": validation.check_version(
                "limit", limit, minimum=1, maximum=validation.SEARCH_LIMIT_MAX
            ),
            "offset": validation.check_version(
                "offset", offset, minimum=0, maximum=validation.SEARCH_OFFSET_MAX
            ),
        }

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

    async def aappend(
        self, session_id: str, stream: str, items: Sequence[Any], **kwargs: Any
    ) -> list[LogItemRecord]:
        return await aio.run(self.append, session_id, stream, items, **kwargs)

    async def apop(self, session_id: str, stream: str, **kwargs: Any) -> LogItemRecord | None:
        return await aio.run(self.pop, session_id, stream, **kwargs)

    async def aclear_log(self, session_id: str, stream: str, **kwargs: Any) -> int:
        return await aio.run(self.clear_log, session_id, stream, **kwargs)

    async def arewrite_log(
        self, session_id: str, stream: str, fn: Callable[[list[Any]], Sequence[Any]], **kwargs: Any
    ) -> list[LogItemRecord]:
        return await aio.run(self.rewrite_log, session_id, stream, fn, **kwargs)

    async def aappend_with(
        self, session_id: str, stream: str, fn: Callable[[list[Any]], Sequence[Any]], **kwargs: Any
    ) -> list[LogItemRecord]:
        return await aio.run(self.append_with, session_id, stream, fn, **kwargs)

    async def aread_log(self, session_id: str, stream: str, **kwargs: Any) -> list[LogItemRecord]:
        return await aio.run(self.read_log, session_id, stream, **kwargs)

    async def alog_streams(self, session_id: str) -> list[str]:
        return await aio.run(self.log_streams, session_id)

    async def alog_length(self, session_id: str, stream: str) -> int:
        return await aio.run(self.log_length, session_id, stream)

    async def alog_history(
        self, session_id: str, stream: str, **kwargs: Any
    ) -> list[LogEventRecord]:
        return await aio.run(self.log_history, session_id, stream, **kwargs)

    async def aerase_session(self, session_id: str) -> int:
        return await aio.run(self.erase_session, session_id)

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
        if self._search is None:
            return [{} for _ in values]
        return self._search.indexing(fields, values)

    def _embedder(self, fields: Any) -> Callable[[Any], bytes | None] | None:
        return None if self._search is None else self._search.embedder(fields)

    # ------------------------------------------------------------------ helpers

    def _check_ids(self, session_id: Any, key: Any) -> tuple[str, str]:
        return validation.check_session_id(session_id), validation.check_key(key)

    def _check_log(self, session_id: Any, stream: Any) -> tuple[str, str]:
        return validation.check_session_id(session_id), validation.check_stream(stream)

    def _log_request(self, idempotency_key: str | None) -> tuple[str, bool]:
        """A log mutation's request id and whether the caller gave it: the caller's key as
        :meth:`_request` makes it (checked, with its defect seam), or a new one."""
        request = self._request(idempotency_key)
        return request.get("request_id", uuid.uuid4().hex), bool(request)

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


def _check_since(since: Any) -> tuple[str, float]:
    """``read_log(since=)``: a (member name, finite number) pair."""
    from .logs import SINCE_MEMBER

    if not isinstance(since, tuple) or len(since) != 2:
        raise InvalidMemory("since", f"must be a (member, bound) pair, got {since!r:.60}")
    member, bound = since
    if not isinstance(member, str) or not SINCE_MEMBER.fullmatch(member):
        raise InvalidMemory(
            "since", f"the member must be a name of letters, digits and _, got {member!r:.60}"
        )
    if isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound):
        raise InvalidMemory("since", f"the bound must be a finite number, got {bound!r:.60}")
    return member, float(bound)
