"""The agent's memory, tested with agentmemory's pytest plugin alone (no set-up code of our own)."""

import pytest
from agent.memory import CONVERSATION_TTL, AgentMemory
from django.db import connections

pytestmark = pytest.mark.django_db(transaction=True)


def test_parallel_preference_updates_are_all_kept(
    memory_store, concurrently, assert_memory_consistent
):
    memory = AgentMemory(memory_store)
    concurrently(lambda i: memory.set_preference("ada", f"pref{i}", i), workers=8)
    assert memory.preferences("ada") == {f"pref{i}": i for i in range(8)}
    assert_memory_consistent(session_id="user:ada")


def test_users_never_see_each_others_memories(memory_store):
    memory = AgentMemory(memory_store)
    for user in ("ada", "Ada", "ada ", "ad%", "ad_"):
        memory.set_preference(user, "name", user)
    assert [memory.preferences(u)["name"] for u in ("ada", "Ada", "ada ", "ad%", "ad_")] == [
        "ada",
        "Ada",
        "ada ",
        "ad%",
        "ad_",
    ]


def test_a_conversation_is_forgotten_an_hour_after_its_last_turn(memory_store, memory_clock):
    memory = AgentMemory(memory_store)
    memory.add_turn("c1", "hello")
    memory_clock.advance(CONVERSATION_TTL - 60)
    memory.add_turn("c1", "still there?")  # refreshes the hour
    memory_clock.advance(CONVERSATION_TTL - 60)
    assert memory.turns("c1") == ["hello", "still there?"]
    memory_clock.advance(60)
    assert memory.turns("c1") == []


def test_memories_survive_a_reconnect(memory_store):
    AgentMemory(memory_store).set_preference("ada", "language", "fr")
    connections.close_all()
    assert AgentMemory().preferences("ada") == {"language": "fr"}
