"""Logs: per ``(session_id, stream)`` an append-only sequence of JSON items numbered 1, 2, 3, ...
with no gap and no reuse -- a conversation's turns, an agent's events.

A log is another kind of versioned row, on the machinery of memories: its head
(:class:`~agentmemory.models.Log`) is what every mutation locks (insert-if-missing, then
``SELECT ... FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE``), and every mutation is one event of the
log's history, numbered as a memory's versions are, with a request id that a retry looks up --
so an append, a pop or a clear whose acknowledgement was lost is never done twice. The same
retry policy (:class:`~agentmemory.retries.Retrier`) runs each mutation as one transaction, and
no two writes of a database run nested on one thread.

What each costs does not depend on the log's length: an append inserts its items and one event
and updates the head; a clear or an expiry moves the head's ``cleared_through`` bound; a pop
marks one item; a read is one statement on the ``(log, seq)`` index (keyset pages).

Reads are answered by the database alone, in one statement each (a consistent view of the head
and the items together): the Redis tier does not serve logs.
"""

from __future__ import annotations

import functools
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Q

from . import clock, signals, sql, validation
from .defects import NONE as NO_DEFECTS
from .defects import Defect, Defects, failpoint_after_first_key
from .errors import IdempotencyKeyReused
from .models import Log, LogEvent, LogItem
from .records import LogEventRecord, LogItemRecord, LogOp
from .retries import Retrier
from .validation import same_json
from .vendors import json_placeholder, locked_or_created, statement_batches
from .writes import default_ttl, one_write_at_a_time

#: The names of the ``(log, seq)`` unique index (the constraint's) and of the live items' index.
ONE_ITEM_PER_SEQ = "agentmemory_one_item_per_seq"
LIVE_ITEMS = "agentmemory_live_items_idx"
#: The unsafe seam's gap between a pop's unlocked read and its write: a worker takes a task off a
#: queue, works on it, then claims it (as ``checkpoints.UNLOCKED_GAP_SECONDS``). At a memory
#: write's 2 ms, single 600-call self-test runs caught the unlocked pop in 6 of 10 (CI's PostgreSQL
#: HA run missed it three runs in a row); at 0.05 s, 9 of 12; at 0.2 s, 40 of 40, and 14 of 15
#: with both cores of this machine kept busy by other processes.
UNLOCKED_POP_GAP_SECONDS = 0.2


