"""Declared seams for proving the checker: deliberate bugs, injected failures, and holds.

``MemoryStore(defects={Defect.…})`` builds a store with one (or more) of the bugs below planted at
one named place of the real code -- no monkeypatching, so what ``memcheck --self-test`` runs is the
code that ships, with one decision turned the wrong way. Each defect is a bug that has been written
in real stores: an unlocked read-then-write, a cache update lost after a commit, a sliding TTL, a
case-insensitive ``LIKE``. The self-test runs memcheck against each and reports which check caught
it (:mod:`agentmemory.consistency.selftest`). Never for data.

:func:`fail_after_first_key` is the injected failure: inside it, a multi-key write of this thread
raises :class:`InjectedFailure` after its first key is written (a failpoint, as TiKV and FreeBSD
have them). The real store rolls the whole write back; a non-atomic one has committed the first
key already.

A :class:`Hold` stops one thread at a named point of the real code until the test or fault that
armed it releases it -- between a write's tombstones and its COMMIT (:func:`crash_next_write`),
between a fill's database read and its store (:func:`hold_next_fill`), between a search's two
reads (:func:`hold_next_search`), between a read of Redis and the database's
(:func:`hold_next_load`), between a fence renewal's pending check and its fence
(:func:`hold_next_renewal`) -- so that a race memcheck needs happens in every run, waited for as
an event, never by a sleep. Points no hold is armed at cost one dictionary lookup.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from enum import StrEnum
from typing import Any


class Defect(StrEnum):
    NO_ROW_LOCK = "no-row-lock"
    LOST_CACHE_UPDATE = "lost-cache-update"
    FILL_WITHOUT_LEASE = "fill-without-lease"
    EXPIRED_FROM_CACHE = "expired-served-from-cache"
    TTL_RENEWED_ON_READ = "ttl-renewed-on-read"
    TTL_KEPT_ON_OVERWRITE = "ttl-kept-on-overwrite"
    TTL_ZERO_IS_FOREVER = "ttl-zero-is-forever"
    NON_ATOMIC_MANY = "non-atomic-remember-many"
    SPURIOUS_CAS_CONFLICT = "spurious-cas-conflict"
    SKIPPED_VERSION = "skipped-version"
    IDEMPOTENCY_IGNORED = "idempotency-ignored"
    CASE_INSENSITIVE_PREFIX = "case-insensitive-prefix"
    SESSION_PREFIX_MATCH = "session-prefix-match"
    ERASE_LEAVES_CACHE = "erase-leaves-cache"
    TRANSACTION_READS_CACHE = "transaction-reads-cache"
    NOT_RETRIED = "transient-errors-not-retried"
    STALE_VECTOR = "stale-vector"
    SEARCH_IGNORES_EXPIRY = "search-ignores-expiry"
    FRACTURED_READ = "fractured-read"
    SERVER_ID_KEPT = "server-id-kept-on-reconnect"
    UNLOCKED_POP = "unlocked-log-pop"
    SKIPPED_ITEM_NUMBER = "skipped-log-number"
    NON_ATOMIC_APPEND = "non-atomic-log-append"
    READ_SHOWS_POPPED = "read-log-shows-popped"
    UNLOCKED_CHECKPOINT = "unlocked-checkpoint-put"
    LOST_PENDING_WRITE = "lost-pending-write"
    STALE_CHECKPOINT_READ = "stale-checkpoint-read"
    LIST_SKIPS_NEWEST = "list-skips-newest-checkpoint"
    DELETE_LEAVES_LATEST = "delete-leaves-checkpoint"
    UPSERT_SKIPS_HISTORY = "upsert-skips-history"
    PUT_FUNCTION_FORKS = "checkpoint-function-forks"
    RESTORE_UNSEEN = "restore-unseen"
    ORM_UNSEEN = "orm-write-unseen"
    VERSION_READ_IGNORES_EXPIRY = "version-read-ignores-expiry"
    HISTORY_PAGE_REPEATS = "history-page-repeats-bound"
    SDK_POP_KEEPS_ITEM = "sdk-pop-keeps-item"
    SEARCH_KEEPS_FIRST_SCORES = "search-keeps-first-scores"
    HIT_EXPIRY_UNCHECKED = "hit-expiry-unchecked"
    ADK_DROPS_STATE_DELTA = "adk-drops-state-delta"
    ADK_STALE_APPEND = "adk-stale-append"
    FILL_IGNORES_VERSION = "fill-ignores-version"
    FILL_IGNORES_LEASE = "fill-ignores-lease"
    FENCE_FROM_RENEWAL = "fence-counted-from-renewal"
    RENEWAL_IGNORES_PENDING = "fence-renewed-while-pending"
    MCP_SHARED_SESSIONS = "mcp-shared-sessions"
    UNGATED_WRITES = "writes-skip-move-gate"


#: What each defect does, where it is planted (for the self-test's table and the docs).
DESCRIPTIONS = {
    Defect.NO_ROW_LOCK: "writes read the row before taking its lock (read-then-write race)",
    Defect.LOST_CACHE_UPDATE: "a write never updates Redis (no tombstone, no update after commit)",
    Defect.FILL_WITHOUT_LEASE: "a reader fills Redis with what it read, later, lease or not",
    Defect.EXPIRED_FROM_CACHE: "Redis entries outlive their TTL and hits are not checked for it",
    Defect.TTL_RENEWED_ON_READ: "a recall pushes the memory's expiry forward (a sliding TTL)",
    Defect.TTL_KEPT_ON_OVERWRITE: "a write without ttl keeps the expiry of the version it replaces",
    Defect.TTL_ZERO_IS_FOREVER: "ttl <= 0 is read as 'no TTL' instead of refused",
    Defect.NON_ATOMIC_MANY: "remember_many commits key by key",
    Defect.SPURIOUS_CAS_CONFLICT: "a compare-and-set conflicts although the expected version is current",
    Defect.SKIPPED_VERSION: "the third write of a memory is numbered 4",
    Defect.IDEMPOTENCY_IGNORED: "the caller's idempotency key is not looked up",
    Defect.CASE_INSENSITIVE_PREFIX: "recall_many(prefix=) matches keys case-insensitively",
    Defect.SESSION_PREFIX_MATCH: "recall_many matches sessions by prefix, not equality",
    Defect.ERASE_LEAVES_CACHE: "erase_session leaves the session's Redis entries",
    Defect.TRANSACTION_READS_CACHE: "reads inside a caller's transaction go through Redis",
    Defect.NOT_RETRIED: "deadlocks, lock timeouts and dropped connections reach the caller",
    Defect.STALE_VECTOR: "an overwrite is indexed by the vectors of the value it replaces",
    Defect.SEARCH_IGNORES_EXPIRY: "search lists memories whose TTL has passed (state only)",
    Defect.FRACTURED_READ: "recall_many reads its keys from Redis one at a time and only the "
    "misses from the database, each a moment apart",
    Defect.SERVER_ID_KEPT: "a warm read trusts the Redis server identity its connection learned "
    "first, also after the connection reconnects to another server process",
    Defect.UNLOCKED_POP: "a log pop picks the last item from a read made before it takes the lock",
    Defect.SKIPPED_ITEM_NUMBER: "the third item of a log is numbered 4",
    Defect.NON_ATOMIC_APPEND: "an append of several items commits them one at a time",
    Defect.READ_SHOWS_POPPED: "read_log does not leave out the items that were popped",
    Defect.UNLOCKED_CHECKPOINT: "a checkpoint put compares its parent with the latest "
    "checkpoint read before it takes the chain's lock",
    Defect.LOST_PENDING_WRITE: "put_writes of several writes stores all but the last",
    Defect.STALE_CHECKPOINT_READ: "the latest checkpoint is read as the one before it",
    Defect.LIST_SKIPS_NEWEST: "a listing of checkpoints leaves out the newest",
    Defect.DELETE_LEAVES_LATEST: "delete_thread deletes every checkpoint but the latest",
    Defect.UPSERT_SKIPS_HISTORY: "PostgreSQL's one-statement write function (agentmemory_upsert) "
    "inserts no history version when it overwrites a memory",
    Defect.PUT_FUNCTION_FORKS: "PostgreSQL's checkpoint put function "
    "(agentmemory_put_checkpoint) stores a put whose parent is no longer the chain's latest "
    "checkpoint: a silent fork (each put called after the unsafe seam's gap, a node's run)",
    Defect.RESTORE_UNSEEN: "the fence renewal does not check whether the database went back in "
    "time (a restore): the tier keeps what the database lost",
    Defect.ORM_UNSEEN: "an ORM write of memories (a queryset delete() or update()) does not drop "
    "the tier's entries of the rows it changed (cache.invalidate_on_commit)",
    Defect.VERSION_READ_IGNORES_EXPIRY: "recall(version=N) returns version N after its own "
    "expiry (reads.version)",
    Defect.HISTORY_PAGE_REPEATS: "history(before_version=N) includes version N: the next page "
    "repeats the last version of the one before (reads.history)",
    Defect.SEARCH_KEEPS_FIRST_SCORES: "search returns each memory as its second read found it, "
    "scored as its first read ranked it (search.py: a memory rewritten between them is paired "
    "with the other version's score)",
    Defect.SDK_POP_KEEPS_ITEM: "the OpenAI Agents SDK session's pop_item returns the latest item "
    "without removing it (integrations.openai_agents)",
    Defect.HIT_EXPIRY_UNCHECKED: "a Redis hit is not checked for its memory's expiry: the "
    "entry's own TTL is trusted to end with it (cache.read)",
    Defect.ADK_DROPS_STATE_DELTA: "ADK's append_event stores the event but not its state delta "
    "(integrations.adk)",
    Defect.ADK_STALE_APPEND: "ADK's append_event does not compare the session's revision: an "
    "event appended onto a stale session is acknowledged (integrations.adk, google/adk-python "
    "#4751)",
    Defect.FILL_IGNORES_VERSION: "a reader's fill of Redis is checked against its lease only, "
    "not against the version Redis holds: a fill read before a write's COMMIT replaces that "
    "write's tombstone when the writer dies before its update (cache PUT_SCRIPT)",
    Defect.FILL_IGNORES_LEASE: "a reader's fill of Redis is checked against the version Redis "
    "holds only, not against its lease: a fill read before a write is stored once the newer "
    "entry was evicted (cache PUT_SCRIPT)",
    Defect.FENCE_FROM_RENEWAL: "a fence renewal counts the fence's expiry from the moment it "
    "sets it, not from the Redis clock read before its check of the pending invalidations: a "
    "renewal that stalls after that check outlives the wait of a writer that recorded one "
    "meanwhile (cache.renew_fence)",
    Defect.RENEWAL_IGNORES_PENDING: "a fence renewal does not replay the pending invalidations "
    "first: Redis is trusted again while it holds what a writer could not update "
    "(cache.renew_fence)",
    Defect.MCP_SHARED_SESSIONS: "the MCP server keeps a principal's session ids as given, "
    "without its prefix: principals share sessions of the same name (integrations.mcp)",
    Defect.UNGATED_WRITES: "a shard's writes do not pass their session's gate: a write that "
    "lands while the session is copied to another shard stays behind on the old one "
    "(retries.Retrier.atomic, agentmemory.moves)",
}

#: Defects planted in the one-statement write itself: the store keeps that path with them (every
#: other defect switches it off).
FAST_PATH_DEFECTS = frozenset({Defect.UPSERT_SKIPS_HISTORY})

#: Defects that live in the Redis tier: without one, there is nothing to break.
CACHE_DEFECTS = frozenset(
    {
        Defect.LOST_CACHE_UPDATE,
        Defect.FILL_WITHOUT_LEASE,
        Defect.EXPIRED_FROM_CACHE,
        Defect.HIT_EXPIRY_UNCHECKED,
        Defect.FILL_IGNORES_VERSION,
        Defect.FILL_IGNORES_LEASE,
        Defect.FENCE_FROM_RENEWAL,
        Defect.RENEWAL_IGNORES_PENDING,
        Defect.ERASE_LEAVES_CACHE,
        Defect.TRANSACTION_READS_CACHE,
        Defect.FRACTURED_READ,
        Defect.SERVER_ID_KEPT,
        Defect.RESTORE_UNSEEN,
        Defect.ORM_UNSEEN,
    }
)

#: Defects of the checkpoint chains: only the checkpoint workload can show them.
CHECKPOINT_DEFECTS = frozenset(
    {
        Defect.UNLOCKED_CHECKPOINT,
        Defect.LOST_PENDING_WRITE,
        Defect.STALE_CHECKPOINT_READ,
        Defect.LIST_SKIPS_NEWEST,
        Defect.DELETE_LEAVES_LATEST,
        Defect.PUT_FUNCTION_FORKS,
    }
)

#: Defects of the logs: only the log workload can show them.
LOG_DEFECTS = frozenset(
    {
        Defect.UNLOCKED_POP,
        Defect.SKIPPED_ITEM_NUMBER,
        Defect.NON_ATOMIC_APPEND,
        Defect.READ_SHOWS_POPPED,
    }
)

#: Defects of the OpenAI Agents SDK session: only the SDK session workload can show them.
SDK_DEFECTS = frozenset({Defect.SDK_POP_KEEPS_ITEM})

#: Defects of the ADK session service: only the ADK workload can show them.
ADK_DEFECTS = frozenset({Defect.ADK_DROPS_STATE_DELTA, Defect.ADK_STALE_APPEND})

#: With FILL_WITHOUT_LEASE: seconds between a reader's database read and its fill (a slow reader:
#: a GC pause, a busy event loop).
SLOW_FILL_SECONDS = 0.05
#: With FRACTURED_READ: seconds between a recall_many's reads of its keys from Redis, and
#: between those and its database read of the misses (round trips and work between them).
FRACTURED_GAP_SECONDS = 0.01


class Defects(frozenset[Defect]):
    """The defects of one store: empty for every store but memcheck's self-test variants."""

    def __new__(cls, defects: Iterable[Defect | str] = ()) -> Defects:
        return super().__new__(cls, (Defect(d) for d in defects))

    def __repr__(self) -> str:
        return "{" + ", ".join(sorted(self)) + "}"


