"""Declared seams for proving the checker: deliberate bugs, and one injected failure.

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
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
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
    RESTORE_UNSEEN = "restore-unseen"
    ORM_UNSEEN = "orm-write-unseen"
    VERSION_READ_IGNORES_EXPIRY = "version-read-ignores-expiry"
    HISTORY_PAGE_REPEATS = "history-page-repeats-bound"


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
    Defect.RESTORE_UNSEEN: "the fence renewal does not check whether the database went back in "
    "time (a restore): the tier keeps what the database lost",
    Defect.ORM_UNSEEN: "an ORM write of memories (a queryset delete() or update()) does not drop "
    "the tier's entries of the rows it changed (cache.invalidate_on_commit)",
    Defect.VERSION_READ_IGNORES_EXPIRY: "recall(version=N) returns version N after its own "
    "expiry (reads.version)",
    Defect.HISTORY_PAGE_REPEATS: "history(before_version=N) includes version N: the next page "
    "repeats the last version of the one before (reads.history)",
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


_armed = threading.local()


@contextmanager
def _arming(failpoint: str) -> Iterator[None]:
    """Arm ``failpoint`` for this thread inside the block (it fires once, at most)."""
    setattr(_armed, failpoint, True)
    try:
        yield
    finally:
        setattr(_armed, failpoint, False)


def _fires(failpoint: str) -> bool:
    """Whether ``failpoint`` is armed on this thread; it is disarmed by firing."""
    if not getattr(_armed, failpoint, False):
        return False
    setattr(_armed, failpoint, False)
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