class LogPath:
    """Mutations and reads of the logs of one database alias, with its retries.

    ``row_lock=False`` is the store's declared unsafe seam here too: a pop picks its item from
    a read made *before* it takes the lock (then the gap an agent's own work would leave), and
    an append numbers its items from such a read -- two pops can return the same item, and two
    appends collide on a number (the ``(log, seq)`` constraint refuses the second); a rewrite
    (``rewrite_log``, ``append_with``) computes its items from such a read -- what was appended
    meanwhile is lost by a replacement and repeated by an append. Events are
    still counted under the lock, as a memory's versions are. For the
    tests and memcheck that show those checks catch it; never for real data. ``defects``: the
    planted bugs of :mod:`agentmemory.defects` that live here (memcheck's self-test only)."""

    def __init__(
        self,
        using: str,
        retrier: Retrier,
        *,
        row_lock: bool = True,
        defects: Defects = NO_DEFECTS,
    ) -> None:
        self.using = using
        self.retrier = retrier
        self.row_lock = row_lock
        self.defects = defects

    # ------------------------------------------------------------------ mutations

    def append(
        self,
        session_id: str,
        stream: str,
        values: list[Any],
        ttl: timedelta | None,
        request_id: str,
        caller_request_id: bool,
    ) -> list[LogItemRecord]:
        """Append ``values`` (validated, at least one) as the next items, all or nothing, and
        set the log's expiry anew (``ttl``; None: the default TTL)."""
        if len(values) > 1 and Defect.NON_ATOMIC_APPEND in self.defects:
            first = self.append(session_id, stream, values[:1], ttl, request_id, caller_request_id)
            failpoint_after_first_key()
            rest = self.append(session_id, stream, values[1:], ttl, uuid.uuid4().hex, False)
            return first + rest
        observed = None if self.row_lock else self._observe(session_id, stream)

        def attempt(retry: bool) -> list[LogItemRecord]:
            now = clock.now()
            head = self._lock(session_id, stream, now, create=True)
            assert head is not None
            if retry or caller_request_id:
                done = self._find_request(head, request_id)
                if done is not None:
                    found = self._items(head, done.first_seq, done.last_seq)
                    if caller_request_id:
                        _check_same_append(request_id, done, found, values)
                    return found
            self._expire_if_due(head, now)
            if observed is not None:
                head.last_seq = observed[0]
            first = head.last_seq + 1
            numbers = [first + i for i in range(len(values))]
            if Defect.SKIPPED_ITEM_NUMBER in self.defects:
                numbers = [n + 1 if n >= 3 and head.last_seq < 3 else n for n in numbers]
            appended = self._appended(head, numbers, values, ttl, now, request_id)
            signals.after_commit(
                signals.log_appended,
                self.using,
                session_id=session_id,
                stream=stream,
                items=appended,
            )
            return appended

        with one_write_at_a_time(self.using):
            return self.retrier.atomic(attempt, sessions=(session_id,))

    def pop(self, session_id: str, stream: str, request_id: str, caller_request_id: bool) -> Any:
        """Remove the last live item and return it (None: the log is empty)."""
        unlocked = not self.row_lock or Defect.UNLOCKED_POP in self.defects
        observed = self._observe(session_id, stream) if unlocked else None

        def attempt(retry: bool) -> LogItemRecord | None:
            now = clock.now()
            head = self._lock(session_id, stream, now, create=False)
            if head is None:
                return None
            if retry or caller_request_id:
                done = self._find_request(head, request_id)
                if done is not None:
                    if caller_request_id:
                        _check_same_op(request_id, done, LogOp.POP)
                    found = self._items(head, done.first_seq, done.last_seq)
                    return found[0] if found and done.op == LogOp.POP else None
            self._expire_if_due(head, now)
            last = self._last_live(head) if observed is None else observed[1]
            if last is None:
                return None
            head.length -= 1
            self._record(head, LogOp.POP, last.seq, last.seq, 1, now, request_id)
            self._run(self._statements().mark_popped, [head.version, last.id])
            return LogItemRecord(session_id, stream, last.seq, last.value, last.created_at)

        with one_write_at_a_time(self.using):
            return self.retrier.atomic(attempt, sessions=(session_id,))

    def clear(self, session_id: str, stream: str, request_id: str, caller_request_id: bool) -> int:
        """Hide every live item (one event); returns how many there were."""

        def attempt(retry: bool) -> int:
            now = clock.now()
            head = self._lock(session_id, stream, now, create=False)
            if head is None:
                return 0
            if retry or caller_request_id:
                done = self._find_request(head, request_id)
                if done is not None:
                    if caller_request_id:
                        _check_same_op(request_id, done, LogOp.CLEAR)
                    return done.count
            self._expire_if_due(head, now)
            return self._hide(head, LogOp.CLEAR, now, request_id)

        with one_write_at_a_time(self.using):
            return self.retrier.atomic(attempt, sessions=(session_id,))

    def rewrite(
        self,
        session_id: str,
        stream: str,
        compute: Callable[[list[Any]], Any],
        ttl: timedelta | None,
        request_id: str,
        *,
        replace: bool = True,
    ) -> list[LogItemRecord]:
        """Replace the live items by ``compute(values)`` under the log's lock: a ``clear``
        event (if anything was live) and an ``append`` event of the new items (if any), in one
        transaction -- or, without ``replace``, append what ``compute`` returns after them.
        ``compute`` gets the live values oldest first and may run again on a retry; what it
        returns is checked as an append's items before anything is written."""

        # The unsafe seam: the items computed from a read made before the lock (and the gap).
        stale = None if self.row_lock else self._observe_live(session_id, stream)

        def attempt(retry: bool) -> list[LogItemRecord]:
            now = clock.now()
            head = self._lock(session_id, stream, now, create=False)
            if head is None:  # no log: one is created only for items to hold
                if not validation.check_items(compute([])):
                    return []
                head = self._lock(session_id, stream, now, create=True)
                assert head is not None
            if retry:
                done = self._find_request(head, request_id)
                if done is not None:  # the COMMIT of an earlier attempt landed
                    return self._items(head, done.first_seq, done.last_seq)
            self._expire_if_due(head, now)
            live = self._live_values(head.id, head.cleared_through) if stale is None else stale
            values = validation.check_items(compute(live))
            if replace:
                self._hide(head, LogOp.CLEAR, now, uuid.uuid4().hex)
            if not values:
                return []
            numbers = [head.last_seq + 1 + i for i in range(len(values))]
            appended = self._appended(head, numbers, values, ttl, now, request_id)
            if not replace:
                signals.after_commit(
                    signals.log_appended,
                    self.using,
                    session_id=session_id,
                    stream=stream,
                    items=appended,
                )
            return appended

        with one_write_at_a_time(self.using):
            return self.retrier.atomic(attempt, sessions=(session_id,))

    def expire(self, session_id: str, stream: str) -> bool:
        """Record the expiry of the log if its TTL has passed (``purge_expired``); True if it
        had live items."""

        def attempt(_retry: bool) -> bool:
            now = clock.now()
            head = self._lock(session_id, stream, now, create=False)
            return head is not None and self._expire_if_due(head, now)

        with one_write_at_a_time(self.using):
            return self.retrier.atomic(attempt, sessions=(session_id,))

    def erase(self, session_id: str) -> int:
        """Delete every log of the session with its items and events (plain DELETE statements,
        as :meth:`WritePath.erase <agentmemory.writes.WritePath.erase>`); returns how many
        logs."""

        def attempt(_retry: bool) -> int:
            connection = connections[self.using]
            heads = Log.objects.using(self.using).filter(session_id=session_id)
            ids = sql.lock_for_delete(
                connection, heads.order_by("stream").values_list("id", flat=True)
            )
            return sql.delete_locked(connection, [(LogItem, "log"), (LogEvent, "log")], ids)

        with one_write_at_a_time(self.using):
            return self.retrier.atomic(attempt, sessions=(session_id,))

    def due(self, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` logs whose TTL has passed: ``(session_id, stream)``."""
        rows = Log.objects.using(self.using).filter(expires_at__lte=clock.now())
        return list(rows.order_by("expires_at").values_list("session_id", "stream")[:limit])

    def due_count(self) -> int:
        """How many logs with live items are past their TTL (``purge_expired --dry-run``)."""
        due = Log.objects.using(self.using).filter(expires_at__lte=clock.now(), length__gt=0)
        return self.retrier.read(due.count)

    # ------------------------------------------------------------------ reads

    def read(
        self,
        session_id: str,
        stream: str,
        limit: int | None,
        before: int | None,
        after: int | None,
        since: tuple[str, float] | None = None,
    ) -> list[LogItemRecord]:
        """The live items, oldest first: after ``after`` the first ``limit``, otherwise the
        last ``limit`` (before ``before``); every one without a limit; with ``since``, only
        those whose numeric member ``since[0]`` is at least ``since[1]``. One statement."""

        newest_first = after is None and limit is not None
        shown = Defect.READ_SHOWS_POPPED in self.defects
        params = [
            *(session_id, stream) * head_refs(connections[self.using].vendor),
            *([after] if after is not None else []),
            *([before] if before is not None else []),
            *([since[1]] if since is not None else []),
            *([limit] if limit is not None else []),
        ]

        def work() -> list[LogItemRecord]:
            connection = connections[self.using]
            statement = _read_statement(
                connection.vendor,
                after is not None,
                before is not None,
                limit is not None,
                newest_first,
                shown,
                None if since is None else since[0],
            )
            rows = list(sql.run(connection, statement, params))  # mysqlclient: a tuple
            # Every row carries the head's expiry: a log whose TTL has passed shows nothing.
            if rows and not _live_at(sql.to_datetime(rows[0][3]), clock.now()):
                return []
            if newest_first:
                rows.reverse()
            return [
                LogItemRecord(
                    session_id, stream, seq, sql.decode_json(raw), sql.to_datetime(created)
                )
                for seq, raw, created, _expires in rows
            ]

        return self.retrier.read(work)

    def streams(self, session_id: str) -> list[str]:
        """The session's logs that hold live items, in the order they were created."""

        def work() -> list[str]:
            return list(
                Log.objects.using(self.using)
                .filter(_unexpired(clock.now()))
                .filter(session_id=session_id, length__gt=0)
                .order_by("id")
                .values_list("stream", flat=True)
            )

        return self.retrier.read(work)

    def length(self, session_id: str, stream: str) -> int:
        """How many live items the log has (0: no log, or expired)."""

        def work() -> int:
            found = (
                Log.objects.using(self.using)
                .filter(_unexpired(clock.now()))
                .filter(session_id=session_id, stream=stream)
                .values_list("length", flat=True)
                .first()
            )
            return found or 0

        return self.retrier.read(work)

    def history(
        self, session_id: str, stream: str, limit: int | None, before_version: int | None
    ) -> list[LogEventRecord]:
        """The log's events: every one oldest first, or a page newest first (keyset by
        ``before_version``)."""

        def work() -> list[LogEventRecord]:
            events = LogEvent.objects.using(self.using).filter(
                log__session_id=session_id, log__stream=stream
            )
            if before_version is not None:
                events = events.filter(version__lt=before_version)
            if limit is not None:
                events = events.order_by("-version")[:limit]
            else:
                events = events.order_by("version")
            fields = ("version", "op", "first_seq", "last_seq", "count", "created_at")
            return [
                LogEventRecord(version, LogOp(op), first, last, count, at)
                for version, op, first, last, count, at in events.values_list(*fields)
            ]

        return self.retrier.read(work)

    # ------------------------------------------------------------------ under the lock

    def _run(self, statement: str, params: list[Any]) -> list[Any]:
        return list(sql.run(connections[self.using], statement, params))

    def _statements(self) -> _Statements:
        return _statements(connections[self.using].vendor)

    def _adapt(self, when: datetime | None) -> Any:
        return connections[self.using].ops.adapt_datetimefield_value(when)

    def _lock(self, session_id: str, stream: str, now: datetime, *, create: bool) -> _Head | None:
        """The log's head, locked (created empty first when ``create``: two writers racing to
        create a log never make two heads, and neither sees an IntegrityError)."""
        lock = self._statements().lock
        if not create:
            rows = self._run(lock, [session_id, stream])
        else:
            values = {
                "session_id": session_id,
                "stream": stream,
                "last_seq": 0,
                "length": 0,
                "cleared_through": 0,
                "version": 0,
                "created_at": now,
                "updated_at": now,
            }
            rows = locked_or_created(
                connections[self.using],
                Log,
                values,
                lambda: self._run(lock, [session_id, stream]),
            )
        if not rows:
            return None
        row_id, last_seq, length, cleared, version, expires = rows[0]
        return _Head(
            row_id, session_id, stream, last_seq, length, cleared, version, sql.to_datetime(expires)
        )

    def _observe(self, session_id: str, stream: str) -> tuple[int, _Item | None]:
        """The unsafe seam's read: the log's last number and last live item as they are now,
        without a lock, outside the transaction; then the gap before the write."""
        head = Log.objects.using(self.using).filter(session_id=session_id, stream=stream).first()
        found: tuple[int, _Item | None] = (0, None)
        if head is not None:
            last = (
                LogItem.objects.using(self.using)
                .filter(log_id=head.id, seq__gt=head.cleared_through, removed_in__isnull=True)
                .last()
            )
            item = None if last is None else _Item(last.id, last.seq, last.value, last.created_at)
            found = (head.last_seq, item)
        time.sleep(UNLOCKED_POP_GAP_SECONDS)
        return found

    def _observe_live(self, session_id: str, stream: str) -> list[Any]:
        """The unsafe seam's read for a rewrite: the live values as they are now, without a
        lock, outside the transaction; then the gap before the write."""
        head = Log.objects.using(self.using).filter(session_id=session_id, stream=stream).first()
        live = [] if head is None else self._live_values(head.id, head.cleared_through)
        time.sleep(UNLOCKED_POP_GAP_SECONDS)
        return live

    def _live_values(self, log_id: int, cleared_through: int) -> list[Any]:
        """The values of a log's live items, oldest first."""
        return list(
            LogItem.objects.using(self.using)
            .filter(log_id=log_id, seq__gt=cleared_through, removed_in__isnull=True)
            .order_by("seq")
            .values_list("value", flat=True)
        )

    def _last_live(self, head: _Head) -> _Item | None:
        rows = self._run(self._statements().last_live, [head.id, head.cleared_through])
        if not rows:
            return None
        row_id, seq, raw, created = rows[0]
        created_at = sql.to_datetime(created)
        assert created_at is not None
        return _Item(row_id, seq, sql.decode_json(raw), created_at)

    def _insert_items(
        self, head: _Head, numbers: list[int], values: list[Any], now: datetime
    ) -> None:
        """The items, in as few multi-row INSERTs as the server takes (rows per statement,
        and a MySQL-family server's packet size): one append may hold 100,000 items."""
        connection = connections[self.using]
        at = self._adapt(now)
        texts = [sql.encode_json(value) for value in values]
        named = [(f"items[{index}]", text) for index, text in enumerate(texts)]
        row = f"(%s, %s, {json_placeholder(connection)}, %s)"
        for start, stop in statement_batches(connection, named, row_overhead=64):
            params: list[Any] = []
            for seq, text in zip(numbers[start:stop], texts[start:stop], strict=True):
                params += [head.id, seq, text, at]
            statement = self._statements().insert_items + ", ".join([row] * (stop - start))
            sql.run(connection, statement, params)

    def _appended(
        self,
        head: _Head,
        numbers: list[int],
        values: list[Any],
        ttl: timedelta | None,
        now: datetime,
        request_id: str,
    ) -> list[LogItemRecord]:
        """An append under the lock: ``values`` stored as items ``numbers``, the head moved
        past them with its expiry set anew (``ttl``; None: the default TTL), one event."""
        self._insert_items(head, numbers, values, now)
        if len(values) > 1:
            failpoint_after_first_key()  # the items are written: all must go with them
        head.last_seq = numbers[-1]
        head.length += len(values)
        lifetime = ttl if ttl is not None else default_ttl()
        head.expires_at = None if lifetime is None else now + lifetime
        self._record(head, LogOp.APPEND, numbers[0], numbers[-1], len(values), now, request_id)
        return [
            LogItemRecord(head.session_id, head.stream, seq, value, now)
            for seq, value in zip(numbers, values, strict=True)
        ]

    def _expire_if_due(self, head: _Head, now: datetime) -> bool:
        """A passed TTL is an event too, recorded before anything else happens to the log:
        the items it hid never come back. True if it hid live items."""
        if _live_at(head.expires_at, now):
            return False
        had = head.length
        head.expires_at = None
        self._hide(head, LogOp.EXPIRE, now, uuid.uuid4().hex, always=True)
        return had > 0

    def _hide(
        self, head: _Head, op: LogOp, now: datetime, request_id: str, *, always: bool = False
    ) -> int:
        """Hide every item up to ``last_seq`` (a clear or an expiry): one event, if there was
        anything to hide (``always``: an expiry is recorded even then)."""
        hidden = head.length
        if not hidden and not always:
            return 0
        first = head.cleared_through + 1
        head.cleared_through = head.last_seq
        head.length = 0
        self._record(head, op, min(first, head.last_seq), head.last_seq, hidden, now, request_id)
        return hidden

    def _record(
        self,
        head: _Head,
        op: LogOp,
        first_seq: int,
        last_seq: int,
        count: int,
        now: datetime,
        request_id: str,
    ) -> None:
        """Event ``head.version + 1``, and the head saved as the mutation left it."""
        head.version += 1
        at, statements = self._adapt(now), self._statements()
        self._run(
            statements.insert_event,
            [head.id, head.version, op.value, first_seq, last_seq, count, at, request_id],
        )
        self._run(
            statements.update_head,
            [
                head.last_seq,
                head.length,
                head.cleared_through,
                head.version,
                at,
                self._adapt(head.expires_at),
                head.id,
            ],
        )

    def _find_request(self, head: _Head, request_id: str) -> _Done | None:
        """The event an earlier attempt or call with the same request id committed, if any."""
        rows = self._run(self._statements().find_request, [head.id, request_id])
        return _Done(LogOp(rows[0][0]), *rows[0][1:]) if rows else None

    def _items(self, head: _Head, first: int, last: int) -> list[LogItemRecord]:
        """Items ``first``..``last`` as they were appended (popped or hidden since, or not)."""
        rows = self._run(self._statements().items, [head.id, first, last])
        return [
            LogItemRecord(
                head.session_id, head.stream, seq, sql.decode_json(raw), sql.to_datetime(created)
            )
            for seq, raw, created in rows
        ]


@dataclass(slots=True)
class _Head:
    """A log's head as a mutation holds it under its lock."""

    id: int
    session_id: str
    stream: str
    last_seq: int
    length: int
    cleared_through: int
    version: int
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class _Item:
    id: int
    seq: int
    value: Any
    created_at: datetime


@dataclass(frozen=True, slots=True)
class _Done:
    """The event a request id already committed."""

    op: LogOp
    first_seq: int
    last_seq: int
    count: int


@dataclass(frozen=True)
class _Statements:
    lock: str
    last_live: str
    insert_items: str  # + one "(...)" of values per item
    insert_event: str
    update_head: str
    find_request: str
    items: str
    mark_popped: str


@functools.lru_cache(maxsize=8)
def _statements(vendor: str) -> _Statements:
    """A mutation's statements, hand-written as the store's memory statements are
    (:mod:`agentmemory.sql`): the ORM's query building cost more than the database's work."""
    quote = "`{}`" if vendor == "mysql" else '"{}"'  # as each backend's ops.quote_name
    head, item, event = (quote.format(m._meta.db_table) for m in (Log, LogItem, LogEvent))
    count = quote.format("count")
    for_update = "" if vendor == "sqlite" else " FOR UPDATE"  # SQLite: BEGIN IMMEDIATE
    live = f" FORCE INDEX ({quote.format(LIVE_ITEMS)})" if vendor == "mysql" else ""
    # Every column of the live items' index, so that PostgreSQL does not walk the (log, seq)
    # index back over the popped rows instead (see _read_statement); MariaDB sorts if
    # removed_in is in it, and takes the index it is told.
    last_order = "seq DESC" if vendor == "mysql" else "log_id DESC, removed_in DESC, seq DESC"
    return _Statements(
        lock="SELECT id, last_seq, length, cleared_through, version, expires_at "
        f"FROM {head} WHERE session_id = %s AND stream = %s{for_update}",
        last_live=f"SELECT id, seq, value, created_at FROM {item}{live} WHERE log_id = %s AND "
        f"removed_in IS NULL AND seq > %s ORDER BY {last_order} LIMIT 1",
        insert_items=f"INSERT INTO {item} (log_id, seq, value, created_at) VALUES ",
        insert_event=f"INSERT INTO {event} (log_id, version, op, first_seq, last_seq, {count}, "
        "created_at, request_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        update_head=f"UPDATE {head} SET last_seq = %s, length = %s, cleared_through = %s, "
        "version = %s, updated_at = %s, expires_at = %s WHERE id = %s",
        find_request=f"SELECT op, first_seq, last_seq, {count} FROM {event} "
        "WHERE log_id = %s AND request_id = %s",
        items=f"SELECT seq, value, created_at FROM {item} WHERE log_id = %s AND seq >= %s "
        "AND seq <= %s ORDER BY seq",
        mark_popped=f"UPDATE {item} SET removed_in = %s WHERE id = %s",
    )


@functools.lru_cache(maxsize=64)
def _read_statement(
    vendor: str,
    after: bool,
    before: bool,
    limit: bool,
    newest_first: bool,
    popped: bool,
    since: str | None = None,
) -> str:
    """The read of a log's items, hand-written (the ORM's query building was most of a read's
    CPU): one statement, so the head and the items are one view, that walks the ``(log, seq)``
    index from the page's bound and stops after ``limit`` rows, whatever the log's length --
    each database needs the head put to it its own way for that:

    - PostgreSQL: three uncorrelated subqueries (the expiry, the log's id, its clear bound), each
      evaluated once before the items are read. Joined instead, it reads every live item of the
      log and sorts them for a page of the latest N (5 ms at 3,000 items, and growing; 0.09 ms
      this way);
    - the MySQL family: a join. The head, found by its unique key, is a constant table, so
      ``log_id`` and both ``seq`` bounds make one index range (with subqueries it evaluates
      them only at run time and scans every item above a ``before``: 1,521 rows for a page),
      given the index and the range explicitly (below);
    - SQLite: either; the subqueries.

    Parameters: (session id, stream) :func:`head_refs` times, then ``after``, ``before``,
    ``limit`` where given, then the bound of ``since`` (the name of an item's numeric member:
    only items whose member is at least the bound, judged by the database). ``popped``: the
    READ_SHOWS_POPPED defect."""
    quote = "`{}`" if vendor == "mysql" else '"{}"'  # as each backend's ops.quote_name
    item, head = quote.format(LogItem._meta.db_table), quote.format(Log._meta.db_table)
    order = "DESC" if newest_first else "ASC"
    # The order of the index walked, every column of it (removed_in is NULL in every row of a
    # live read): no planner then takes another index and filters or sorts.
    by = f"i.seq {order}" if popped else f"i.removed_in {order}, i.seq {order}"
    if vendor == "mysql":
        columns = "i.seq, i.value, i.created_at, h.expires_at"
        index = quote.format(ONE_ITEM_PER_SEQ if popped else LIVE_ITEMS)
        source = f"{item} i FORCE INDEX ({index}) JOIN {head} h"
        bounds = [
            "h.session_id = %s",
            "h.stream = %s",
            # Not "i.log_id = h.id": on an equality MariaDB 10.11 reads by `ref` on log_id
            # alone, from the end of the log, and filters the seq bounds row by row. Two values
            # (0 is no id) and the order of the whole index make it a range over both columns.
            "i.log_id IN (h.id, 0)",
            "i.seq > h.cleared_through",
        ]
        by = f"i.log_id {order}, i.seq {order}"  # (MariaDB sorts when removed_in is in it)
    else:
        of_head = f"FROM {head} WHERE session_id = %s AND stream = %s)"
        columns = f"i.seq, i.value, i.created_at, (SELECT expires_at {of_head}"
        source = f"{item} i"
        bounds = [f"i.log_id = (SELECT id {of_head}", f"i.seq > (SELECT cleared_through {of_head}"]
    conditions = [
        *bounds,
        *([] if popped else ["i.removed_in IS NULL"]),
        *(["i.seq > %s"] if after else []),
        *(["i.seq < %s"] if before else []),
        *([f"{_json_number(vendor, 'i.value', since)} >= %s"] if since else []),
    ]
    return f"SELECT {columns} FROM {source} WHERE {' AND '.join(conditions)} ORDER BY {by}" + (
        " LIMIT %s" if limit else ""
    )


def _json_number(vendor: str, column: str, member: str) -> str:
    """The numeric member ``member`` of a JSON object in ``column``, NULL where it is missing or
    not a number (so that a comparison with it is false), in each database's SQL. ``member``
    is an identifier (:data:`SINCE_MEMBER`), never a caller's text in the statement."""
    assert SINCE_MEMBER.fullmatch(member), member
    if vendor == "postgresql":
        found = f"{column} -> '{member}'"
        return f"(CASE WHEN jsonb_typeof({found}) = 'number' THEN ({column} ->> '{member}')::float8 END)"
    path = f"'$.{member}'"
    if vendor == "mysql":
        found = f"JSON_EXTRACT({column}, {path})"
        return (
            f"(CASE WHEN JSON_TYPE({found}) IN ('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE', "
            f"'DECIMAL') THEN JSON_UNQUOTE({found}) + 0 END)"
        )
    return (
        f"(CASE WHEN json_type({column}, {path}) IN ('integer', 'real') "
        f"THEN json_extract({column}, {path}) END)"
    )


#: What ``since`` may name: a member of an item's top-level object.
SINCE_MEMBER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def head_refs(vendor: str) -> int:
    """How many times :func:`_read_statement` takes the (session id, stream) pair."""
    return 1 if vendor == "mysql" else 3


def _live_at(expires_at: datetime | None, now: datetime) -> bool:
    """The rule of :func:`_unexpired`, on a head's expiry in hand."""
    return expires_at is None or expires_at > now


def _unexpired(now: datetime, via: str = "") -> Q:
    """The one rule of a live log, as a filter: no TTL, or one that has not passed at ``now``
    (``via``: the path to the head from the model queried, ``"log__"`` from its items)."""
    return Q(**{f"{via}expires_at__isnull": True}) | Q(**{f"{via}expires_at__gt": now})


def _check_same_op(request_id: str, done: _Done, op: LogOp) -> None:
    """Raise :class:`IdempotencyKeyReused` if the caller's key committed another operation."""
    if done.op != op:
        raise IdempotencyKeyReused(
            request_id.removeprefix("k:"), f"a {done.op.value} of this log", f"a {op.value}"
        )


def _check_same_append(
    request_id: str, done: _Done, found: list[LogItemRecord], values: list[Any]
) -> None:
    """Raise :class:`IdempotencyKeyReused` unless the caller's key committed an append of these
    very items (the same JSON, in the same order)."""
    _check_same_op(request_id, done, LogOp.APPEND)
    stored = [item.value for item in found]
    if len(stored) != len(values) or not all(map(same_json, stored, values)):
        raise IdempotencyKeyReused(
            request_id.removeprefix("k:"),
            f"an append of {len(stored)} other items (#{done.first_seq}-{done.last_seq})",
            f"an append of {len(values)} items",
        )