NONE = Defects()


class InjectedFailure(Exception):
    """Raised by a multi-key write inside :func:`fail_after_first_key`, after its first key."""


#: Each failpoint's flag: a context variable, so that a failpoint armed by a caller fires in the
#: store calls it makes -- on its own thread, or on the pool thread an async call runs on (which
#: runs in a copy of the caller's context, :func:`agentmemory.aio.run`) -- and nowhere else (a
#: new thread starts with a context of its own).
_armed: dict[str, contextvars.ContextVar[bool]] = {}


def _flag(failpoint: str) -> contextvars.ContextVar[bool]:
    flag = _armed.get(failpoint)
    if flag is None:  # setdefault: two threads creating it keep one
        flag = _armed.setdefault(
            failpoint, contextvars.ContextVar(f"agentmemory_{failpoint}", default=False)
        )
    return flag


@contextmanager
def _arming(failpoint: str) -> Iterator[None]:
    """Arm ``failpoint`` for this context inside the block (it fires once, at most)."""
    flag = _flag(failpoint)
    flag.set(True)
    try:
        yield
    finally:
        flag.set(False)


def _fires(failpoint: str) -> bool:
    """Whether ``failpoint`` is armed in this context; it is disarmed by firing."""
    flag = _flag(failpoint)
    if not flag.get():
        return False
    flag.set(False)
    return True


