"""The one write path: every change to a memory goes through :meth:`WritePath.write`.

It takes the row lock of each key (insert-if-missing, then ``SELECT ... FOR UPDATE``; SQLite's
``BEGIN IMMEDIATE`` serializes writers), records a due expiry as a version first, checks the
expected version, appends exactly one history version and makes the live row match it, and
schedules the cache tier's update for after the commit -- all in one transaction, retried as a
whole by :class:`~agentmemory.retries.Retrier`. ``remember``, ``update``, ``revert``, ``forget``,
``expire``, ``purge_expired``, the admin and the LangGraph adapter all come here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from . import clock, signals, validation
from .cache import MemoryCache
from .conf import get_config
from .defects import (
    FAST_PATH_DEFECTS,
    Defect,
    Defects,
    failpoint_after_commit,
    failpoint_after_first_key,
    failpoint_autocommit_answer,
    failpoint_before_commit,
)
from .defects import NONE as NO_DEFECTS
from .errors import (
    IdempotencyKeyReused,
    InvalidMemory,
    ReentrantWrite,
    SessionMoved,
    VersionConflict,
)
from .models import Memory, MemoryState, MemoryVersion, Op, PendingInvalidation, is_live
from .records import VALUE_OPS, MemoryRecord
from .retries import Retrier
from .semantic import named
from .sql import (
    LockedRow,
    decode_json,
    delete_locked,
    encode_json,
    lock_for_delete,
    locked_row,
    run,
    statements_for,
    to_datetime,
)
from .vendors import (
    begin_durable,
    check_fits,
    locked_or_created,
    raises_synchronous_commit,
)

#: With ``row_lock=False``: seconds between the unlocked read and the write (the gap an agent's
#: own work, an LLM call, would leave).
UNLOCKED_GAP_SECONDS = 0.002


@dataclass(frozen=True, slots=True)
class Committed:
    """A version as :meth:`WritePath._find_request` finds it: what a request committed."""

    op: str
    value: Any
    version: int
    created_at: datetime | None
    expires_at: datetime | None


@dataclass
class Change:
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
    # A write whose value is known up front (remember, remember_many): it may take the one-
    # statement path (WritePath._blind_write).
    blind: bool = False
    # Semantic index (agentmemory.semantic): the value's vectors, computed before the lock when
    # the value is known up front (bytes, or None: nothing to index); or ``embed``, called under
    # the lock on the value ``compute`` returned (update, revert). Neither: not indexed.
    vector: bytes | None = None
    embed: Callable[[Any], bytes | None] | None = None


class WritePath:
    """Writes of one store: its database alias, its cache tier (or None) and its retries.

    ``row_lock=False`` is the declared unsafe seam: each write checks its expected version and
    computes its value from a read made *before* it takes the row lock -- the read-then-write
    race the lock exists to prevent. Versions stay gap-free (they are still counted under the
    lock), but values computed from stale reads overwrite newer ones. For ``memcheck --unsafe``
    and the tests that show the checker catches it; never for real data.
    """

    def __init__(
        self,
        using: str,
        cache: MemoryCache | None,
        retrier: Retrier,
        *,
        row_lock: bool = True,
        defects: Defects = NO_DEFECTS,
    ) -> None:
        self.using = using
        self.cache = cache
        self.retrier = retrier
        self.row_lock = row_lock
        #: Planted bugs (:mod:`agentmemory.defects`), for memcheck's self-test only.
        self.defects = defects

    def write(self, session_id: str, changes: dict[str, Change]) -> dict[str, Any]:
        """Apply ``changes`` in one transaction, locking rows in sorted key order (so writers of
        overlapping key sets cannot deadlock each other), retried as a whole. Returns, per key,
        the new :class:`MemoryRecord` (writes), True (retired), or None (nothing to do).
        Raises :class:`ReentrantWrite` when called from inside another write of this database
        on this thread (an ``update``'s ``fn``), before any statement."""
        with self._only_write():
            results = self._write_all(session_id, changes)
        self._notify(session_id, changes, results)
        return results

    def _notify(self, session_id: str, changes: dict[str, Change], results: dict[str, Any]) -> None:
        """The signals of what was written, sent once it is committed (agentmemory.signals)."""
        for key, result in results.items():
            op = changes[key].op
            if not result:
                continue
            if op in VALUE_OPS:
                if not result.replayed:
                    signals.after_commit(signals.memory_written, self.using, record=result)
            elif op == Op.FORGET:
                signals.after_commit(
                    signals.memory_forgotten, self.using, session_id=session_id, key=key
                )
            elif op == Op.EXPIRE:
                signals.after_commit(
                    signals.memory_expired, self.using, session_id=session_id, key=key
                )

    @contextlib.contextmanager
    def _only_write(self) -> Iterator[None]:
        """One write of a database at a time on a thread: a write started under another's row
        lock (from ``fn``) would run in its transaction, where nothing can be retried, and
        collide with its rows (the inner version is the outer's next one)."""
        with one_write_at_a_time(self.using):
            yield

    def erase(self, session_id: str) -> int:
        """Delete every row and version of the session (plain DELETE statements: nothing stored
        is read or decoded, so no value, however it was written, can stop an erasure), and the
        Redis entries of its keys after the commit. Returns the number of memories deleted."""

        # Every key any attempt saw: an attempt whose COMMIT landed but whose answer was lost
        # (a node killed) left its Redis entries; the retry finds no rows, and must drop them.
        seen: set[str] = set()

        def attempt(_retry: bool) -> int:
            connection = connections[self.using]
            rows = Memory.objects.using(self.using).filter(session_id=session_id)
            # In key order, as writers of several keys lock them: no deadlock between the two.
            locked = lock_for_delete(connection, rows.order_by("key").values_list("id", "key"))
            seen.update(key for _id, key in locked)
            delete_locked(connection, [(MemoryVersion, "memory")], [id_ for id_, _key in locked])
            if self.cache is not None and seen and Defect.ERASE_LEAVES_CACHE not in self.defects:
                cache, dropped = self.cache, sorted(seen)
                transaction.on_commit(lambda: cache.erased(session_id, dropped), using=self.using)
            # An attempt that finds nothing after one whose answer was lost: what that one deleted.
            return len(seen)

        with self._only_write():
            return self.retrier.atomic(attempt, sessions=(session_id,))

    def retire(self, session_id: str, key: str, op: str) -> bool:
        """A ``forget`` or due ``expire`` version of one key (``forget_session``,
        ``purge_expired``); True if a live memory was retired."""
        return bool(self.write(session_id, {key: Change(op, create=False)})[key])

    def reindex(self, memory_id: int, version: int, vector: bytes | None) -> bool:
        """New vectors for the live row's value, in place, if the row is still live at
        ``version``: one conditional UPDATE, which takes the row lock itself, so a write made
        since (it indexed its own value) is never overwritten. No new version: the value did
        not change, only how it is indexed. True if it was stored."""

        def attempt(_retry: bool) -> bool:
            updated = (
                Memory.objects.using(self.using)
                .filter(id=memory_id, version=version, state=MemoryState.LIVE)
                .update(embedding=vector, embedding_key=named(vector))
            )
            return updated == 1

        def gated(retry: bool) -> bool:
            # A shard's: the memory's session's gate first, so that new vectors never land on a
            # session while it is copied (the move's comparison would fail); one that moved away
            # meanwhile has no row here any more, and nothing is updated.
            rows = Memory.objects.using(self.using).filter(id=memory_id)
            self.retrier.pass_gates(
                connections[self.using], rows.values_list("session_id", flat=True)
            )
            return attempt(retry)

        with self._only_write():
            if not self.retrier.gated:
                return self.retrier.run(attempt)
            try:
                return self.retrier.atomic(gated)
            except SessionMoved:
                return False  # moved away meanwhile: its new shard's reindex indexes it

    def _write_all(self, session_id: str, changes: dict[str, Change]) -> dict[str, Any]:
        if len(changes) > 1 and Defect.NON_ATOMIC_MANY in self.defects:
            results: dict[str, Any] = {}
            for key in sorted(changes):
                if results:
                    failpoint_after_first_key()
                results.update(self._write(session_id, {key: changes[key]}))
            return results
        return self._write(session_id, changes)

    def _write(self, session_id: str, changes: dict[str, Change]) -> dict[str, Any]:
        if self._autocommit_blind(changes):
            one = functools.partial(self._one_statement, session_id, changes)
            if not self.retrier.gated:
                return self.retrier.run(one)
            # A shard's: the gate passed in the statement itself (migration 0016).
            from . import moves

            tried = False

            def attempt(retry: bool) -> Any:
                nonlocal tried
                retry, tried = retry or tried, tried or retry
                return one(retry)

            return moves.through_gates(
                lambda: self.retrier.run(attempt), self.using, lambda: tried, False
            )
        return self._locked_write(session_id, changes)

    def _autocommit_blind(self, changes: dict[str, Change]) -> bool:
        """A single blind write on PostgreSQL without a cache tier, outside any transaction: the
        one-statement write in autocommit, one round trip. (With Redis, the tombstone must go in
        between the statement and its COMMIT, so that path keeps its transaction.)"""
        if self.cache is not None or len(changes) != 1:
            return False
        change = next(iter(changes.values()))
        if not change.blind or change.caller_request_id or not self._fast:
            return False
        if self.retrier.gated and change.expected_version is not None:
            return False  # a shard's gate goes in one statement with the upsert function only
        connection = connections[self.using]
        return connection.vendor == "postgresql" and not connection.in_atomic_block

    def _one_statement(self, session_id: str, changes: dict[str, Change], retry: bool) -> Any:
        """The autocommit attempt: the statement commits by itself. A retry (its answer may have
        been lost after it committed) and anything it does not apply to go the locked way, which
        looks the request id up first."""
        connection = connections[self.using]
        connection.ensure_connection()
        # A session whose synchronous_commit is off or local: the transaction's SET LOCAL.
        gated = self.retrier.gated
        if not retry and not raises_synchronous_commit(connection):
            ((key, change),) = changes.items()
            if gated:
                from .moves import gate_raised

                with gate_raised([session_id]):
                    record = self._blind_write(session_id, key, change, clock.now(), gate=True)
            else:
                record = self._blind_write(session_id, key, change, clock.now())
            if record is not None:
                failpoint_autocommit_answer()
                return {key: record}
            # It did not apply (a passed TTL, a version that does not match, a new key with an
            # expected version): the locked attempt must not run the same statement again.
            changes = {key: dataclasses.replace(change, blind=False)}
        with transaction.atomic(using=self.using):
            begin_durable(connection)
            if gated:
                from .moves import pass_gate

                pass_gate(connection, [session_id])
            return self._locked_attempt(session_id, changes, None)(retry)

    def _locked_write(self, session_id: str, changes: dict[str, Change]) -> dict[str, Any]:
        observed = None if self.row_lock else self._observe(session_id, sorted(changes))
        return self.retrier.atomic(
            self._locked_attempt(session_id, changes, observed), sessions=(session_id,)
        )

    def _locked_attempt(
        self, session_id: str, changes: dict[str, Change], observed: Any
    ) -> Callable[[bool], dict[str, Any]]:
        """One attempt of the locked path, to run inside ``transaction.atomic``."""

        def attempt(retry: bool) -> dict[str, Any]:
            now = clock.now()
            updates: dict[str, tuple[MemoryRecord | None, int] | None] = {}
            results = {}
            for key in sorted(changes):
                if results:
                    failpoint_after_first_key()
                basis = observed[key] if observed is not None else _LOCKED
                results[key] = self._apply(
                    session_id, key, changes[key], now, retry, updates, basis
                )
            lost = Defect.LOST_CACHE_UPDATE in self.defects
            if self.cache is not None and updates and not lost:
                cache = self.cache
                committing = {k: u[1] for k, u in updates.items() if u is not None}
                if committing and not cache.writing(session_id, committing):
                    # Redis cannot take the tombstones: the keys are recorded as pending in this
                    # very transaction, so even a writer that dies after COMMIT leaves them.
                    PendingInvalidation.record(self.using, session_id, committing)
                failpoint_before_commit(session_id, committing)
                # The update only after the commit: a rolled-back attempt leaves at most
                # tombstones (misses), never a version that was not committed.
                transaction.on_commit(
                    lambda: (failpoint_after_commit(), cache.written(session_id, updates)),
                    using=self.using,
                )
            return results

        return attempt

    def _apply(
        self,
        session_id: str,
        key: str,
        change: Change,
        now: datetime,
        retry: bool,
        updates: dict[str, tuple[MemoryRecord | None, int] | None],
        basis: Any,
    ) -> Any:
        """Inside the transaction: lock the row, check, append one version, update the row.
        ``updates`` collects the key's new state for the cache tier. ``basis`` is the row as the
        unsafe seam read it before the lock, or ``_LOCKED``: the locked row itself."""
        if change.blind and not retry and not change.caller_request_id and self._fast:
            record = self._blind_write(session_id, key, change, now)
            if record is not None:
                updates[key] = (record, record.version)
                return record
        # A key created under the caller's idempotency key (expected_version=0): a new row
        # holds no earlier request, so only a key that has a row needs the look-up below.
        if change.blind and change.expected_version == 0 and not retry and self._fast:
            record = self._create_write(session_id, key, change, now)
            if record is not None:
                updates[key] = (record, record.version)
                return record
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
                if change.caller_request_id:
                    _check_same_request(change, done)
                # Its COMMIT may have been answered locally only (a cancelled wait for the
                # synchronous standby). This transaction's row lock gives it a transaction id,
                # so its COMMIT waits for the standby too, or fails the same way.
                if retry:
                    # An earlier attempt committed, and its cache update died with the lost
                    # acknowledgement: drop the entry after this commit, or readers keep the
                    # version before it.
                    updates[key] = None
                # Found on the first attempt: an earlier call wrote it (a replay). On a retry,
                # the likeliest writer is this call's own lost attempt.
                return self._answer(row, done, replayed=not retry)
        if row.state == MemoryState.LIVE and not is_live(row.state, row.expires_at, now):
            # Expiry is a version too: record it before anything else happens to the key.
            self._append(row, Op.EXPIRE, None, now, None, uuid.uuid4().hex)
            updates[key] = (None, row.version)
            if change.op == Op.EXPIRE:
                return True
        if change.op == Op.EXPIRE and change.due_only:
            return None  # rewritten with a new TTL since purge_expired looked
        live = row.state == MemoryState.LIVE
        seen = row if basis is _LOCKED else basis
        seen_live = seen is not None and is_live(seen.state, seen.expires_at, now)
        self._check_cas(session_id, key, change, actual=seen.version if seen_live else 0)
        if change.op in (Op.FORGET, Op.EXPIRE):
            if not live:
                return None
            self._append(row, change.op, None, now, None, change.request_id)
            updates[key] = (None, row.version)
            return True
        assert change.compute is not None
        value = change.compute(seen.value if seen_live else change.default)
        expires_at = _expires_at(change, now)
        if Defect.TTL_KEPT_ON_OVERWRITE in self.defects and change.ttl is None and live:
            expires_at = row.expires_at
        if not live:
            row.created_at = now
        vector = change.vector if change.embed is None else change.embed(value)
        if Defect.STALE_VECTOR in self.defects and live and change.embed is not None:
            vector = change.embed(row.value)  # the vector of the version before this one
        self._append(row, change.op, value, now, expires_at, change.request_id, vector)
        record = MemoryRecord(session_id, key, value, row.version, row.created_at, now, expires_at)
        updates[key] = (record, row.version)
        return record

    @functools.cached_property
    def _fast(self) -> bool:
        """Whether blind writes may take the one-statement path here: a database that returns
        what it updated (PostgreSQL, SQLite), the row lock on, no planted defect. It depends on
        the alias's vendor only, so it is worked out once per store."""
        if not self.row_lock or not self.defects <= FAST_PATH_DEFECTS:
            return False
        return statements_for(connections[self.using]).blind_write is not None

    def _blind_write(
        self, session_id: str, key: str, change: Change, now: datetime, *, gate: bool = False
    ) -> MemoryRecord | None:
        """A write of a value known up front, as one UPDATE that takes the row lock, counts the
        version and returns it (PostgreSQL: with the history insert in the same statement, and
        without expected_version as an upsert, so a new key is one statement too; SQLite: then
        the insert); with expected_version=0, :meth:`_create_write`. None when it does not
        apply -- no row yet (SQLite, or an expected_version), a TTL that has passed (its expiry
        must become a version first), a version that does not match, a row where
        expected_version=0 wants none -- and nothing was changed: the locked path takes over,
        in the same transaction."""
        if change.expected_version == 0:
            return self._create_write(session_id, key, change, now)
        assert change.compute is not None
        connection = connections[self.using]
        statements = statements_for(connection)
        adapt = connection.ops.adapt_datetimefield_value
        value = change.compute(None)
        expires_at = _expires_at(change, now)
        text, at, until = encode_json(value), adapt(now), adapt(expires_at)
        vector = change.vector
        sql, params, then_history = statements.blind(
            session_id,
            key,
            text,
            at,
            until,
            vector,
            named(vector),
            change.expected_version,
            change.request_id,
        )
        if Defect.UPSERT_SKIPS_HISTORY in self.defects:
            # The declared seam of the function itself: its broken copy (migration 0010).
            sql = sql.replace("agentmemory_upsert(", "agentmemory_upsert_selftest_skips_history(")
        elif gate:
            # A shard's write in autocommit: the session's gate first, in the same statement
            # (migration 0016; only the upsert function takes it, see _autocommit_blind).
            from .moves import lock_key

            assert "agentmemory_upsert(" in sql
            sql = sql.replace("agentmemory_upsert(", "agentmemory_upsert_gated(%s, ")
            params = [lock_key(session_id), *params]
        found = run(connection, sql, params)
        history = (text, at, until, change.request_id, vector) if then_history else None
        return _one_row_written(connection, found, history, session_id, key, value, now, expires_at)

    def _create_write(
        self, session_id: str, key: str, change: Change, now: datetime
    ) -> MemoryRecord | None:
        """A write with ``expected_version=0`` of a key that has no row: the row inserted at
        version 1 with its history version, one statement (PostgreSQL; SQLite: then the history
        insert). A new row holds no earlier request, so a caller's idempotency key needs no
        look-up. None when the key has a row -- live (a conflict), forgotten or expired (a key
        coming back), or written under this idempotency key before (a replay) -- and nothing
        was changed: the locked path decides, in the same transaction."""
        connection = connections[self.using]
        statements = statements_for(connection)
        assert statements.create_write is not None and change.compute is not None
        adapt = connection.ops.adapt_datetimefield_value
        value = change.compute(change.default)
        expires_at = _expires_at(change, now)
        vector = change.vector if change.embed is None else change.embed(value)
        text, at, until = encode_json(value), adapt(now), adapt(expires_at)
        params = [session_id, key, text, at, at, until, vector, named(vector)]
        if statements.history_in_statement:
            params += [text, at, until, change.request_id, vector]
        found = run(connection, statements.create_write, params)
        history = (
            None
            if statements.history_in_statement
            else (text, at, until, change.request_id, vector)
        )
        return _one_row_written(connection, found, history, session_id, key, value, now, expires_at)

    def _observe(self, session_id: str, keys: list[str]) -> dict[str, LockedRow | None]:
        """The unsafe seam's read: each row as it is now, without a lock, outside the
        transaction; then the gap before the write."""
        found = {key: self._select(session_id, key, lock=False) for key in keys}
        time.sleep(UNLOCKED_GAP_SECONDS)
        return found

    def _lock_row(
        self, session_id: str, key: str, now: datetime, *, create: bool
    ) -> LockedRow | None:
        if not create:
            return self._select(session_id, key, lock=True)
        # Insert-if-missing, then lock: two writers racing to create a key never make two
        # rows, and neither sees an IntegrityError. The placeholder (version 0, not live) is
        # overwritten below in the same transaction, or rolled back with it.
        values = {
            "session_id": session_id,
            "key": key,
            "version": 0,
            "history_from": 1,
            "state": MemoryState.FORGOTTEN,
            "created_at": now,
            "updated_at": now,
        }
        connection, statements = connections[self.using], statements_for(connections[self.using])
        found = locked_or_created(
            connection, Memory, values, lambda: run(connection, statements.lock, [session_id, key])
        )
        return locked_row(found[0])

    def _select(self, session_id: str, key: str, *, lock: bool) -> LockedRow | None:
        connection = connections[self.using]
        statements = statements_for(connection)
        found = run(connection, statements.lock if lock else statements.read_row, [session_id, key])
        return locked_row(found[0]) if found else None

    def _append(
        self,
        row: LockedRow,
        op: str,
        value: Any,
        now: datetime,
        expires_at: datetime | None,
        request_id: str,
        vector: bytes | None = None,
    ) -> None:
        """Append version ``row.version + 1`` and make the live row match it (its vectors too:
        ``vector``, None for a version that is not indexed)."""
        row.version += 2 if row.version == 2 and Defect.SKIPPED_VERSION in self.defects else 1
        row.value = value
        row.state = {Op.FORGET: MemoryState.FORGOTTEN, Op.EXPIRE: MemoryState.EXPIRED}.get(
            op, MemoryState.LIVE
        )
        row.expires_at = expires_at
        connection = connections[self.using]
        statements, adapt = statements_for(connection), connection.ops.adapt_datetimefield_value
        text, at, until = encode_json(value), adapt(now), adapt(expires_at)
        check_fits(connection, "value", text)
        created = adapt(row.created_at)
        for sql, params in statements.appended(
            row, op, text, at, until, created, request_id, vector, named(vector)
        ):
            run(connection, sql, params)

    def _find_request(self, row: LockedRow, request_id: str) -> Committed | None:
        """The version an earlier attempt or call with the same request id committed, if any
        (one hand-written statement: the ORM's query building cost more than the query)."""
        connection = connections[self.using]
        found = run(connection, statements_for(connection).find_request, [row.id, request_id])
        if not found:
            return None
        ((op, value, version, created_at, expires_at),) = found
        return Committed(
            op, decode_json(value), version, to_datetime(created_at), to_datetime(expires_at)
        )

    @staticmethod
    def _answer(row: LockedRow, done: Committed, *, replayed: bool) -> Any:
        """What the call that committed ``done`` returned: its record, or True (retired)."""
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
            replayed=replayed,
        )

    def _check_cas(self, session_id: str, key: str, change: Change, *, actual: int) -> None:
        spurious = Defect.SPURIOUS_CAS_CONFLICT in self.defects and actual > 0
        if change.expected_version is not None and (change.expected_version != actual or spurious):
            raise VersionConflict(session_id, key, expected=change.expected_version, actual=actual)

    # ------------------------------------------------------------------ retention

    def prune(
        self, memory_id: int, keep_last: int | None, keep_days: float | None, *, dry_run: bool
    ) -> int:
        """Under the memory's row lock, delete the versions that neither rule keeps -- never the
        newest -- and raise ``history_from`` past them. Returns how many versions go (or would
        go, with ``dry_run``). Writers of that memory wait for the lock a moment; others never."""

        def attempt(_retry: bool) -> int:
            connection = connections[self.using]
            with connection.cursor() as cursor:
                cursor.execute(statements_for(connection).lock_by_id, [memory_id])
                found = cursor.fetchone()
            if found is None or not found[0]:  # gone, or a placeholder (version 0)
                return 0
            newest, kept_from = found
            cutoff = newest
            if keep_last is not None:
                cutoff = min(cutoff, newest - keep_last + 1)
            if keep_days is not None:
                since = clock.now() - timedelta(days=keep_days)
                young = (
                    MemoryVersion.objects.using(self.using)
                    .filter(memory_id=memory_id, version__gte=kept_from, created_at__gte=since)
                    .order_by("version")
                    .values_list("version", flat=True)
                    .first()
                )
                by_age = newest if young is None else young
                # Kept if either rule keeps it: the lower of the two cutoffs.
                cutoff = by_age if keep_last is None else min(cutoff, by_age)
            if cutoff <= kept_from:
                return 0
            doomed = MemoryVersion.objects.using(self.using).filter(
                memory_id=memory_id, version__lt=cutoff
            )
            if dry_run:
                return doomed.count()
            pruned = doomed.delete()[0]
            Memory.objects.using(self.using).filter(id=memory_id).update(history_from=cutoff)
            return pruned

        with self._only_write():
            return self.retrier.atomic(attempt)


