"""A pytest plugin for the example project's control run: agentmemory's fixtures, except that
``memory_store`` is the deliberately unlocked read-then-write store. Loaded with
``-p no:agentmemory -p unlocked_memory_plugin``; the example's concurrency test must fail."""

import pytest

from agentmemory.testing.plugin import assert_memory_consistent, concurrently, memory_clock

__all__ = ["assert_memory_consistent", "concurrently", "memory_clock", "memory_store"]


@pytest.fixture
def memory_store():
    from agentmemory import MemoryStore

    return MemoryStore(cache=None, row_lock=False)
