"""Sessions moved between shards online: ``ShardedStore.move`` and ``manage.py move_sessions``.

A session lives on one shard (:mod:`agentmemory.sharding`). Moving it copies its rows -- memories
with their histories, logs with their items and events, checkpoint chains -- to another shard
while it goes on being served: read throughout, written everywhere but for the moment of its
copy, and never written twice or lost.

**The gate.** Every write of a shard's store (a :class:`~agentmemory.sharding.ShardedStore`'s)
passes its session's *gate* first, in the write's own transaction (:func:`pass_gate`): a
:class:`~agentmemory.models.SessionGate` row, or none (open). The mover changes a gate's state
in a transaction of its own that the writers' passes are serialized with, per database:

- SQLite: the database lock a write holds from ``BEGIN IMMEDIATE`` (the read of the gate is the
  whole pass);
- PostgreSQL: a shared advisory transaction lock on the session, taken by the writer in one
  statement and the gate read in the next (a snapshot taken after the lock); the mover takes the
  same lock exclusively, so it waits for every write that passed, and every later write reads its
  new state;
- the MySQL family: the writer *writes* the session's gate row (insert, or count one more write),
  then reads it, holding its row lock; the mover's write of the row waits for it. A write, not a
  shared lock: a Galera cluster certifies rows written on any node, and locks are local to one.

**A move** (:func:`move_session`), from shard A to shard B: (1) on A, the gate closes (moving to
B): once that commits, no write is in flight and none can start there; (2) the rows are read on A
and written on B in one transaction, with B's gate *incoming* from A, and read back and compared
with A's; (3) on A, in one transaction, the rows are deleted and the gate says *moved* to B (with
the Redis tier's entries of the session made tombstones before the commit, dropped after); (4)
B's gate opens. Writes that meet a closed gate wait (up to :data:`GATE_WAIT` seconds) and go on
where the session then lives; a read that finds nothing where it looked asks that shard's gate
whether the session moved, and follows it. A mover that dies leaves a gate closed and the session
read-only: ``manage.py move_sessions --resume`` finishes its moves (each step can be done again).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.models import F
from django.utils import timezone

from .defects import failpoint_gate_closed, failpoint_move_copied
from .errors import MemoryUnavailable, SessionMoved
from .models import (
    Checkpoint,
    CheckpointBlob,
    CheckpointThread,
    CheckpointWrite,
    GateState,
    Log,
    LogEvent,
    LogItem,
    Memory,
    MemoryVersion,
    PendingInvalidation,
    SessionGate,
    ShardMap,
)
from .sql import run

if TYPE_CHECKING:
    from .sharding import ShardedStore

__all__ = [
    "GATE_WAIT",
    "GateClosed",
    "MoveReport",
    "move_session",
    "moved_to",
    "pass_gate",
    "resume_moves",
    "session_rows",
]

T = TypeVar("T")

#: The SQLSTATE of PostgreSQL's gate functions for a gate that is not open (migration 0016).
GATE_STATE = "AMGT1"

#: Seconds a write waits at a closed gate (a session being moved) before it gives up with
#: ``MemoryUnavailable``: a move of a session of ordinary size takes milliseconds; a mover that
#: died leaves the gate closed until ``move_sessions --resume``.
GATE_WAIT = 30.0


class GateClosed(Exception):
    """Raised inside a write's transaction by :func:`pass_gate`: a session of the write is not
    open here. The transaction is rolled back; :func:`through_gates` waits and says what next."""

    def __init__(self, closed: list[tuple[str, str, str]]) -> None:
        super().__init__(", ".join(f"{s!r} {state} {peer!r}" for s, state, peer in closed))
        #: (session_id, state, peer) of each session that is not open.
        self.closed = closed


@functools.lru_cache(maxsize=4096)
def lock_key(session_id: str) -> int:
    """The PostgreSQL advisory lock of a session's gate: a signed 64-bit hash of its id."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8, person=b"agentmemory-gat")
    return int.from_bytes(digest.digest(), signed=True)


