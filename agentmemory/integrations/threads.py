"""The frameworks call the store from threads of their own -- LangGraph runs each graph's nodes and
checkpoint saves on worker threads it starts per run, where Django never ends a request and no one
closes a connection: where such a call runs.

Measured: 20 LangGraph runs at once on PostgreSQL with persistent connections (``CONN_MAX_AGE =
None``), each worker thread keeping the connection it opened, ran out of PostgreSQL's 100
connections ("sorry, too many clients already"); a connection closed after every call instead costs
a new connection per call (Django's default, ``CONN_MAX_AGE = 0``: milliseconds on PostgreSQL).
So such calls run on the store's own bounded pool of threads (:mod:`agentmemory.aio`, shared
with the async twins: ``ASYNC_THREADS``, default 16), whose connections stay open and are never
more than that many, whatever the framework's threads do."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import connections

from .. import aio

T = TypeVar("T")


def aliases_of(store: Any) -> tuple[str, ...]:
    """The databases an adapter's store writes to: its alias, or a ShardedStore's shards."""
    shards = getattr(store, "shards", None)
    return tuple(shards) if shards else (store.using,)


def call_sync(
    owner: str, using: str | Sequence[str], use: str, fn: Callable[..., T], *args: Any
) -> T:
    """``fn(*args)``, a synchronous call of ``owner`` (the adapter's class name) on database
    ``using`` (or any of several: a ShardedStore's): in the calling thread if that is the main
    thread, one of the pool's, or one inside a transaction of its own on ``using`` (the call joins
    it); otherwise on the pool, waited for.

    A synchronous call on a running event loop would block it on the database: refused as
    LangGraph's own async stores and savers refuse it (``asyncio.InvalidStateError``), naming
    ``use``, the asynchronous method to await instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop in this thread: a synchronous caller, as it should be
    else:
        raise asyncio.InvalidStateError(
            f"Synchronous calls to {owner} detected in a running event loop: they would block "
            f"it on the database. Use the asynchronous interface: {use}."
        )
    if (
        threading.current_thread() is threading.main_thread()
        or aio.on_pool()
        or any(
            connections[alias].in_atomic_block
            for alias in ((using,) if isinstance(using, str) else using)
        )
    ):
        return fn(*args)
    return aio.call(fn, *args)
