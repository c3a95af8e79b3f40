"""Every adapter entry point validates with the store's own rules before anything reaches a
driver (#42): lone surrogates, NUL (PostgreSQL refuses it), a ``limit`` of ``2.5`` or ``"3"``,
an ``int`` checkpoint id, a timestamp of ``1e20``, ids of the wrong type -- each raises
:class:`~agentmemory.InvalidMemory` (LangGraph's store: its ``InvalidNamespaceError``) naming
what was wrong, never a driver's ``DataError``/``UnicodeEncodeError``/``ProgrammingError`` or a
``TypeError`` from deep inside."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.store.base import InvalidNamespaceError

from agentmemory import Index, InvalidMemory, MemoryStore
from agentmemory.integrations import adk
from agentmemory.integrations.langgraph import AgentMemorySaver, AgentMemoryStore
from agentmemory.integrations.openai_agents import AgentMemorySession
from agentmemory.testing.embeddings import HashEmbedder

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = ["a\x00b", "\ud800", "a\u202eb", 5, 2.5, "3", 1e20, -1, True, "x" * 300]
REFUSED = (InvalidMemory, InvalidNamespaceError)


def config(**configurable: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": "t", "checkpoint_ns": "", **configurable}}


def saver_calls(saver: AgentMemorySaver, h: Any) -> dict[str, Callable[[], Any]]:
    return {
        "get_tuple thread_id": lambda: saver.get_tuple({"configurable": {"thread_id": h}}),
        "get_tuple checkpoint_id": lambda: saver.get_tuple(config(checkpoint_id=h)),
        "get_tuple checkpoint_ns": lambda: saver.get_tuple(config(checkpoint_ns=h)),
        "list limit": lambda: list(saver.list(config(), limit=h)),
        "list before": lambda: list(saver.list(config(), before=config(checkpoint_id=h))),
        "put thread_id": lambda: saver.put(
            {"configurable": {"thread_id": h, "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
        ),
        "put_writes task_id": lambda: saver.put_writes(
            config(checkpoint_id="c"), [("channel", 1)], task_id=h
        ),
        "put_writes task_path": lambda: saver.put_writes(
            config(checkpoint_id="c"), [("channel", 1)], task_id="t", task_path=h
        ),
        "delete_thread": lambda: saver.delete_thread(h),
        "copy_thread": lambda: saver.copy_thread("t", h),
    }


def store_calls(store: AgentMemoryStore, h: Any) -> dict[str, Callable[[], Any]]:
    return {
        "put key": lambda: store.put(("ns",), h, {"a": 1}),
        "put label": lambda: store.put(("ns", h), "k", {"a": 1}),
        "put value": lambda: store.put(("ns",), "k", {"a": h}),
        "put ttl": lambda: store.put(("ns",), "k", {"a": 1}, ttl=h),
        "get key": lambda: store.get(("ns",), h),
        "search limit": lambda: store.search(("ns",), limit=h),
        "search offset": lambda: store.search(("ns",), offset=h),
        "list_namespaces limit": lambda: store.list_namespaces(limit=h),
        "list_namespaces max_depth": lambda: store.list_namespaces(max_depth=h),
    }


def sdk_calls(store: MemoryStore, h: Any) -> dict[str, Callable[[], Any]]:
    session = AgentMemorySession("s", store=store)
    return {
        "session_id": lambda: AgentMemorySession(h, store=store),
        "get_items limit": lambda: asyncio.run(session.get_items(limit=h)),
        "add_items content": lambda: asyncio.run(
            session.add_items([{"role": "user", "content": h}])
        ),
    }


def adk_calls(store: MemoryStore, h: Any) -> dict[str, Callable[[], Any]]:
    service = adk.AgentMemorySessionService(store)
    memory = adk.AgentMemoryMemoryService(
        MemoryStore(cache=None, index=Index(embed=HashEmbedder(dims=8), dims=8, fields=["text"]))
    )

    def event(content: Any = None, **fields: Any) -> Event:
        """An Event whose fields were set after it was built, as a caller may (pydantic checks
        them at construction only)."""
        built = Event(author="user", invocation_id="i", content=content)
        for name, value in fields.items():
            setattr(built, name, value)
        return built

    async def append(**fields: Any) -> None:
        session = await service.create_session(app_name="app", user_id="u")
        await service.append_event(session, event(**fields))

    spoken = types.Content(role="user", parts=[types.Part(text="hello")])
    return {
        "create_session session_id": lambda: asyncio.run(
            service.create_session(app_name="app", user_id="u", session_id=h)
        ),
        "create_session app_name": lambda: asyncio.run(
            service.create_session(app_name=h, user_id="u")
        ),
        "get_session user_id": lambda: asyncio.run(
            service.get_session(app_name="app", user_id=h, session_id="s")
        ),
        "list_sessions app_name": lambda: asyncio.run(service.list_sessions(app_name=h)),
        "append_event id": lambda: asyncio.run(append(id=h)),
        "append_event timestamp": lambda: asyncio.run(append(timestamp=h)),
        "get_session after_timestamp": lambda: asyncio.run(
            service.get_session(
                app_name="app",
                user_id="u",
                session_id="s",
                config=GetSessionConfig.model_construct(after_timestamp=h),
            )
        ),
        "add_events_to_memory timestamp": lambda: asyncio.run(
            memory.add_events_to_memory(
                app_name="a",
                user_id="u",
                events=[event(spoken, timestamp=h)],
            )
        ),
        "search_memory query": lambda: asyncio.run(
            memory.search_memory(app_name="a", user_id="u", query=h)
        ),
        "delete_memory user_id": lambda: asyncio.run(
            memory.delete_memory(app_name="a", user_id=h, memory_id="m")
        ),
    }


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except REFUSED:
        return "refused"
    except Exception as error:  # what the test is looking for: named in the failure
        return f"RAW {type(error).__name__}: {error}"[:200]
    return "accepted"


@pytest.mark.parametrize("hostile", HOSTILE, ids=repr)
def test_no_adapter_hands_a_driver_what_the_store_would_refuse(hostile):
    store = MemoryStore(cache=None)
    calls = {
        **{f"saver.{k}": v for k, v in saver_calls(AgentMemorySaver(store), hostile).items()},
        **{f"store.{k}": v for k, v in store_calls(AgentMemoryStore(store), hostile).items()},
        **{f"sdk.{k}": v for k, v in sdk_calls(store, hostile).items()},
        **{f"adk.{k}": v for k, v in adk_calls(store, hostile).items()},
    }
    found = {name: outcome(call) for name, call in calls.items()}
    assert {name: what for name, what in found.items() if what.startswith("RAW")} == {}


@pytest.mark.parametrize("text", ["a\x00b", "\ud800"], ids=["NUL", "surrogate"])
def test_ids_a_driver_cannot_store_are_refused_naming_the_field(text):
    store = MemoryStore(cache=None)
    saver = AgentMemorySaver(store)
    with pytest.raises(InvalidMemory, match="thread_id"):
        saver.get_tuple({"configurable": {"thread_id": text}})
    with pytest.raises(InvalidMemory, match="session_id"):
        asyncio.run(
            adk.AgentMemorySessionService(store).create_session(
                app_name="app", user_id="u", session_id=text
            )
        )


def test_an_int_checkpoint_id_and_a_float_limit_are_refused():
    saver = AgentMemorySaver(MemoryStore(cache=None))
    with pytest.raises(InvalidMemory, match="checkpoint_id: must be a str"):
        saver.get_tuple(config(checkpoint_id=5))
    with pytest.raises(InvalidMemory, match="limit: must be an int"):
        list(saver.list(config(), limit=2.5))
    session = AgentMemorySession("s", store=MemoryStore(cache=None))
    with pytest.raises(InvalidMemory, match="limit: must be an int or None"):
        asyncio.run(session.get_items(limit="3"))