def _one_row_written(
    connection: Any,
    found: list[tuple[Any, ...]],
    history: tuple[Any, ...] | None,
    session_id: str,
    key: str,
    value: Any,
    now: datetime,
    expires_at: datetime | None,
) -> MemoryRecord | None:
    """The record of a one-statement write (``_blind_write``, ``_create_write``) from the row it
    returned, its history version inserted first when the statement did not (``history``: that
    version's value text, time, expiry, request id and vector); None when it returned none."""
    if not found:
        return None
    ((row_id, version, created),) = found
    if history is not None:
        text, at, until, request_id, vector = history
        run(
            connection,
            statements_for(connection).insert_version,
            [row_id, version, Op.WRITE, text, at, until, request_id, vector],
        )
    created_at = to_datetime(created)
    assert created_at is not None
    return MemoryRecord(session_id, key, value, version, created_at, now, expires_at)


def _check_same_request(change: Change, done: Any) -> None:
    """Raise :class:`IdempotencyKeyReused` unless ``change`` is the request that committed
    ``done`` under the caller's idempotency key: the same operation and, for a value known up
    front, the same JSON value. Before anything is written."""
    key = change.request_id.removeprefix("k:")
    if done.op in (Op.FORGET, Op.EXPIRE):
        if change.op != done.op:
            raise IdempotencyKeyReused(key, f"a {done.op}, version {done.version}", change.op)
        return
    if change.op not in (Op.WRITE, Op.REVERT):
        raise IdempotencyKeyReused(key, f"a write, version {done.version}", f"a {change.op}")
    if change.blind and change.compute is not None:
        value = change.compute(None)
        if not validation.same_json(value, done.value):
            raise IdempotencyKeyReused(
                key,
                f"version {done.version} = {validation.short_repr(done.value)}",
                f"a write of {validation.short_repr(value)}",
            )


_LOCKED: Any = object()
#: The database aliases this thread is writing to now (``WritePath._only_write``).
_writing = threading.local()


@contextlib.contextmanager
def one_write_at_a_time(using: str) -> Iterator[None]:
    """Raise :class:`ReentrantWrite` if this thread is already writing to ``using`` (a write
    from inside an ``update``'s ``fn``, of a memory or a log), before any statement."""
    writing = _writing.__dict__.setdefault("aliases", set())
    if using in writing:
        raise ReentrantWrite(using)
    writing.add(using)
    try:
        yield
    finally:
        writing.discard(using)


def default_ttl() -> timedelta | None:
    """``AGENTMEMORY["DEFAULT_TTL"]`` as a timedelta (None: never), read at each use."""
    return validation.check_ttl(get_config()["DEFAULT_TTL"])


def _expires_at(change: Change, now: datetime) -> datetime | None:
    ttl = change.ttl if change.ttl is not None else default_ttl()
    return None if ttl is None else now + ttl
