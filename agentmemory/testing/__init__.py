"""Test tooling for projects that use agentmemory: helpers usable anywhere, and a pytest plugin
(``agentmemory.testing.plugin``, registered through the ``pytest11`` entry point) with the
fixtures ``memory_store``, ``concurrently``, ``memory_clock`` and ``assert_memory_consistent``.

The factories (``agentmemory.testing.factories``) need factory-boy and the strategies
(``agentmemory.testing.strategies``) need Hypothesis: ``pip install django-agentmemory[testing]``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connections

from .. import clock

T = TypeVar("T")

__all__ = [
    "ConcurrencyUsageError",
    "MemoryClock",
    "MemoryInconsistent",
    "check_memory_consistent",
    "concurrently",
]


class ConcurrencyUsageError(RuntimeError):
    """``concurrently`` was called where its workers cannot see the test's data."""


class MemoryInconsistent(AssertionError):
    """The stored memories break an invariant; the message lists every violation."""


def concurrently(
    fn: Callable[[int], T], workers: int = 8, *, timeout: float = 120.0, using: str = "default"
) -> list[T]:
    """Run ``fn(i)`` for i in 0..workers-1, each in its own thread with its own database
    connection, all released at once by a barrier. Returns the results in worker order; if any
    worker raised, re-raises the first error (after every worker has finished). Each worker's
    connections are closed when it ends.

    Needs committed data: under pytest-django's ``db`` fixture the test runs inside one
    transaction that other connections cannot see, so this raises :class:`ConcurrencyUsageError`
    there; use ``transactional_db``."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if connections[using].in_atomic_block:
        raise ConcurrencyUsageError(
            "concurrently() was called inside a transaction (pytest-django's `db` fixture or "
            "TestCase wraps each test in one): worker threads have their own connections and "
            "cannot see this test's uncommitted data, and would block on its locks. Use the "
            "`transactional_db` fixture (or @pytest.mark.django_db(transaction=True))."
        )
    barrier = threading.Barrier(workers)
    results: list[Any] = [None] * workers
    errors: list[tuple[int, BaseException]] = []

    def work(index: int) -> None:
        try:
            barrier.wait(timeout)
            results[index] = fn(index)
        except BaseException as exc:
            errors.append((index, exc))
            barrier.abort()  # nobody waits forever for a worker that died before the start
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=work, args=(i,), name=f"concurrently-{i}", daemon=True)
        for i in range(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"{thread.name} still running after {timeout}s")
    if errors:
        errors.sort(key=lambda error: error[0])
        # A worker that failed aborts the barrier; the others' BrokenBarrierError is its echo.
        causes = [exc for _, exc in errors if not isinstance(exc, threading.BrokenBarrierError)]
        raise (causes or [errors[0][1]])[0]
    return results


class MemoryClock:
    """The store's "now", moved by tests instead of sleeping. Every TTL decision (database and
    Redis tier) reads this clock; it is reset when the fixture ends."""

    def now(self) -> datetime:
        return clock.now()

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move "now" forward by ``seconds`` (a number or a timedelta); returns the new now."""
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"advance() takes a number of seconds >= 0, got {seconds!r}")
        clock.advance(seconds)
        return clock.now()

    def reset(self) -> None:
        clock.reset()


def check_memory_consistent(
    session_id: str | None = None, *, using: str | None = None, cache: Any = None
) -> None:
    """Run memcheck's audit over the stored memories (all, or one session's) and raise
    :class:`MemoryInconsistent` describing each violation."""
    from ..conf import get_config
    from ..consistency.audit import audit

    alias = using or get_config()["DATABASE"]
    # Live rows past their TTL are not a violation here: tests move the clock, and purging is
    # the application's schedule (memcheck --audit reports them in production).
    audited, anomalies = audit(alias, session_id, cache=cache, grace_seconds=None)
    if anomalies:
        lines = [
            f"{len(anomalies)} memory invariant(s) violated in {audited} memories"
            + (f" of session {session_id!r}" if session_id is not None else "")
            + ":"
        ]
        lines += [f"  - [{a.check}] ({a.session_id!r}, {a.key!r}): {a.message}" for a in anomalies]
        raise MemoryInconsistent("\n".join(lines))
