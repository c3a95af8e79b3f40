"""The async twins' threads: concurrent async calls run concurrently, on a bounded pool.

``sync_to_async``'s default (``thread_sensitive=True``) runs every call of one event loop on one
thread, one after another: 32 concurrent ``aremember`` tasks wrote no faster than one. The store
keeps no per-thread state across calls (every call is its own transaction), so its calls can run on
any thread: here, on a pool of ``AGENTMEMORY["ASYNC_THREADS"]`` threads (default 16), each with its
own database connections -- at most that many connections per database for every async caller of
the process. Context variables are carried over (a copy of the caller's context runs the call).

A cancelled task never leaves its call running: a call the pool has not started is dropped, and
one that runs is finished before the cancellation reaches the caller -- so a write is done or not
done by the time the caller learns it was cancelled, never later.

A call inside the caller's ``transaction.atomic`` has no async form in Django either: the
twins are for async code, which cannot hold a transaction across awaits.

:func:`close_connections` closes the pool threads' connections (an ASGI lifespan shutdown, a
test); a thread opens a new one on its next call.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import connections

from .conf import get_config

T = TypeVar("T")
THREAD_PREFIX = "agentmemory-async"

_pool: ThreadPoolExecutor | None = None
_size = 0
_used = False
_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """The pool, created on first use (and again if ASYNC_THREADS changed)."""
    global _pool, _size
    size = get_config()["ASYNC_THREADS"]
    with _lock:
        if _pool is None or _size != size:
            old, _pool, _size = (
                _pool,
                ThreadPoolExecutor(size, thread_name_prefix=THREAD_PREFIX),
                size,
            )
            if old is not None:
                old.shutdown(wait=False)
        return _pool


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the pool, in a copy of the caller's context (its context
    variables: a request id for logging, a tenant...). The loop's own ``run_in_executor``:
    ``sync_to_async`` cost 36 us of CPU per call against 19.5 here, measured with a function
    that does nothing -- a third of an ``arecall`` from SQLite -- for what the store does not use
    (copying context changes back to the caller, thread-sensitive mode)."""
    global _used
    _used = True
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    started = executor().submit(call)
    waiting = asyncio.wrap_future(started)
    cancellation: asyncio.CancelledError | None = None
    # A cancelled caller (a timeout, a client gone) must not leave a call running behind its
    # back: a write that lands after the caller saw the cancellation is a write it believes
    # never happened. A call the pool has not started is dropped (nothing done); one that runs
    # is waited for -- through repeated cancellations -- and the cancellation raised after it.
    while not waiting.done():
        try:
            await asyncio.wait({waiting})
        except asyncio.CancelledError as exc:
            cancellation = cancellation or exc
            if started.cancel():
                break
    if cancellation is not None:
        if waiting.done() and not waiting.cancelled():
            waiting.exception()  # retrieved: the caller hears of the cancellation only
        raise cancellation
    return waiting.result()


def call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the pool, waited for: a synchronous caller on a thread that should not
    hold a connection of its own (:mod:`agentmemory.integrations.threads`)."""
    global _used
    _used = True
    return executor().submit(contextvars.copy_context().run, fn, *args).result()


def on_pool() -> bool:
    """Whether the calling thread is one of the pool's."""
    return threading.current_thread().name.startswith(THREAD_PREFIX)


def used() -> bool:
    """Whether a call ran on the pool since :func:`close_connections` last closed it."""
    return _used


def close_connections() -> int:
    """Close the database connections of every pool thread that has started; returns how many
    threads ran the close. Each thread runs exactly one close: they all wait for each other."""
    global _used
    with _lock:
        pool = _pool
        _used = False
    if pool is None:
        return 0
    threads = len(pool._threads)  # started so far (the pool starts them lazily)
    if not threads:
        return 0
    everyone = threading.Barrier(threads)

    def close() -> None:
        everyone.wait(timeout=30)
        connections.close_all()

    for future in [pool.submit(close) for _ in range(threads)]:
        future.result()
    return threads
