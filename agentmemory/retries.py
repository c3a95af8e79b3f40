"""The retry policy: run a transaction (or a read) again when the database says it may.

Which errors qualify is :func:`agentmemory.vendors.classify`'s call; how often and how long to
wait is ``AGENTMEMORY["RETRY"]`` (read at each call, so ``override_settings`` applies). Callers
see the result, the error that is not transient, or :class:`~agentmemory.MemoryUnavailable`.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, connections, transaction

from . import telemetry
from .conf import get_config
from .defects import failpoint_commit_answer
from .errors import MemoryUnavailable
from .vendors import (
    Transient,
    begin_durable,
    classify,
    commit_unconfirmed,
    expect_commit,
    lock_wait_at_most,
)

T = TypeVar("T")
#: What a failed attempt may raise that the policy looks at: Django's ``DatabaseError`` family,
#: and ``InterfaceError`` -- a connection the driver already knows is closed (psycopg's and
#: MySQLdb's), which Django does not count as a ``DatabaseError``.
DATABASE_ERRORS = (DatabaseError, InterfaceError)


class Retrier:
    """Retries for one database alias, with a count of what was absorbed, by kind."""

    def __init__(self, using: str, *, retry: bool = True) -> None:
        """``retry=False`` is the NOT_RETRIED defect's seam (:mod:`agentmemory.defects`): every
        error reaches the caller as the database raised it."""
        self.using = using
        self.retry = retry
        #: Transient errors absorbed by retries, by kind; read by memcheck and the benchmarks.
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        #: Whether writes pass their sessions' gates (a shard's store: sessions may be moved
        #: online, :mod:`agentmemory.moves`).
        self.gated = False

    def run(self, attempt: Callable[[bool], T], connection: Any = None) -> T:
        """``attempt(retry)`` until it succeeds, with jittered exponential backoff between
        tries: attempt n waits random(0, min(MAX_DELAY, BASE_DELAY * 2**n)). Inside a caller's
        transaction nothing can be retried (the server rolled the whole transaction back), so
        the error propagates for the caller to retry. ``connection``: the alias's, when the
        caller has it at hand (looking it up costs a microsecond)."""
        if connection is None:
            connection = connections[self.using]
        if connection.vendor == "postgresql":
            attempt = self._confirmed(attempt, connection)
        if connection.in_atomic_block or not self.retry:
            return attempt(False)
        started = time.monotonic()
        try:
            return attempt(False)  # the first try reads no policy: most calls end here
        except DATABASE_ERRORS as exc:
            policy = get_config()["RETRY"]
            kind = self._absorb(exc, policy, connection)
            error: BaseException = exc
        attempts, deadline = policy["ATTEMPTS"], policy.get("DEADLINE")
        number = 1
        # A conflict (a deadlock, a serialization failure, a Galera certification conflict) is
        # contention: with a deadline, it is retried for as long as the deadline allows, not
        # ATTEMPTS times -- three nodes writing one hot key gave up after 12 conflicts in 1.7 s
        # of a 30 s deadline. ATTEMPTS bounds the rest (lost connections), and everything
        # without a deadline.
        while number < attempts or (deadline is not None and kind is Transient.CONFLICT):
            pause = random.uniform(0, min(policy["MAX_DELAY"], policy["BASE_DELAY"] * 2**number))
            left = None if deadline is None else deadline - (time.monotonic() - started) - pause
            if left is not None and left <= 0:
                break
            time.sleep(pause)
            number += 1
            try:
                if left is None:
                    return attempt(True)
                # The attempt's lock waits end with the call's deadline.
                with lock_wait_at_most(connection, left):
                    return attempt(True)
            except DATABASE_ERRORS as exc:
                kind = self._absorb(exc, policy, connection)
                error = exc
        spent = time.monotonic() - started
        raise MemoryUnavailable(
            f"database {self.using!r} still failing after {number} attempts in {spent:.1f} s "
            f"(RETRY: ATTEMPTS {attempts}, DEADLINE {deadline} s): {error}",
            cause=error,
            attempts=number,
        ) from error

    def atomic(
        self,
        attempt: Callable[[bool], T],
        connection: Any = None,
        *,
        sessions: Sequence[str] = (),
    ) -> T:
        """:meth:`run` with each attempt in its own ``transaction.atomic``: a transaction retried
        as a whole (inside a caller's transaction, a savepoint, not retried). ``sessions``: the
        sessions the transaction writes; on a shard's store (``gated``), each attempt first
        passes their gates (:mod:`agentmemory.moves`), and a session being moved is waited for
        -- then the write runs again, or raises ``SessionMoved`` if the session now lives on
        another shard. An attempt may also pass gates itself (:meth:`pass_gates`)."""

        if connection is None:
            connection = connections[self.using]
        gated = self.gated and bool(sessions)
        tried = False
        if self.gated:
            from . import moves  # its models: not at import (the adapters import this module)

        def in_transaction(retry: bool) -> T:
            with transaction.atomic(using=self.using):
                begin_durable(connection)
                if gated:
                    moves.pass_gate(connection, sessions)
                result = attempt(retry)
                failpoint_commit_answer(connection)
            return result

        if not self.gated:
            return self.run(in_transaction, connection)

        def tracked(retry: bool) -> T:
            # Whether an attempt may have committed: one that failed otherwise than at a closed
            # gate (whose transaction was rolled back before it changed anything). A run again
            # after a gate's wait then looks its request up, as a retry does.
            nonlocal tried
            try:
                return in_transaction(retry or tried)
            except moves.GateClosed:
                raise
            except BaseException:
                tried = True
                raise

        return moves.through_gates(
            lambda: self.run(tracked, connection),
            self.using,
            lambda: tried,
            connection.in_atomic_block,
        )

    def pass_gates(self, connection: Any, sessions: Iterable[str]) -> None:
        """Inside an attempt of :meth:`atomic`: pass the gates of sessions the attempt found
        (a delete of several threads); nothing on a store that is not a shard's."""
        if self.gated:
            from . import moves

            moves.pass_gate(connection, sessions)

    def _confirmed(self, attempt: Callable[[bool], T], connection: Any) -> Callable[[bool], T]:
        """``attempt``, raising ``MemoryUnavailable`` when its COMMIT came back with
        PostgreSQL's warning that the wait for the synchronous standby was cancelled: the write
        committed on the primary only, and a failover may take it back -- an outcome that is
        not known yet, never an acknowledgement. (The cache tier does not serve it either.)"""

        def confirmed(retry: bool) -> T:
            expect_commit(connection)
            result = attempt(retry)
            if commit_unconfirmed(connection):
                raise MemoryUnavailable(
                    f"database {self.using!r} committed the write on the primary, but the wait "
                    "for its synchronous standby was cancelled (PostgreSQL: 'canceling wait for "
                    "synchronous replication'): a failover may still lose it. Retry with the "
                    "same idempotency_key: the retry returns the write once the standby has it.",
                    cause=None,
                )
            return result

        return confirmed

    def read(self, work: Callable[[], T], connection: Any = None) -> T:
        """:meth:`run` for a read: ``work()`` again when its connection drops or a lock times
        out (a connection killed between two calls fails the next one, whichever it is)."""
        return self.run(lambda _retry: work(), connection)

    def _absorb(self, exc: Exception, policy: dict[str, Any], connection: Any) -> Transient:
        """Count a transient error (and drop a dead connection) and say which kind it is;
        re-raise any other."""
        kind = classify(exc)
        if kind is None or (kind is Transient.DISCONNECT and not policy["RECONNECT"]):
            raise exc
        with self._lock:
            self.counts[kind.value] += 1
            telemetry.retried(kind.value)
        if kind is Transient.DISCONNECT:
            connection.close()
        return kind
