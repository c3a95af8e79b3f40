"""The examples of docs/testing.md, which includes them from here (pymdownx.snippets sections):
the page shows tests that this suite runs, through the same plugin a downstream project gets."""

import pytest

from agentmemory import Index, MemoryStore
from agentmemory.testing.embeddings import HashEmbedder
from agentmemory.testing.factories import MemoryFactory


# --8<-- [start:memory_store]
@pytest.mark.django_db
def test_remembers(memory_store):
    memory_store.remember("user:ada", "language", "fr")
    assert memory_store.recall("user:ada", "language").value == "fr"


# --8<-- [end:memory_store]


# --8<-- [start:concurrently]
@pytest.mark.django_db(transaction=True)
def test_parallel_tool_calls_keep_every_preference(memory_store, concurrently):
    concurrently(
        lambda i: memory_store.update("user:ada", "prefs", lambda p: {**p, f"p{i}": i}, default={}),
        workers=8,
    )
    assert len(memory_store.recall("user:ada", "prefs").value) == 8


# --8<-- [end:concurrently]


# --8<-- [start:memory_clock]
def test_conversation_expires(memory_store, memory_clock, db):
    memory_store.remember("conv:1", "turns", ["hi"], ttl=3600)
    memory_clock.advance(3599)
    assert memory_store.recall("conv:1", "turns") is not None
    memory_clock.advance(1)
    assert memory_store.recall("conv:1", "turns") is None


# --8<-- [end:memory_clock]


# --8<-- [start:assert_memory_consistent]
@pytest.mark.django_db
def test_a_gap_in_the_history_is_reported(assert_memory_consistent):
    MemoryFactory(session_id="broken", key="k", versions=4, gap=True)  # history 1, 3, 4, 5
    with pytest.raises(AssertionError) as failed:
        assert_memory_consistent(session_id="broken")
    assert "[version-gap] ('broken', 'k'): history versions are [1, 3, 4, 5]" in str(failed.value)


# --8<-- [end:assert_memory_consistent]


# --8<-- [start:search]
def test_recall_by_meaning(db):
    store = MemoryStore(index=Index(embed=HashEmbedder(64), dims=64, fields=["text"]))
    store.remember("u", "seat", {"text": "Ada likes window seats"})
    store.remember("u", "food", {"text": "Ada is vegetarian"})
    assert store.search("u", "window seat")[0].key == "seat"


# --8<-- [end:search]