def fail_after_first_key() -> AbstractContextManager[None]:
    """Inside this block, this thread's next multi-key write fails after writing its first key
    (or an append of several log items after its first item): nothing of it may remain
    (``remember_many`` and ``append`` are all or nothing)."""
    return _arming("first_key")


def failpoint_after_first_key() -> None:
    """Called by the write path after the first key of a multi-key write (the first item of an
    append of several)."""
    if _fires("first_key"):
        raise InjectedFailure("a write failed after its first key or item (an injected failure)")


def fail_session_setup() -> AbstractContextManager[None]:
    """Inside this block, the next database connection this thread opens fails while the store
    sets its session up (causal reads, the lock-wait bound), before any setting is applied --
    as a SET fails on a Galera node that is still joining. The store must then close that
    connection: one left open would be used later without its settings."""
    return _arming("session_setup")


def failpoint_session_setup() -> None:
    """Called when a new connection's session is set up, before the first setting."""
    if _fires("session_setup"):
        raise InjectedFailure("the session setup of a new connection failed (an injected failure)")


def orm_writes_unseen() -> AbstractContextManager[None]:
    """The :data:`Defect.ORM_UNSEEN` variant's seam, armed by memcheck's ``orm-bulk`` fault
    around its ORM write when the run plants that defect: the next ORM write of memories on this
    thread drops none of the tier's entries (an ORM write has no store to carry defects)."""
    return _arming("orm_unseen")