def _table(connection: Any) -> str:
    return connection.ops.quote_name(SessionGate._meta.db_table)


def pass_gate(connection: Any, session_ids: Iterable[str]) -> None:
    """Inside a write's transaction, before it changes anything: raise :class:`GateClosed` if
    any of these sessions is not open on this database (see the module for how the pass is
    serialized with a move)."""
    sessions = sorted(set(session_ids))
    if not sessions:
        return
    if connection.vendor == "postgresql":
        # The lock, then the read in a snapshot taken after it: one statement (migration 0016).
        with gate_raised(sessions):
            run(
                connection,
                "SELECT agentmemory_pass_gate(%s::bigint[], %s::text[])",
                [[lock_key(s) for s in sessions], sessions],
            )
        return
    table = _table(connection)
    if connection.vendor == "mysql":
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        run(
            connection,
            f"INSERT INTO {table} (session_id, state, peer, writes, changed_at) VALUES "
            + ", ".join(["(%s, 'open', '', 1, %s)"] * len(sessions))
            + " ON DUPLICATE KEY UPDATE writes = writes + 1",
            [p for s in sessions for p in (s, now)],
        )
    marks = ", ".join(["%s"] * len(sessions))
    # The statements' text (sql.run's cursor, no ORM): a write's every attempt runs it.
    closed = run(
        connection,
        f"SELECT session_id, state, peer FROM {table} "
        f"WHERE session_id IN ({marks}) AND state <> 'open'",
        sessions,
    )
    if closed:
        raise GateClosed(sorted(closed))


@contextlib.contextmanager
def gate_raised(sessions: Sequence[str]) -> Iterator[None]:
    """PostgreSQL's gate functions (migration 0016) raise SQLSTATE ``AMGT1`` for a closed gate:
    :class:`GateClosed` for these sessions (which one, and how it stands, is read afterwards)."""
    try:
        yield
    except DatabaseError as error:
        if getattr(error.__cause__, "sqlstate", None) != GATE_STATE:
            raise
        raise GateClosed([(s, "closed", "") for s in sessions]) from None


