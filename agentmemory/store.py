"""``MemoryStore``: the public API, and the one write path every change goes through."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from . import clock, validation
from .cache import MemoryCache
from .conf import get_config
from .errors import InvalidMemory, MemoryUnavailable, VersionConflict
from .models import Memory, MemoryState, MemoryVersion, Op
from .records import MemoryRecord, MemoryVersionRecord
from .sql import LockedRow, Statements, decode_json, encode_json, statements_for, to_datetime
from .vendors import Transient, classify, insert_if_missing, prefix_filter

T = TypeVar("T")
#: How long a cache miss waits for the reader holding the key's fill lease before it reads the
#: database itself (a lease holder that died costs its followers at most this).
HOT_KEY_WAIT_SECONDS = 0.25
_CACHE_FROM_SETTINGS: Any = object()


@dataclass
class _Change:
    """What one call asks the write path to do to one key."""

    op: str
    # For write/revert: fn(current value or default) -> new value, run under the row lock.
    compute: Callable[[Any], Any] | None = None
    default: Any = None
    ttl: timedelta | None = None
    expected_version: int | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # An idempotency key given by the caller is checked on every attempt; a generated one only
    # on retries (the first attempt cannot have committed before).
    caller_request_id: bool = False
    # forget/expire touch only an existing row; writes create it.
    create: bool = True
    # expire: only if the TTL has passed (purge_expired), or now whatever it is (expire()).
    due_only: bool = True


class MemoryStore:
    """Versioned key-value memory for one database alias.

    Every write takes the row lock of its ``(session_id, key)`` inside ``transaction.atomic``
    (``select_for_update``; SQLite serializes with ``BEGIN IMMEDIATE``), appends exactly one history
    version and retries deadlocks, serialization failures and dropped connections with jittered
    backoff. Callers see the write's :class:`MemoryRecord`, a :class:`VersionConflict`, an
    :class:`InvalidMemory` raised before any query, or :class:`MemoryUnavailable` -- never a
    half-write.
    """

    def __init__(self, using: str | None = None, cache: str | None = _CACHE_FROM_SETTINGS) -> None:
        config = get_config()
        self.using: str = using or config["DATABASE"]
        self.cache_alias: str | None = config["CACHE"] if cache is _CACHE_FROM_SETTINGS else cache
        #: The Redis tier, or None: the store is correct without it.
        self.cache: MemoryCache | None = (
            MemoryCache(self.cache_alias, self.using) if self.cache_alias else None
        )
        #: Transient errors absorbed by retries, by kind; read by memcheck and the benchmarks.
        self.retries: Counter[str] = Counter()
        self._retries_lock = threading.Lock()
        self._local = threading.local()

    # Settings are read at each use, not copied: ``override_settings`` reaches a live store.
    @property
    def _max_value_bytes(self) -> int:
        return get_config()["MAX_VALUE_BYTES"]

    @property
    def _default_ttl(self) -> timedelta | None:
        return validation.check_ttl(get_config()["DEFAULT_TTL"])

    @property
    def last_read_source(self) -> str | None:
        """Where this thread's last ``recall``/``recall_many`` was answered from: ``"cache"``
        (every key from Redis) or ``"database"``; None before the first read. For diagnostics
        and memcheck's histories."""
        return getattr(self._local, "source", None)

    def __repr__(self) -> str:
        return f"<MemoryStore using={self.using!r} cache={self.cache_alias!r}>"

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
    ) -> MemoryRecord:
        """Write ``value`` as the next version of ``(session_id, key)``.

        ``expected_version=N`` writes only if the current version is N (0: the memory must not
        exist); otherwise :class:`VersionConflict` and nothing is written. A repeated call with
        the same ``idempotency_key`` returns the version the first call wrote and writes nothing.
        """
        session_id, key = self._check_ids(session_id, key)
        value = self._check_value(value)
        change = _Change(
            Op.WRITE,
            compute=lambda _current: value,
            ttl=validation.check_ttl(ttl),
            expected_version=self._check_expected(expected_version),
            **self._request(idempotency_key),
        )
        return self._write(session_id, {key: change})[key]

    def update(
        self,
        session_id: str,
        key: str,
        fn: Callable[[Any], Any],
        *,
        default: Any = None,
        ttl: float | timedelta | None = None,
    ) -> MemoryRecord:
        """Write ``fn(current value)`` (``fn(default)`` when the memory does not exist) under the
        row lock, so concurrent updates never lose each other. ``fn`` may run more than once if
        the database asks for a retry: keep it free of side effects."""
        session_id, key = self._check_ids(session_id, key)
        if not callable(fn):
            raise InvalidMemory("fn", f"must be callable, got {type(fn).__name__}")
        change = _Change(
            Op.WRITE,
            compute=lambda current: self._check_value(fn(current)),
            default=self._check_value(default),
            ttl=validation.check_ttl(ttl),
        )
        return self._write(session_id, {key: change})[key]

    def remember_many(
        self,
        session_id: str,
        items: Mapping[str, Any],
        *,
        ttl: float | timedelta | None = None,
    ) -> dict[str, MemoryRecord]:
        """Write several keys of one session in one transaction: all of them or none."""
        session_id = validation.check_session_id(session_id)
        if not isinstance(items, Mapping):
            raise InvalidMemory(
                "items", f"must be a mapping of key to value, got {type(items).__name__}"
            )
        ttl = validation.check_ttl(ttl)
        changes = {}
        for key, value in items.items():
            checked = self._check_value(value)
            changes[validation.check_key(key)] = _Change(
                Op.WRITE, compute=lambda _current, v=checked: v, ttl=ttl
            )
        return self._write(session_id, changes) if changes else {}

    def revert(
        self, session_id: str, key: str, version: int, *, expected_version: int | None = None
    ) -> MemoryRecord:
        """Write a NEW version holding the value that ``version`` held (history stays linear);
        with ``expected_version``, only if the memory is still at that version."""
        session_id, key = self._check_ids(session_id, key)
        version = validation.check_version("version", version, minimum=1)
        change = _Change(
            Op.REVERT,
            ttl=self._default_ttl,
            create=False,
            expected_version=self._check_expected(expected_version),
        )
        change.compute = lambda _current: self._value_of_version(session_id, key, version)
        return self._write(session_id, {key: change})[key]

    def forget(self, session_id: str, key: str, *, expected_version: int | None = None) -> bool:
        """Record a ``forget`` version; True if a live memory was forgotten."""
        session_id, key = self._check_ids(session_id, key)
        change = _Change(
            Op.FORGET, expected_version=self._check_expected(expected_version), create=False
        )
        return self._write(session_id, {key: change})[key] is not None

    def expire(self, session_id: str, key: str, *, expected_version: int | None = None) -> bool:
        """Expire the memory now, whatever its TTL: an ``expire`` version, as if its TTL had just
        passed. True if a live memory was expired."""
        session_id, key = self._check_ids(session_id, key)
        change = _Change(
            Op.EXPIRE,
            expected_version=self._check_expected(expected_version),
            create=False,
            due_only=False,
        )
        return self._write(session_id, {key: change})[key] is not None

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

    def erase_session(self, session_id: str) -> int:
        """Delete every row and every version of the session, irreversibly: for data-erasure
        requests and throw-away sessions (memcheck's). Returns the number of memories deleted."""
        session_id = validation.check_session_id(session_id)

        def erase(_retry: bool) -> int:
            connection = connections[self.using]
            keys = list(
                self._memories().filter(session_id=session_id).values_list("key", flat=True)
            )
            # Plain DELETE statements: nothing stored is read or decoded, so no value, however
            # it was written, can stop an erasure.
            with connection.cursor() as cursor:
                for statement in statements_for(connection).erase_session:
                    cursor.execute(statement, [session_id])
            if self.cache is not None and keys:
                cache = self.cache
                transaction.on_commit(lambda: cache.erased(session_id, keys), using=self.using)
            return len(keys)

        return self._transaction(erase)

    # ------------------------------------------------------------------ reads

    def recall(
        self, session_id: str, key: str, *, version: int | None = None
    ) -> MemoryRecord | None:
        """The live memory (or, with ``version=N``, that version as it was); None when it does not
        exist, was forgotten, or has expired."""
        session_id, key = self._check_ids(session_id, key)
        if version is not None:
            version = validation.check_version("version", version, minimum=1)
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
        rows = self._memories().filter(session_id=session_id, state=MemoryState.LIVE)
        if prefix is not None:
            prefix = validation.check_prefix(prefix)
            rows = rows.filter(prefix_filter(connections[self.using], "key", prefix))
        self._local.source = "database"
        return self._reading(lambda: self._recall_rows(session_id, rows, prefix))

    def _recall(self, session_id: str, keys: list[str]) -> dict[str, MemoryRecord]:
        """Validated ids in, live records out: Redis first when there is a cache tier."""
        # Inside the caller's transaction Redis is bypassed: it holds only committed versions
        # (the caller must read its own writes), and a fill from this transaction's view could
        # publish data that is later rolled back.
        if self.cache is not None and not connections[self.using].in_atomic_block:
            return self._reading(lambda: self._recall_cached(session_id, keys))
        self._local.source = "database"
        return self._reading(lambda: self._recall_keys(session_id, keys))

    def _recall_keys(self, session_id: str, keys: list[str]) -> dict[str, MemoryRecord]:
        now = clock.now()
        return {
            key: record
            for key, state, _version, record in self._load(session_id, keys)
            if state == MemoryState.LIVE and (record.expires_at is None or record.expires_at > now)
        }

    def _recall_rows(
        self, session_id: str, rows: Any, prefix: str | None
    ) -> dict[str, MemoryRecord]:
        now = clock.now()
        found = {}
        for key, value, version, created, updated, expires in rows.values_list(
            "key", "value", "version", "created_at", "updated_at", "expires_at"
        ):
            # The exact prefix test once more, whatever the database's collation.
            if (expires is None or expires > now) and (prefix is None or key.startswith(prefix)):
                found[key] = MemoryRecord(
                    session_id, key, value, version, created, updated, expires
                )
        return found

    def _recall_cached(self, session_id: str, keys: list[str]) -> dict[str, MemoryRecord]:
        """Redis first; the database for misses (filling Redis under the reader's lease) and
        for everything while Redis is untrusted or unreachable."""
        cache = self.cache
        assert cache is not None
        reads = cache.read(session_id, keys)
        # Another reader holds the fill lease of a hot key: wait (briefly, backing off) for its
        # fill rather than sending every concurrent miss to the database.
        deadline, pause = time.monotonic() + HOT_KEY_WAIT_SECONDS, 0.002
        while busy := [k for k, r in reads.items() if r.trusted and not r.hit and r.lease is None]:
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.025)
            reads.update(cache.read(session_id, busy))
        found = {k: r.record for k, r in reads.items() if r.hit and r.record is not None}
        missing = [k for k in keys if k not in reads or not reads[k].hit]
        self._local.source = "database" if missing else "cache"
        if not missing:
            return found
        now = clock.now()
        for key, state, version, record in self._load(session_id, missing):
            live = state == MemoryState.LIVE and (
                record.expires_at is None or record.expires_at > now
            )
            if live:
                found[key] = record
            lease = reads[key].lease if key in reads else None
            if lease:
                cache.fill(session_id, key, record if live else None, version, lease)
        untrusted = next((r for r in reads.values() if not r.trusted), None)
        if untrusted is not None:
            cache.renew_fence(untrusted.redis_ms)
        return found

    def _load(self, session_id: str, keys: list[str]) -> list[tuple[str, str, int, Any]]:
        """(key, state, version, record) of these keys whatever their state; a key with no
        row is version 0."""
        connection = connections[self.using]
        with connection.cursor() as cursor:
            cursor.execute(statements_for(connection).read_keys(len(keys)), [session_id, *keys])
            found = cursor.fetchall()
        rows = {
            key: (
                state,
                version,
                MemoryRecord(
                    session_id,
                    key,
                    decode_json(raw),
                    version,
                    to_datetime(created),
                    to_datetime(updated),
                    to_datetime(expires),
                ),
            )
            for key, state, raw, version, created, updated, expires in found
        }
        absent = (MemoryState.FORGOTTEN, 0, None)
        return [(key, *rows.get(key, absent)) for key in keys]

    def history(self, session_id: str, key: str) -> list[MemoryVersionRecord]:
        """Every version of ``(session_id, key)``, oldest first; [] if it never existed."""
        session_id, key = self._check_ids(session_id, key)
        rows = (
            MemoryVersion.objects.using(self.using)
            .filter(memory__session_id=session_id, memory__key=key)
            .order_by("version")
            .values_list("version", "op", "value", "created_at", "expires_at")
        )
        return self._reading(lambda: [MemoryVersionRecord(*row) for row in rows])

    # ------------------------------------------------------------------ async twins

    async def aremember(self, session_id: str, key: str, value: Any, **kwargs: Any) -> MemoryRecord:
        return await sync_to_async(self.remember)(session_id, key, value, **kwargs)

    async def aupdate(
        self, session_id: str, key: str, fn: Callable[[Any], Any], **kwargs: Any
    ) -> MemoryRecord:
        return await sync_to_async(self.update)(session_id, key, fn, **kwargs)

    async def aremember_many(
        self, session_id: str, items: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, MemoryRecord]:
        return await sync_to_async(self.remember_many)(session_id, items, **kwargs)

    async def arecall(self, session_id: str, key: str, **kwargs: Any) -> MemoryRecord | None:
        return await sync_to_async(self.recall)(session_id, key, **kwargs)

    async def arecall_many(
        self, session_id: str, keys: Iterable[str] | None = None, **kwargs: Any
    ) -> dict[str, MemoryRecord]:
        return await sync_to_async(self.recall_many)(session_id, keys, **kwargs)

    async def aforget(self, session_id: str, key: str, **kwargs: Any) -> bool:
        return await sync_to_async(self.forget)(session_id, key, **kwargs)

    async def ahistory(self, session_id: str, key: str) -> list[MemoryVersionRecord]:
        return await sync_to_async(self.history)(session_id, key)

    async def arevert(self, session_id: str, key: str, version: int, **kwargs: Any) -> MemoryRecord:
        return await sync_to_async(self.revert)(session_id, key, version, **kwargs)

    async def aexpire(self, session_id: str, key: str, **kwargs: Any) -> bool:
        return await sync_to_async(self.expire)(session_id, key, **kwargs)

    async def aforget_session(self, session_id: str) -> int:
        return await sync_to_async(self.forget_session)(session_id)

    # ------------------------------------------------------------------ the write path

    def _write(self, session_id: str, changes: dict[str, _Change]) -> dict[str, Any]:
        """Apply ``changes`` in one transaction, locking rows in sorted key order (so writers of
        overlapping key sets cannot deadlock each other), retried as a whole."""

        def attempt(retry: bool) -> dict[str, Any]:
            now = clock.now()
            updates: dict[str, tuple[MemoryRecord | None, int]] = {}
            results = {
                key: self._apply(session_id, key, changes[key], now, retry, updates)
                for key in sorted(changes)
            }
            if self.cache is not None and updates:
                # Only after the commit: a rolled-back attempt must leave Redis untouched.
                cache = self.cache
                transaction.on_commit(lambda: cache.written(session_id, updates), using=self.using)
            return results

        return self._transaction(attempt)

    def _apply(
        self,
        session_id: str,
        key: str,
        change: _Change,
        now: datetime,
        retry: bool,
        updates: dict[str, tuple[MemoryRecord | None, int]],
    ) -> Any:
        """Inside the transaction: lock the row, check, append one version, update the row.
        ``updates`` collects the key's new state for the cache tier."""
        row = self._lock_row(session_id, key, now, create=change.create)
        if row is None:  # forget/expire/revert of a memory that never existed
            if change.op == Op.REVERT:
                raise InvalidMemory(
                    "version", f"({session_id!r}, {key!r}) has no history to revert to"
                )
            self._check_cas(session_id, key, change, actual=0)
            return None
        if retry or change.caller_request_id:
            done = self._find_request(row, change.request_id)
            if done is not None:
                return done
        if row.state == MemoryState.LIVE and row.expires_at is not None and row.expires_at <= now:
            # Expiry is a version too: record it before anything else happens to the key.
            self._append(row, Op.EXPIRE, None, now, None, uuid.uuid4().hex)
            updates[key] = (None, row.version)
            if change.op == Op.EXPIRE:
                return True
        if change.op == Op.EXPIRE and change.due_only:
            return None  # rewritten with a new TTL since purge_expired looked
        live = row.state == MemoryState.LIVE
        self._check_cas(session_id, key, change, actual=row.version if live else 0)
        if change.op in (Op.FORGET, Op.EXPIRE):
            if not live:
                return None
            self._append(row, change.op, None, now, None, change.request_id)
            updates[key] = (None, row.version)
            return True
        value = change.compute(row.value if live else change.default)
        expires_at = self._expires_at(change, now)
        if not live:
            row.created_at = now
        self._append(row, change.op, value, now, expires_at, change.request_id)
        record = MemoryRecord(session_id, key, value, row.version, row.created_at, now, expires_at)
        updates[key] = (record, row.version)
        return record

    def _lock_row(
        self, session_id: str, key: str, now: datetime, *, create: bool
    ) -> LockedRow | None:
        connection = connections[self.using]
        lock = self._lock_statement(statements_for(connection))
        with connection.cursor() as cursor:
            cursor.execute(lock, [session_id, key])
            found = cursor.fetchone()
            if found is None and create:
                # Insert-if-missing, then lock: two writers racing to create a key never make
                # two rows, and neither sees an IntegrityError. The placeholder (version 0, not
                # live) is overwritten below in the same transaction, or rolled back with it.
                self._insert_placeholder(session_id, key, now)
                cursor.execute(lock, [session_id, key])
                found = cursor.fetchone()
        if found is None:
            return None
        row_id, session_id, key, version, state, raw, created, expires = found
        return LockedRow(
            row_id, session_id, key, version, state, raw, to_datetime(created), to_datetime(expires)
        )

    def _insert_placeholder(self, session_id: str, key: str, now: datetime) -> None:
        """Insert-if-missing a version-0 row that is not live: the row the write then locks and
        overwrites."""
        values = {
            "session_id": session_id,
            "key": key,
            "version": 0,
            "state": MemoryState.FORGOTTEN,
            "created_at": now,
            "updated_at": now,
        }
        insert_if_missing(connections[self.using], Memory, values)

    def _lock_statement(self, statements: Statements) -> str:
        """The statement a write reads its row with: ``SELECT ... FOR UPDATE`` (plain on SQLite,
        whose ``BEGIN IMMEDIATE`` already serializes writers)."""
        return statements.lock

    def _append(
        self,
        row: LockedRow,
        op: str,
        value: Any,
        now: datetime,
        expires_at: datetime | None,
        request_id: str,
    ) -> None:
        """Append version ``row.version + 1`` and make the live row match it."""
        row.version += 1
        row.value = value
        row.state = {Op.FORGET: MemoryState.FORGOTTEN, Op.EXPIRE: MemoryState.EXPIRED}.get(
            op, MemoryState.LIVE
        )
        row.expires_at = expires_at
        connection = connections[self.using]
        statements, adapt = statements_for(connection), connection.ops.adapt_datetimefield_value
        text, at, until = encode_json(value), adapt(now), adapt(expires_at)
        with connection.cursor() as cursor:
            cursor.execute(
                statements.update_row,
                [row.version, text, row.state, adapt(row.created_at), at, until, row.id],
            )
            cursor.execute(
                statements.insert_version, [row.id, row.version, op, text, at, until, request_id]
            )

    def _find_request(self, row: LockedRow | Memory, request_id: str) -> Any:
        """The result of an earlier attempt or call with the same request id, if it committed."""
        done = (
            MemoryVersion.objects.using(self.using)
            .filter(memory_id=row.id, request_id=request_id)
            .first()
        )
        if done is None:
            return None
        if done.op in (Op.FORGET, Op.EXPIRE):
            return True
        return MemoryRecord(
            row.session_id,
            row.key,
            done.value,
            done.version,
            row.created_at,
            done.created_at,
            done.expires_at,
        )

    def _expires_at(self, change: _Change, now: datetime) -> datetime | None:
        ttl = change.ttl if change.ttl is not None else self._default_ttl
        return None if ttl is None else now + ttl

    def _check_cas(self, session_id: str, key: str, change: _Change, *, actual: int) -> None:
        if change.expected_version is not None and change.expected_version != actual:
            raise VersionConflict(session_id, key, expected=change.expected_version, actual=actual)

    def _expire_or_forget(self, session_id: str, key: str, op: str) -> bool:
        return bool(self._write(session_id, {key: _Change(op, create=False)})[key])

    def _value_of_version(self, session_id: str, key: str, version: int) -> Any:
        old = (
            MemoryVersion.objects.using(self.using)
            .filter(memory__session_id=session_id, memory__key=key, version=version)
            .values_list("op", "value")
            .first()
        )
        if old is None:
            raise InvalidMemory("version", f"({session_id!r}, {key!r}) has no version {version}")
        if old[0] not in (Op.WRITE, Op.REVERT):
            raise InvalidMemory(
                "version", f"version {version} is a {old[0]}; it holds no value to revert to"
            )
        return old[1]

    def _transaction(self, work: Callable[[bool], T]) -> T:
        """Run ``work(retry)`` in ``transaction.atomic``, retrying the whole transaction on transient
        errors. Inside a caller's own transaction nothing can be retried (the server rolled the
        whole transaction back), so the error propagates for the caller to retry."""

        def attempt(retry: bool) -> T:
            with transaction.atomic(using=self.using):
                return work(retry)

        return self._retrying(attempt)

    def _reading(self, work: Callable[[], T]) -> T:
        """Run a read, retried like a write when its connection drops or a lock times out (a
        connection killed between two calls fails the next one, whichever it is)."""
        return self._retrying(lambda _retry: work())

    def _retrying(self, attempt: Callable[[bool], T]) -> T:
        connection = connections[self.using]
        if connection.in_atomic_block:
            return attempt(False)
        retry = get_config()["RETRY"]
        attempts = retry["ATTEMPTS"]
        error: BaseException | None = None
        for number in range(attempts):
            if number:
                ceiling = min(retry["MAX_DELAY"], retry["BASE_DELAY"] * 2**number)
                time.sleep(random.uniform(0, ceiling))
            try:
                return attempt(number > 0)
            except DatabaseError as exc:
                kind = classify(exc)
                if kind is None:
                    raise
                with self._retries_lock:
                    self.retries[kind.value] += 1
                error = exc
                if kind is Transient.DISCONNECT:
                    connection.close()
        raise MemoryUnavailable(
            f"database {self.using!r} still failing after {attempts} attempts: {error}",
            cause=error,
            attempts=attempts,
        ) from error

    # ------------------------------------------------------------------ helpers

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
        return json.loads(validation.encode_value(value, self._max_value_bytes))

    def _check_expected(self, expected_version: Any) -> int | None:
        if expected_version is None:
            return None
        return validation.check_version("expected_version", expected_version, minimum=0)

    def _request(self, idempotency_key: str | None) -> dict[str, Any]:
        """The caller's idempotency key as the change's request id (otherwise ``_Change``
        generates one)."""
        if idempotency_key is None:
            return {}
        return {
            "request_id": "k:" + validation.check_idempotency_key(idempotency_key),
            "caller_request_id": True,
        }