def failpoint_orm_write() -> bool:
    """Called by the ORM's invalidation: whether to skip it (the planted defect)."""
    return _fires("orm_unseen")


_armed_in_process: set[str] = set()
_process_lock = threading.Lock()


def fail_next_checkpoint() -> None:
    """Arm, for the whole process (LangGraph saves checkpoints from threads of its own), a
    failure of the next checkpoint put, before it writes anything: as if the process died
    between a step's pending writes and the checkpoint that ends the step. It fires once;
    :func:`disarm_checkpoint_failure` disarms it unfired."""
    with _process_lock:
        _armed_in_process.add("checkpoint")


def disarm_checkpoint_failure() -> None:
    with _process_lock:
        _armed_in_process.discard("checkpoint")


def failpoint_before_checkpoint() -> None:
    """Called by :meth:`CheckpointPath.put <agentmemory.checkpoints.CheckpointPath.put>` before
    its transaction."""
    if "checkpoint" in _armed_in_process:
        with _process_lock:
            fired = "checkpoint" in _armed_in_process
            _armed_in_process.discard("checkpoint")
        if fired:
            raise InjectedFailure("the checkpoint put failed before writing (an injected failure)")


class WriterCrashed(Exception):
    """Raised to the caller of a write that :func:`crash_next_write` crashed: it committed, and
    the Redis tier's update never ran -- the caller of a process killed right after its COMMIT
    gets no answer; this thread gets this one instead, and goes on as the next process would."""


