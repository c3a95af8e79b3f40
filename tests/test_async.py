"""The async twins run concurrently, on a bounded pool of threads whose connections can be closed.

Concurrency is shown with barriers, never with timings: N calls that each wait until all N have
started can only finish if they run at the same time (one thread would wait forever: the barrier's
timeout breaks it and the test fails)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from django.db import connection, connections

from agentmemory import MemoryStore, aio

pytestmark = pytest.mark.django_db(transaction=True)


def gather(*coroutines):
    async def main():
        return await asyncio.gather(*coroutines)

    return asyncio.run(main())


def test_the_pool_runs_concurrent_calls_at_once(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "ASYNC_THREADS": 8}
    everyone = threading.Barrier(8, timeout=10)

    def meet(i):
        everyone.wait()  # a pool that ran these one at a time would break the barrier
        return threading.current_thread().name

    names = gather(*(aio.run(meet, i) for i in range(8)))
    assert len(set(names)) == 8 and all(n.startswith(aio.THREAD_PREFIX) for n in names)


def test_the_pool_is_bounded_by_async_threads(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "ASYNC_THREADS": 3}
    store = MemoryStore(cache=None)
    store.remember("s", "k", 1)
    results = gather(*(store.arecall("s", "k") for _ in range(40)))
    assert all(r.value == 1 for r in results)
    assert len(aio.executor()._threads) <= 3
    assert aio.close_connections() <= 3


@pytest.mark.server  # SQLite serializes writers: concurrent writes need row locks per key
def test_concurrent_async_writes_run_at_once_on_a_server(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "ASYNC_THREADS": 8}
    store = MemoryStore(cache=None)
    everyone = threading.Barrier(6, timeout=20)
    met: set[str] = set()

    def grow(items):
        # Under the row lock of its own key: six writers hold six locks at once. A retry calls
        # fn again, after the barrier has let everyone through: pass straight on then.
        name = threading.current_thread().name
        if name not in met:
            met.add(name)
            everyone.wait()
        return [*(items or []), name]

    records = gather(*(store.aupdate("s", f"k{i}", grow, default=[]) for i in range(6)))
    assert [r.version for r in records] == [1] * 6 and len(met) == 6


def test_close_connections_closes_every_pool_threads_connection(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "ASYNC_THREADS": 4}
    store = MemoryStore(cache=None)
    store.remember("s", "k", 1)
    alias = connection.alias
    everyone = threading.Barrier(4, timeout=10)

    def open_state(_i):
        everyone.wait()  # one call per pool thread
        return connections[alias].connection is not None

    async def read_then_report():
        await asyncio.gather(*(store.arecall("s", "k") for _ in range(4)))
        return await asyncio.gather(*(aio.run(open_state, i) for i in range(4)))

    async def report():
        return await asyncio.gather(*(aio.run(open_state, i) for i in range(4)))

    aio.close_connections()
    assert any(asyncio.run(read_then_report()))  # threads that read hold a connection
    assert aio.close_connections() == 4
    assert not any(asyncio.run(report()))


def test_async_threads_must_be_a_sane_int(settings):
    from agentmemory.checks import check_settings

    for bad in (0, -1, "8", True, 10_000):
        settings.AGENTMEMORY = {"ASYNC_THREADS": bad}
        assert [e.id for e in check_settings()] == ["agentmemory.E018"], bad


def test_an_async_call_sees_the_callers_context_variables(settings):
    """A context variable set by the caller (a request id for logging, a tenant) is what the
    store's code sees on the pool thread; the pool thread's changes stay there."""
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
    seen = []

    def work() -> str:
        seen.append(request_id.get())
        request_id.set("changed on the pool thread")
        return threading.current_thread().name

    async def main() -> str:
        request_id.set("req-42")
        name = await aio.run(work)
        assert request_id.get() == "req-42"
        return name

    name = asyncio.run(main())
    assert seen == ["req-42"]
    assert name.startswith(aio.THREAD_PREFIX)
