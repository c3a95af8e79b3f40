"""The one read path: every read of a memory goes through :class:`ReadPath`, the twin of
:class:`~agentmemory.writes.WritePath`.

A recall of keys asks the Redis tier first when there is one (:meth:`MemoryCache.read
<agentmemory.cache.MemoryCache.read>`): a hit of one key is the answer; anything else reads
through the tier (:meth:`~agentmemory.cache.MemoryCache.read_through`) with :meth:`ReadPath.load`,
the database reader the tier wraps -- as Django's ``cached_db`` session backend wraps ``db``'s.
Inside a caller's transaction, and without a tier, the database alone answers. A prefix, a past
version and the history always read the database. Every database read is retried like a write
(:meth:`Retrier.read <agentmemory.retries.Retrier.read>`): a connection killed between two calls
fails the next one, whichever it is.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from django.db import connections
from django.db.models.functions import Lower

from . import clock
from .cache import MemoryCache
from .defects import NONE as NO_DEFECTS
from .defects import Defect, Defects
from .errors import InvalidMemory, VersionPruned
from .models import Memory, MemoryState, MemoryVersion, is_live
from .records import VALUE_OPS, MemoryRecord, MemoryVersionRecord
from .retries import Retrier
from .sql import RECORD_COLUMNS, record_from_row, run, run_query, statements_for
from .vendors import has_prefix, prefix_filter

T = TypeVar("T")


class ReadPath:
    """Reads of one store: its database alias, its cache tier (or None) and its retries."""

    def __init__(
        self,
        using: str,
        cache: MemoryCache | None,
        retrier: Retrier,
        *,
        defects: Defects = NO_DEFECTS,
    ) -> None:
        self.using = using
        self.cache = cache
        self.retrier = retrier
        #: Planted bugs (:mod:`agentmemory.defects`), for memcheck's self-test only.
        self.defects = defects
        self._local = threading.local()

    @property
    def last_source(self) -> str | None:
        """Where this thread's last read was answered from: ``"cache"`` (every key from Redis)
        or ``"database"``; None before the first."""
        return getattr(self._local, "source", None)

    def from_database(self, work: Callable[[], T]) -> T:
        """``work()``, a read of the database, retried; this thread's last source is the
        database (a search, a version, a prefix)."""
        self._local.source = "database"
        return self.retrier.read(work)

    # ------------------------------------------------------------------ live memories

    def recall(self, session_id: str, keys: list[str]) -> dict[str, MemoryRecord]:
        """The live records of ``keys`` (validated, sorted, unique): Redis first when there is
        a tier and no caller's transaction, else the database."""
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
            cached = cache.read(session_id, keys)
            if len(keys) == 1 and (only := cached.get(keys[0])) is not None and only.hit:
                self._local.source = "cache"
                return self._renewed({} if only.record is None else {keys[0]: only.record})
            found, source = self.retrier.read(
                lambda: cache.read_through(session_id, keys, self.load, cached)
            )
            self._local.source = source
            return self._renewed(found)
        self._local.source = "database"

        def live() -> dict[str, MemoryRecord]:
            loaded = self.load(session_id, keys, connection)
            return {key: record for key, _, record in loaded if record is not None}

        return self._renewed(self.retrier.read(live, connection))

    def load(
        self, session_id: str, keys: list[str], connection: Any = None
    ) -> list[tuple[str, int, MemoryRecord | None]]:
        """The database reader: (key, version, record) of each key as the database holds it
        now, in one statement -- the record when the memory is live, None otherwise; a key
        with no row is version 0. ``connection``: this alias's, when the caller has it."""
        if connection is None:
            connection = connections[self.using]
        found = run(
            connection, statements_for(connection).read_keys(len(keys)), [session_id, *keys]
        )
        now = clock.now()
        rows = {row[0]: (row[3], record_from_row(session_id, row, now=now)) for row in found}
        return [(key, *rows.get(key, (0, None))) for key in keys]

    def recall_prefix(self, session_id: str, prefix: str | None) -> dict[str, MemoryRecord]:
        """The session's live memories whose key starts with ``prefix`` (validated; None:
        all of them), from the database."""
        rows = self._memories().filter(state=MemoryState.LIVE)
        if Defect.SESSION_PREFIX_MATCH in self.defects:
            rows = rows.filter(session_id__startswith=session_id)
        else:
            rows = rows.filter(session_id=session_id)
        connection = connections[self.using]
        if prefix is not None:
            if Defect.CASE_INSENSITIVE_PREFIX in self.defects:
                # LOWER(key) LIKE 'prefix%': case-insensitive whatever the column's collation.
                rows = rows.alias(lower_key=Lower("key")).filter(
                    lower_key__startswith=prefix.lower()
                )
                prefix = None  # and no exact test after it
            else:
                rows = rows.filter(prefix_filter(connection, "key", prefix))
        query = rows.order_by().values_list(*RECORD_COLUMNS)

        def read() -> dict[str, MemoryRecord]:
            now, found = clock.now(), {}
            for row in run_query(connection, query):
                record = record_from_row(session_id, row, now=now)
                if record is not None and has_prefix(record.key, prefix):
                    found[record.key] = record
            return found

        return self.from_database(read)

    def live_keys(self, session_id: str) -> list[str]:
        """The keys of the session's live rows, sorted (``forget_session``)."""
        keys = (
            self._memories()
            .filter(session_id=session_id, state=MemoryState.LIVE)
            .values_list("key", flat=True)
        )
        return self.retrier.read(lambda: sorted(keys))

    def due(self, batch: int) -> list[tuple[str, str]]:
        """At most ``batch`` (session_id, key) of live rows whose TTL has passed, the longest
        overdue first (``purge_expired``)."""
        rows = (
            self._memories()
            .filter(state=MemoryState.LIVE, expires_at__lte=clock.now())
            .order_by("expires_at")
            .values_list("session_id", "key")
        )
        return self.retrier.read(lambda: list(rows[:batch]))

    def due_count(self) -> int:
        """How many live rows are past their TTL (``purge_expired --dry-run``)."""
        rows = self._memories().filter(state=MemoryState.LIVE, expires_at__lte=clock.now())
        return self.retrier.read(rows.count)

    def batches(
        self,
        columns: tuple[str, ...],
        batch: int,
        progress: Callable[[int, int], None] | None,
        *,
        session_id: str | None = None,
        indexed: bool = False,
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows (every memory's, or ``session_id``'s; ``indexed``: the live, indexed ones)
        as lists of ``(id, *columns)`` of at most ``batch``, in id order, by keyset (each batch
        costs the same however far in); ``progress(done, total)`` after each is processed."""
        rows = self._memories()
        if indexed:
            rows = rows.live().filter(embedding_key__isnull=False)
        if session_id is not None:
            rows = rows.filter(session_id=session_id)
        total = self.retrier.read(rows.count)
        done, after = 0, 0
        while True:
            page = rows.filter(id__gt=after).order_by("id").values_list("id", *columns)[:batch]
            found = self.retrier.read(lambda page=page: list(page))
            yield found
            done += len(found)
            if progress is not None:
                progress(done, total)
            if len(found) < batch:
                return
            after = found[-1][0]

    # ------------------------------------------------------------------ versions

    def version(self, session_id: str, key: str, version: int) -> MemoryRecord | None:
        """``version`` of the memory as it was, if it held a value and its TTL has not passed;
        :class:`VersionPruned` if retention removed it."""

        def read() -> MemoryRecord | None:
            found = (
                MemoryVersion.objects.using(self.using)
                .filter(
                    memory__session_id=session_id,
                    memory__key=key,
                    version=version,
                    op__in=list(VALUE_OPS),
                )
                .values_list("value", "created_at", "expires_at", "memory__created_at")
                .first()
            )
            if found is None:
                self._check_not_pruned(session_id, key, version)
                return None
            value, created, expires, memory_created = found
            planted = Defect.VERSION_READ_IGNORES_EXPIRY in self.defects
            if not is_live(MemoryState.LIVE, expires, clock.now()) and not planted:
                return None
            return MemoryRecord(
                session_id, key, value, version, min(memory_created, created), created, expires
            )

        return self.from_database(read)

    def value_of_version(self, session_id: str, key: str, version: int) -> Any:
        """The value ``version`` held, for a revert, under its row lock (in its transaction:
        not retried here); :class:`InvalidMemory` if it holds none, :class:`VersionPruned` if
        retention removed it."""
        old = (
            MemoryVersion.objects.using(self.using)
            .filter(memory__session_id=session_id, memory__key=key, version=version)
            .values_list("op", "value")
            .first()
        )
        if old is None:
            self._check_not_pruned(session_id, key, version)
            raise InvalidMemory("version", f"({session_id!r}, {key!r}) has no version {version}")
        if old[0] not in VALUE_OPS:
            raise InvalidMemory(
                "version", f"version {version} is a {old[0]}; it holds no value to revert to"
            )
        return old[1]

    def history(
        self, session_id: str, key: str, limit: int | None, before_version: int | None
    ) -> list[MemoryVersionRecord]:
        """Every version oldest first (both None), or the page of ``limit`` versions below
        ``before_version`` (None: from the newest), newest first (see ``MemoryStore.history``)."""
        fields = ("version", "op", "value", "created_at", "expires_at")
        if limit is None:
            ordered = (
                MemoryVersion.objects.using(self.using)
                .filter(memory__session_id=session_id, memory__key=key)
                .order_by("version")
                .values_list(*fields)
            )
            return self.retrier.read(lambda: [MemoryVersionRecord(*row) for row in ordered])

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
                if Defect.HISTORY_PAGE_REPEATS in self.defects:
                    below += 1  # the planted bug: the bound itself on the page
                page = page.filter(version__lt=below, version__gte=below - limit)
            ordered = page.order_by("-version").values_list(*fields)[:limit]
            return [MemoryVersionRecord(*row) for row in ordered]

        return self.retrier.read(read_page)

    # ------------------------------------------------------------------ helpers

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

    def _memories(self) -> Any:
        return Memory.objects.using(self.using)