class Hold:
    """A point of the code where one thread of this process stops until :meth:`release`: the
    first to reach it that ``match(session_id, keys)`` selects. ``reached`` is set when it
    stops; ``taken`` holds what it was doing there (the session and ``{key: version}``). A thread
    never stops longer than ``timeout`` seconds (a fault that died must not hang the store)."""

    def __init__(self, match: Callable[[str, Iterable[str]], bool], timeout: float) -> None:
        self.match, self.timeout = match, timeout
        self.reached = threading.Event()
        self.released = threading.Event()
        #: Set once a thread stopped here, or the hold was disarmed: what to wait for when the
        #: thread may never come.
        self.settled = threading.Event()
        self.taken: tuple[str, dict[str, int]] | None = None

    def release(self) -> None:
        self.released.set()
        self.settled.set()


_holds_lock = threading.Lock()
#: The holds armed at each point, first armed first.
_holds: dict[str, list[Hold]] = {}


def _arm_hold(point: str, match: Callable[[str, Iterable[str]], bool], timeout: float) -> Hold:
    hold = Hold(match, timeout)
    with _holds_lock:
        _holds.setdefault(point, []).append(hold)
    return hold


def disarm(hold: Hold) -> None:
    """Disarm ``hold`` if no thread took it yet, and release it if one did."""
    with _holds_lock:
        for armed in _holds.values():
            if hold in armed:
                armed.remove(hold)
    hold.release()


