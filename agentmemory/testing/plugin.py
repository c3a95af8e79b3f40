"""pytest fixtures for testing agent memory on a real database (registered as the ``agentmemory``
pytest plugin through the ``pytest11`` entry point; needs pytest-django).

    def test_preferences(memory_store, concurrently, memory_clock, assert_memory_consistent,
                         transactional_db):
        concurrently(lambda i: memory_store.update("s", "prefs", lambda p: {**p, i: True},
                                                   default={}), workers=8)
        assert len(memory_store.recall("s", "prefs").value) == 8
        memory_clock.advance(3600)
        assert_memory_consistent(session_id="s")
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from . import MemoryClock, check_memory_consistent
from . import concurrently as _concurrently


@pytest.fixture
def memory_store() -> Iterator[Any]:
    """A ``MemoryStore`` on the configured database (``AGENTMEMORY['DATABASE']``, the test
    database under pytest-django), with its Redis tier -- if ``AGENTMEMORY['CACHE']`` is set --
    in a namespace of its own, emptied when the test ends. Request ``db`` or
    ``transactional_db`` with it."""
    from ..store import MemoryStore

    store = MemoryStore(namespace=f"test-{uuid.uuid4().hex[:12]}")
    yield store
    if store.cache is not None:
        client = store.cache.client
        names = list(client.scan_iter(match=f"{store.cache.prefix}*", count=1000))
        if names:
            client.delete(*names)


@pytest.fixture
def concurrently() -> Callable[..., list[Any]]:
    """``concurrently(fn, workers=8)``: run ``fn(i)`` in ``workers`` threads started together,
    each with its own database connection (closed at the end); returns the results in worker
    order and re-raises the first worker error. Use it with ``transactional_db``: under ``db`` it
    raises ``ConcurrencyUsageError`` saying so."""
    return _concurrently


@pytest.fixture
def memory_clock() -> Iterator[MemoryClock]:
    """Moves the store's "now": ``memory_clock.advance(3600)`` expires TTLs without sleeping.
    Reset when the test ends."""
    test_clock = MemoryClock()
    test_clock.reset()
    yield test_clock
    test_clock.reset()


@pytest.fixture
def assert_memory_consistent(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``assert_memory_consistent(session_id=None)``: fails the test with a readable list of
    every violated invariant (version gaps, live row vs history, duplicate rows, Redis entries
    at another version than the database) in the stored memories."""
    store = (
        request.getfixturevalue("memory_store") if "memory_store" in request.fixturenames else None
    )

    def check(session_id: str | None = None, *, using: str | None = None) -> None:
        cache = store.cache if store is not None else None
        __tracebackhide__ = True
        check_memory_consistent(session_id, using=using, cache=cache)

    return check


@pytest.fixture(autouse=True)
def _async_pool_connections_closed() -> Iterator[None]:
    """After a test whose code ran the async twins, their pool threads' database connections are
    closed (as a request's are): the next test starts clean, and the test database can be
    dropped at the end of the run (PostgreSQL refuses while a connection is open)."""
    yield
    from .. import aio

    if aio.used():
        aio.close_connections()
