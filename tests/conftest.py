from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from agentmemory import MemoryStore, clock
from agentmemory.testing import concurrently


@pytest.fixture(params=["db", "redis"])
def store(request) -> MemoryStore:
    """Every store test runs twice: on the database alone, and with the Redis tier."""
    if request.param == "db":
        return MemoryStore(cache=None)
    return MemoryStore(cache=redis_alias())


def redis_alias() -> str:
    from django.conf import settings
    from django.core.cache import caches

    if "agentmemory" not in settings.CACHES:
        pytest.fail("the cache tests need Redis: set REDIS_URL (scripts/test.sh does)")
    caches["agentmemory"].clear()  # a test database starts empty: so must its cache
    return "agentmemory"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``server`` act on a server connection (kill it server-side): they do not
    apply to SQLite, which runs in-process, and are deselected there -- never skipped on a
    server backend."""
    from django.conf import settings

    if not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        return
    server_only = [item for item in items if item.get_closest_marker("server")]
    if server_only:
        config.hook.pytest_deselected(items=server_only)
        items[:] = [item for item in items if not item.get_closest_marker("server")]


@pytest.fixture(autouse=True)
def _reset_clock():
    yield
    clock.reset()


@pytest.fixture
def vendor() -> str:
    from agentmemory.vendors import flavor

    return flavor(connection)


def run_threads(fn: Callable[[int], Any], workers: int) -> list[Any]:
    """Run fn(i) in `workers` threads started together, each with its own connection."""
    return concurrently(fn, workers)