def _stop_at(point: str, session_id: str, versions: dict[str, int]) -> Hold | None:
    """Stop this thread at ``point`` if a hold armed there selects this call."""
    if not _holds.get(point):
        return None
    with _holds_lock:
        armed = _holds.get(point, [])
        hold = next((h for h in armed if h.match(session_id, versions)), None)
        if hold is None:
            return None
        armed.remove(hold)
    hold.taken = (session_id, dict(versions))
    hold.reached.set()
    hold.settled.set()
    hold.released.wait(hold.timeout)
    return hold


def crash_next_write(match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0) -> Hold:
    """Arm, for the whole process (memcheck's ``writer-crash`` fault arms it from its own
    thread), a crash of the next write of memories that ``match(session_id, keys)`` selects and
    that updates the Redis tier: it stops after its tombstones went to Redis, before its COMMIT,
    until the hold is released; then it commits, and its thread raises :class:`WriterCrashed`
    in place of the tier's update. Redis is left as a process killed right after its COMMIT
    leaves it: the tombstones of the committed versions, and no update to delete the fill
    leases readers took meanwhile."""
    return _arm_hold("commit", match, timeout)


def failpoint_before_commit(session_id: str, versions: dict[str, int]) -> None:
    """Called by the write path after its tombstones went to Redis, before its COMMIT."""
    if _stop_at("commit", session_id, versions) is not None:
        _flag("crash").set(True)


def hold_next_fill(match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0) -> Hold:
    """Arm, for the whole process, a stop of the next fill of the Redis tier that
    ``match(session_id, [key])`` selects, after its database read and before it is stored,
    until the hold is released: a slow reader (a GC pause, a busy event loop), what memcheck's
    ``cache-evict`` fault makes of one reader while it writes and evicts."""
    return _arm_hold("fill", match, timeout)


def failpoint_before_fill(session_id: str, key: str, version: int) -> None:
    """Called by the tier's fill, after the database read, before the fill is stored."""
    if _holds.get("fill"):  # nothing built on the way of an unarmed fill
        _stop_at("fill", session_id, {key: version})


def hold_next_search(match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0) -> Hold:
    """Arm, for the whole process, a stop of the next search that ``match(session_id, [])``
    selects, between its two reads (the candidates ranked, their rows not read yet), until the
    hold is released: memcheck's search race commits its writes there, in every race."""
    return _arm_hold("search", match, timeout)


def failpoint_between_search_reads(session_id: str | None) -> None:
    """Called by a search between its two reads."""
    _stop_at("search", session_id or "", {})


def hold_next_checkpoint_read(
    match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0
) -> Hold:
    """Arm, for the whole process, a stop of the next checkpoint read of several statements
    that ``match(thread_id, [])`` selects, between its statements (a delta history's walk read,
    its writes not yet; on the MySQL family, checkpoint rows read, their blobs not yet), until
    the hold is released: the tests delete the thread there."""
    return _arm_hold("checkpoint-read", match, timeout)


def failpoint_between_checkpoint_reads(thread_id: str | None) -> None:
    """Called by a checkpoint read between two of its statements."""
    _stop_at("checkpoint-read", thread_id or "", {})


def hold_next_load(match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0) -> Hold:
    """Arm, for the whole process, a stop of the next read through the Redis tier that
    ``match(session_id, keys)`` selects, between its read of Redis and its read of the database
    (for its misses), until the hold is released: memcheck's ``recall_many`` race commits a
    ``remember_many`` there, in every race."""
    return _arm_hold("load", match, timeout)


def failpoint_before_load(session_id: str, keys: Iterable[str]) -> None:
    """Called by a read through the tier after its read of Redis, before the database's."""
    if _holds.get("load"):  # nothing built on the way of an unarmed read
        _stop_at("load", session_id, dict.fromkeys(keys, 0))


class CacheCutOff(ConnectionError):
    """Raised inside the Redis tier by :func:`cut_off_next_write`'s write: handled by the tier
    as any error of Redis (an outage)."""


def cut_off_next_write(match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0) -> Hold:
    """Arm, for the whole process, a Redis outage for the next write of memories that
    ``match(session_id, keys)`` selects, as it sends its tombstones (its store's tier is then
    unreachable for a moment, its update fails too): the write records its keys as pending and
    waits out the fence before it answers. Taken at once (the hold does not stop the write)."""
    hold = _arm_hold("cut-off", match, timeout)
    hold.release()
    return hold


