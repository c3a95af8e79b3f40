"""Every public method that takes several ids refuses a ``str`` (and a mapping, a set, a lone
id) before anything reaches a driver: iterated, ``"abc"`` is the ids ``a``, ``b``, ``c`` --
``prune("abc")`` deleted threads ``a``, ``b`` and ``c``, ``put("ns", ...)`` stored under the
namespace ``("n", "s")``, ``add_items({...})`` stored the dict's keys as items."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from google.adk.events.event import Event
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.store.base import InvalidNamespaceError

from agentmemory import InvalidMemory, MemoryStore
from agentmemory.integrations import adk
from agentmemory.integrations.langgraph import AgentMemorySaver, AgentMemoryStore
from agentmemory.integrations.openai_agents import AgentMemorySession
from agentmemory.models import CheckpointThread

pytestmark = pytest.mark.django_db(transaction=True)


def put_checkpoint(saver: AgentMemorySaver, thread: str) -> None:
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    metadata: Any = {"source": "input", "step": -1, "parents": {}, "run_id": thread}
    saver.put(config, empty_checkpoint(), metadata, {})


def threads() -> list[str]:
    return sorted(CheckpointThread.objects.values_list("thread_id", flat=True))


@pytest.mark.parametrize("given", ["abc", b"abc", {"a": 1, "b": 2}, {"a", "b"}, 7])
def test_the_saver_refuses_what_is_not_a_list_of_thread_ids_and_deletes_nothing(given):
    saver = AgentMemorySaver()
    for thread in ["a", "b", "c", "abc"]:
        put_checkpoint(saver, thread)
    with pytest.raises(InvalidMemory, match="thread_ids: must be a list of ids"):
        saver.prune(given)
    with pytest.raises(InvalidMemory, match="thread_ids"):
        asyncio.run(saver.aprune(given))
    with pytest.raises(InvalidMemory, match="run_ids: must be a list of run ids"):
        saver.delete_for_runs(given)
    with pytest.raises(InvalidMemory, match="run_ids"):
        asyncio.run(saver.adelete_for_runs(given))
    assert threads() == ["a", "abc", "b", "c"]


def test_the_saver_still_takes_lists_and_tuples_of_ids():
    saver = AgentMemorySaver()
    for thread in ["a", "b", "c"]:
        put_checkpoint(saver, thread)
    saver.delete_for_runs(("a",))
    asyncio.run(saver.adelete_for_runs(["b"]))
    assert threads() == ["a", "b", "c"]  # the threads stay, their runs' checkpoints go
    assert saver.get_tuple({"configurable": {"thread_id": "a"}}) is None
    assert saver.get_tuple({"configurable": {"thread_id": "c"}}) is not None


@pytest.mark.parametrize("namespace", ["ns", b"ns", None])
def test_the_langgraph_store_refuses_a_namespace_that_is_not_a_tuple(namespace):
    """LangGraph's own check refuses bytes and None; a str passes it (its characters are str
    labels) and is refused by the store."""
    store = AgentMemoryStore(MemoryStore(cache=None))
    with pytest.raises(InvalidNamespaceError, match="amespace"):
        store.put(namespace, "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError, match="amespace"):
        asyncio.run(store.aput(namespace, "k", {"v": 1}))
    assert store.search(("n",)) == [] and store.list_namespaces() == []
    for condition in ({"prefix": "n"}, {"suffix": "s"}):
        with pytest.raises(InvalidNamespaceError, match="is a tuple of str labels"):
            store.list_namespaces(**condition)


def test_the_sdk_session_refuses_a_dict_or_a_str_for_items():
    session = AgentMemorySession("s", store=MemoryStore(cache=None))

    async def scenario() -> None:
        for given in [{"role": "user", "content": "hi"}, "hi"]:
            with pytest.raises(InvalidMemory, match="items: must be a list of items"):
                await session.add_items(given)  # type: ignore[arg-type]
        assert await session.get_items() == []
        await session.add_items(({"role": "user", "content": "hi"},))
        assert await session.get_items() == [{"role": "user", "content": "hi"}]

    asyncio.run(scenario())


@pytest.mark.parametrize("events", ["abc", {"e": 1}, ["not an event"]])
def test_the_adk_memory_service_refuses_what_is_not_a_list_of_events(events):
    service = adk.AgentMemoryMemoryService(MemoryStore(cache=None, index=_index()))
    with pytest.raises(InvalidMemory, match="events: must be a list of ADK Events"):
        asyncio.run(service.add_events_to_memory(app_name="a", user_id="u", events=events))


def test_the_adk_memory_service_takes_a_tuple_of_events():
    service = adk.AgentMemoryMemoryService(MemoryStore(cache=None, index=_index()))
    event = Event(author="user", invocation_id="i", content=None)
    asyncio.run(service.add_events_to_memory(app_name="a", user_id="u", events=(event,)))


def _index() -> Any:
    from agentmemory import Index
    from agentmemory.testing.embeddings import HashEmbedder

    return Index(embed=HashEmbedder(dims=8), dims=8, fields=["text"])