def gate_states(using: str, session_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """(state, peer) of each of these sessions whose gate on ``using`` is not open."""
    rows = (
        SessionGate.objects.using(using)
        .filter(session_id__in=sorted(set(session_ids)))
        .exclude(state=GateState.OPEN)
        .values_list("session_id", "state", "peer")
    )
    return {session: (state, peer) for session, state, peer in rows}


def moves_out(using: str) -> int:
    """How many sessions have moved away from ``using`` so far (0 before the first)."""
    found = ShardMap.objects.using(using).filter(pk=ShardMap.ONLY).values_list("moves", flat=True)
    return next(iter(found), 0)


def moved_to(using: str, session_id: str) -> str | None:
    """The shard ``session_id`` moved to from ``using`` (its gate there says so), or None."""
    state, peer = gate_states(using, [session_id]).get(session_id, (GateState.OPEN, ""))
    return peer if state == GateState.MOVED else None


def through_gates(
    run: Callable[[], Any], using: str, tried: Callable[[], bool], in_caller_transaction: bool
) -> Any:
    """``run()`` (a write's retried transaction, which passes its sessions' gates), again each
    time a gate it met was closed by a move in progress, until the move ends: then the write
    runs here again (the move was undone) or raises :class:`SessionMoved` naming the shard the
    session lives on now. ``tried()``: whether an attempt got past the gates before -- one whose
    outcome the error left unknown; if its session has moved since, that outcome is on the other
    shard and only the caller's idempotency key can find it: MemoryUnavailable says so. Inside a
    caller's transaction, nothing waits (its locks would hold the move up): MemoryUnavailable."""
    started = time.monotonic()
    pause = 0.002
    while True:
        try:
            return run()
        except GateClosed as closed:
            sessions = [session for session, _state, _peer in closed.closed]
            failpoint_gate_closed(sessions[0])
            if in_caller_transaction:
                raise MemoryUnavailable(
                    f"session {sessions[0]!r} is being moved between shards: a write inside a "
                    "transaction of the caller's cannot wait for it; retry the transaction"
                ) from None
        while True:
            states = gate_states(using, sessions)
            moved = [(s, peer) for s, (state, peer) in states.items() if state == GateState.MOVED]
            if moved:
                session, peer = moved[0]
                if tried():
                    raise MemoryUnavailable(
                        f"session {session!r} moved to shard {peer!r} while this write's outcome "
                        "was unknown (its answer was lost): retry it with the same "
                        "idempotency_key, which finds it if it was written"
                    )
                raise SessionMoved(session, using, peer)
            if not states:
                break  # open again: the move was undone
            if time.monotonic() - started > GATE_WAIT:
                session, (state, peer) = next(iter(sorted(states.items())))
                raise MemoryUnavailable(
                    f"session {session!r} is still {state} ({peer!r}) on database {using!r} "
                    f"after {GATE_WAIT:.0f} s: a move did not finish -- `manage.py "
                    "move_sessions --resume` finishes it"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


# ---------------------------------------------------------------------- the mover


def _in_transaction(using: str, work: Callable[[], T]) -> T:
    """``work()`` in a transaction on ``using``, retried as a whole on a transient error (a
    deadlock, a Galera certification conflict, a dropped connection): each step of a move can be
    done again."""
    from .retries import Retrier

    def attempt(_retry: bool) -> T:
        with transaction.atomic(using=using):
            return work()

    return Retrier(using).run(attempt)


def _lock(using: str, session_id: str) -> str:
    """In the current transaction: the session's gate on ``using`` held exclusively -- every
    write that passed it has committed, and none can pass until the transaction ends -- and its
    state."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key(session_id)])
    found = (
        SessionGate.objects.using(using)
        .select_for_update()
        .filter(session_id=session_id)
        .values_list("state", flat=True)
    )
    return next(iter(found), GateState.OPEN)


def _set(using: str, session_id: str, state: str, peer: str) -> None:
    """In the current transaction, the gate locked (:func:`_lock`): its new state."""
    SessionGate.objects.using(using).update_or_create(
        session_id=session_id,
        defaults={"state": state, "peer": peer, "changed_at": timezone.now()},
    )


def _open(using: str, session_id: str) -> None:
    def work() -> None:
        _lock(using, session_id)
        SessionGate.objects.using(using).filter(session_id=session_id).delete()

    _in_transaction(using, work)


#: Each table of a session's rows: (model, the filter that finds the session's rows, the
#: parent it hangs from -- its foreign key and the parent's natural key -- and its own natural
#: key, by which a copy's rows are compared with the original's).
@dataclass(frozen=True)
class _Table:
    model: Any
    by_session: str
    parent: tuple[str, Any, tuple[str, ...]] | None
    natural: tuple[str, ...]


_MEMORY = _Table(Memory, "session_id", None, ("key",))
_THREAD = _Table(CheckpointThread, "thread_id", None, ("checkpoint_ns",))
_LOG = _Table(Log, "session_id", None, ("stream",))
TABLES = (
    _MEMORY,
    _Table(MemoryVersion, "memory__session_id", ("memory", Memory, ("key",)), ("version",)),
    _LOG,
    _Table(LogItem, "log__session_id", ("log", Log, ("stream",)), ("seq",)),
    _Table(LogEvent, "log__session_id", ("log", Log, ("stream",)), ("version",)),
    _THREAD,
    _Table(
        Checkpoint,
        "thread__thread_id",
        ("thread", CheckpointThread, ("checkpoint_ns",)),
        ("checkpoint_id",),
    ),
    _Table(
        CheckpointBlob,
        "thread__thread_id",
        ("thread", CheckpointThread, ("checkpoint_ns",)),
        ("channel", "version"),
    ),
    _Table(
        CheckpointWrite,
        "thread__thread_id",
        ("thread", CheckpointThread, ("checkpoint_ns",)),
        ("checkpoint_id", "task_id", "idx"),
    ),
)


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def session_rows(using: str, session_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of ``session_id`` on ``using``, by model name, each without its id and with its
    parent's natural key in place of the parent's id, in natural-key order: two databases hold
    the same session exactly when these are equal."""
    parents: dict[str, dict[int, tuple[Any, ...]]] = {}
    found: dict[str, list[dict[str, Any]]] = {}
    for table in TABLES:
        model = table.model
        rows = list(model.objects.using(using).filter(**{table.by_session: session_id}).values())
        names = {}
        out = []
        for row in rows:
            row = {name: _plain(value) for name, value in row.items()}
            ident = row.pop("id")
            if table.parent is not None:
                field, parent, _natural = table.parent
                row[f"{field}_id"] = parents[parent.__name__][row[f"{field}_id"]]
            names[ident] = tuple(row[name] for name in table.natural)
            out.append(row)
        parents[model.__name__] = names
        found[model.__name__] = sorted(out, key=lambda row, table=table: _order(table, row))
    return found


def _order(table: _Table, row: dict[str, Any]) -> tuple[str, ...]:
    parent = (str(row[f"{table.parent[0]}_id"]),) if table.parent is not None else ()
    return (*parent, *(str(row[name]) for name in table.natural))


def delete_rows(using: str, session_id: str) -> None:
    """Every row of ``session_id`` on ``using`` deleted (plain deletes: no gate, no cache)."""
    for table in reversed(TABLES):
        table.model.objects.using(using).filter(**{table.by_session: session_id}).delete()


#: Bytes of values one INSERT of a copy carries at most (a single row may carry more: its own
#: value, which the server took once already): under the MySQL family's max_allowed_packet,
#: which check W008 keeps above two values.
COPY_BATCH_BYTES = 1024 * 1024
COPY_BATCH_ROWS = 200


def _size(row: dict[str, Any]) -> int:
    return sum(
        len(value) if isinstance(value, (bytes, str)) else len(json.dumps(value, default=str))
        for value in row.values()
        if value is not None
    )


def _by_size(objects: list[Any], rows: list[dict[str, Any]]) -> Iterator[list[Any]]:
    """``objects`` in runs of at most COPY_BATCH_ROWS whose rows' values add up to at most
    COPY_BATCH_BYTES (a larger row alone)."""
    part: list[Any] = []
    weight = 0
    for obj, row in zip(objects, rows, strict=True):
        size = _size(row)
        if part and (len(part) >= COPY_BATCH_ROWS or weight + size > COPY_BATCH_BYTES):
            yield part
            part, weight = [], 0
        part.append(obj)
        weight += size
    if part:
        yield part


def _insert_rows(using: str, rows: dict[str, list[dict[str, Any]]]) -> None:
    ids: dict[str, dict[tuple[Any, ...], int]] = {}
    for table in TABLES:
        model = table.model
        wanted = rows[model.__name__]
        objects = []
        for row in wanted:
            row = dict(row)
            if table.parent is not None:
                field, parent, _natural = table.parent
                row[f"{field}_id"] = ids[parent.__name__][row[f"{field}_id"]]
            objects.append(model(**row))
        for part in _by_size(objects, wanted):
            model.objects.using(using).bulk_create(part)
        if table.parent is None and wanted:
            session_field = table.by_session
            first = wanted[0][session_field]
            ids[model.__name__] = {
                tuple(row[:-1]): row[-1]
                for row in model.objects.using(using)
                .filter(**{session_field: first})
                .values_list(*table.natural, "id")
            }


@dataclass
class MoveReport:
    """What :func:`move_session` did: the session, its shards, how many rows it copied."""

    session_id: str
    source: str
    target: str
    rows: int
    seconds: float


def move_session(store: ShardedStore, session_id: str, target: str) -> MoveReport:
    """Move ``session_id`` from the shard it lives on to ``target``, online (see the module).
    Returns a :class:`MoveReport` (rows 0 and source == target when it already lives there).
    Raises MemoryUnavailable (naming the shard) if a database fails; the move can be done again,
    or finished by :func:`resume_moves`."""
    started = time.monotonic()
    source = store.locate(session_id)
    if source == target:
        return MoveReport(session_id, source, target, 0, 0.0)

    def close() -> None:
        state = _lock(source, session_id)
        if state != GateState.OPEN:
            raise MemoryUnavailable(
                f"session {session_id!r} is {state} on shard {source!r}: another move of it "
                "runs or did not finish (`manage.py move_sessions --resume` finishes it); "
                "nothing was moved"
            )
        _set(source, session_id, GateState.MOVING, target)

    _in_transaction(source, close)
    rows = _copy(store, session_id, source, target)
    failpoint_move_copied(session_id)
    _finish(store, session_id, source, target)
    store.moved(session_id, target)
    return MoveReport(session_id, source, target, rows, time.monotonic() - started)


def _copy(store: ShardedStore, session_id: str, source: str, target: str) -> int:
    """Steps 2: the rows on ``target``, incoming, compared with the source's (read-only now)."""
    rows = _in_transaction(source, lambda: session_rows(source, session_id))

    def write() -> None:
        state = _lock(target, session_id)
        leftovers = any(session_rows(target, session_id).values())
        if state == GateState.MOVING or (leftovers and state != GateState.INCOMING):
            raise MemoryUnavailable(
                f"session {session_id!r} has rows on shard {target!r} too, where it is {state}: "
                "it cannot be moved there (two copies of one session; see docs/scaling.md)"
            )
        _set(target, session_id, GateState.INCOMING, source)
        delete_rows(target, session_id)  # what an earlier, unfinished copy left
        _insert_rows(target, rows)

    _in_transaction(target, write)
    copied = session_rows(target, session_id)
    if copied != rows:
        different = sorted(name for name in rows if rows[name] != copied.get(name))
        raise MemoryUnavailable(
            f"session {session_id!r}: the copy on shard {target!r} differs from shard "
            f"{source!r}'s rows in {', '.join(different)}; nothing was switched -- move it again"
        )
    return sum(len(table) for table in rows.values())


def _finish(store: ShardedStore, session_id: str, source: str, target: str) -> None:
    """Steps 3 and 4: the source's rows deleted and its gate moved, then the target open."""
    cache = store.stores[source].cache

    def switch() -> None:
        _lock(source, session_id)
        _set(source, session_id, GateState.MOVED, target)
        if cache is not None:
            versions = dict(
                Memory.objects.using(source)
                .filter(session_id=session_id)
                .values_list("key", "version")
            )
            if versions:
                # Tombstones before the commit: a reader of this shard's tier misses from the
                # moment the rows are gone, even if this process dies before it drops them.
                ahead = {key: version + 1 for key, version in versions.items()}
                if not cache.writing(session_id, ahead):
                    PendingInvalidation.record(source, session_id, sorted(versions))
                keys = sorted(versions)
                transaction.on_commit(lambda: cache.erased(session_id, keys), using=source)
        delete_rows(source, session_id)
        ShardMap.objects.using(source).filter(pk=ShardMap.ONLY).update(moves=F("moves") + 1)

    _in_transaction(source, switch)
    _open(target, session_id)


def resume_moves(store: ShardedStore, report: Callable[[str], None] = lambda _line: None) -> int:
    """Finish every move a mover left unfinished on the store's shards (a gate left moving or
    incoming): each one is copied again (or only opened, if its source already says moved), or,
    incoming from a source that does not move it, dropped. Returns how many it finished."""
    finished = 0
    for alias in store.shards:
        for gate in SessionGate.objects.using(alias).filter(state=GateState.MOVING):
            _copy(store, gate.session_id, alias, gate.peer)
            _finish(store, gate.session_id, alias, gate.peer)
            report(f"{gate.session_id!r}: moved from {alias!r} to {gate.peer!r}")
            finished += 1
    for alias in store.shards:
        for gate in SessionGate.objects.using(alias).filter(state=GateState.INCOMING):
            state, peer = gate_states(gate.peer, [gate.session_id]).get(
                gate.session_id, (GateState.OPEN, "")
            )
            if state == GateState.MOVED and peer == alias:
                _open(alias, gate.session_id)
                report(f"{gate.session_id!r}: opened on {alias!r}")
                finished += 1
            elif state != GateState.MOVING:

                def drop(alias: str = alias, session_id: str = gate.session_id) -> None:
                    _lock(alias, session_id)
                    delete_rows(alias, session_id)
                    SessionGate.objects.using(alias).filter(session_id=session_id).delete()

                _in_transaction(alias, drop)
                report(f"{gate.session_id!r}: an unfinished copy dropped from {alias!r}")
    return finished


def sessions_on(using: str) -> list[str]:
    """Every session with rows on ``using`` (memories, logs, checkpoint threads), sorted."""
    found: set[str] = set()
    found.update(Memory.objects.using(using).values_list("session_id", flat=True).distinct())
    found.update(Log.objects.using(using).values_list("session_id", flat=True).distinct())
    found.update(
        CheckpointThread.objects.using(using).values_list("thread_id", flat=True).distinct()
    )
    return sorted(found)


@dataclass
class Forwards:
    """What :func:`forward_to_homes` did: sessions whose home is now another shard, forwarded
    there; ones already forwarded; ones it left alone because their home holds rows of them too
    (two copies of one session: named, for an operator to look at)."""

    forwarded: list[tuple[str, str, str]]  # (session, home, where it lives)
    already: int
    conflicts: list[tuple[str, str, str]]


def forward_to_homes(store: ShardedStore) -> Forwards:
    """For a list of shards that gives sessions a new home (a shard added): at each session's
    home, a gate that says where it lives now, so that a router with the new list finds it
    there (without it, such a session reads as empty, and a write makes a second one at its
    home). Run it after ``agentmemory_shards set`` records the new list and before any process
    serves with it: a session written meanwhile by a process with the old list would not be
    forwarded. Reads every shard's sessions; can be run again (it skips what it did)."""
    from .sharding import place

    done = Forwards([], 0, [])
    for alias in store.shards:
        for session_id in sessions_on(alias):
            home = place(session_id, store.shards)
            if home == alias:
                continue
            state, _peer = gate_states(home, [session_id]).get(session_id, (GateState.OPEN, ""))
            if state == GateState.MOVED:
                done.already += 1
                continue
            if state != GateState.OPEN or any(session_rows(home, session_id).values()):
                done.conflicts.append((session_id, home, alias))
                continue

            def forward(home: str = home, session_id: str = session_id, alias: str = alias) -> None:
                if _lock(home, session_id) == GateState.OPEN:
                    _set(home, session_id, GateState.MOVED, alias)

            _in_transaction(home, forward)
            done.forwarded.append((session_id, home, alias))
    return done


def away_from_home(store: ShardedStore) -> list[str]:
    """Every session that lives away from its home shard (its home's gate says it moved): what
    ``move_sessions --rebalance`` brings home."""
    from .sharding import place

    found = []
    for alias in store.shards:
        moved = SessionGate.objects.using(alias).filter(state=GateState.MOVED)
        for session_id in moved.values_list("session_id", flat=True):
            if place(session_id, store.shards) == alias:
                found.append(session_id)
    return sorted(found)