def failpoint_tombstones(session_id: str, versions: dict[str, int]) -> None:
    """Called by the tier before it sends a write's tombstones."""
    if _stop_at("cut-off", session_id, versions) is not None:
        raise CacheCutOff("Redis unreachable for this write (an injected failure)")


def hold_next_move(match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0) -> Hold:
    """Arm, for the whole process, a stop of the next session move that ``match(session_id,
    [])`` selects, once its rows are copied to the new shard and before the old shard's are
    deleted, until the hold is released: the moment a write must wait, not land behind the copy
    (agentmemory.moves)."""
    return _arm_hold("move", match, timeout)


def failpoint_move_copied(session_id: str) -> None:
    """Called by a move between copying the session's rows and deleting the old shard's."""
    if _holds.get("move"):
        _stop_at("move", session_id, {})


def hold_next_gate_wait(match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0) -> Hold:
    """Arm, for the whole process, a stop of the next write that ``match(session_id, [])``
    selects when it meets a closed gate (its session being moved), before it waits, until the
    hold is released: a test knows the write is waiting."""
    return _arm_hold("gate", match, timeout)


def failpoint_gate_closed(session_id: str) -> None:
    """Called by a write that met a closed gate, before it waits for the move to end."""
    if _holds.get("gate"):
        _stop_at("gate", session_id, {})


def hold_next_renewal(match: Callable[[str, Iterable[str]], bool], timeout: float = 5.0) -> Hold:
    """Arm, for the whole process, a stop of the next fence renewal that ``match("", [])``
    selects (the thread is what tells), after its check of the pending invalidations found none
    and before it sets the fence, until the hold is released: a renewal that stalls (a GC
    pause) while a writer records a pending invalidation and waits out the fence."""
    return _arm_hold("renew", match, timeout)


def failpoint_before_renewal() -> None:
    """Called by a fence renewal between its pending check and its setting of the fence."""
    _stop_at("renew", "", {})


def die_after_commit() -> AbstractContextManager[None]:
    """Inside this block, this process dies (SIGKILL, as the OOM killer or a node's power does it)
    right after its next write commits, before the write updates the Redis tier: what a reader
    then gets from Redis must be the committed version or a miss, never the version before."""
    return _arming("after_commit")


def failpoint_after_commit() -> None:
    """Called by the write path after COMMIT, before the Redis tier's update."""
    if _fires("after_commit"):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if _fires("crash"):
        raise WriterCrashed(
            "the writer crashed right after its COMMIT, before updating the Redis tier "
            "(an injected failure: memcheck's writer-crash fault)"
        )


def lose_commit_answer() -> AbstractContextManager[None]:
    """Inside this block, this thread's next transaction of the write path commits on the server
    and its answer is lost: the client sees a dropped connection (``InterfaceError``), as when a
    node dies during COMMIT, and the ``on_commit`` work (the Redis tier's update) never runs.
    The retry must find what the lost attempt committed."""
    return _arming("commit_answer")


def failpoint_autocommit_answer() -> None:
    """The same failure after a statement that committed by itself (PostgreSQL's one-statement
    write in autocommit, which no transaction of the retrier wraps): it is stored, and the
    client sees a dropped connection."""
    if _fires("commit_answer"):
        from django.db import InterfaceError

        raise InterfaceError("the answer to the autocommitted write was lost (an injected failure)")


def failpoint_commit_answer(connection: Any) -> None:
    """Called by :meth:`Retrier.atomic <agentmemory.retries.Retrier.atomic>` at the end of an
    attempt, inside its transaction: commits it on the driver's connection and raises the lost
    answer (Django then rolls back nothing and drops the transaction's ``on_commit`` hooks).
    Only the outermost transaction: inside a caller's, the commit would be the caller's."""
    if len(connection.atomic_blocks) == 1 and _fires("commit_answer"):
        from django.db import InterfaceError

        connection.connection.commit()
        raise InterfaceError("the answer to COMMIT was lost (an injected failure)")
