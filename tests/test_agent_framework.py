"""Microsoft Agent Framework (#45): ``AgentMemoryHistoryProvider`` keeps a session's messages
on a log, exactly once however the framework resends them -- the framework's own
``InMemoryHistoryProvider`` behaviour, held against ours side by side -- and
``AgentMemoryContextProvider`` brings long-term memories into a run. Runs drive the
framework's own ``Agent`` with a scripted chat client, on every database."""

from __future__ import annotations

import asyncio

import pytest
from agent_framework import Agent, InMemoryHistoryProvider, Message

from agentmemory import Index, InvalidMemory, MemoryStore
from agentmemory.embedders import HashEmbedder
from agentmemory.integrations.agent_framework import (
    STREAM,
    AgentMemoryContextProvider,
    AgentMemoryHistoryProvider,
)
from agentmemory.testing.agent_framework import ScriptedChatClient

from .conftest import run_threads

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore:The provided chat client does not support function"),
]


def said(role: str, text: str, **kwargs) -> Message:
    return Message(role=role, contents=[text], **kwargs)


def shown(messages) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in messages]


@pytest.fixture(params=["agentmemory", "in-memory"])
def provider(request):
    """Ours, and the framework's own: the history behaviour holds for both."""
    if request.param == "in-memory":
        return InMemoryHistoryProvider()
    return AgentMemoryHistoryProvider(store=MemoryStore(cache=None))


def save(provider, session_id: str, messages, state: dict) -> None:
    asyncio.run(provider.save_messages(session_id, messages, state=state))


def load(provider, session_id: str, state: dict) -> list[tuple[str, str]]:
    return shown(asyncio.run(provider.get_messages(session_id, state=state)))


# ---------------------------------------------------------------------- the framework's behaviour


def test_a_saved_turn_is_loaded_back_and_a_new_session_is_empty(provider):
    state: dict = {}
    assert load(provider, "s1", state) == []
    save(provider, "s1", [said("user", "hello"), said("assistant", "hi")], state)
    assert load(provider, "s1", state) == [("user", "hello"), ("assistant", "hi")]
    assert load(provider, "s2", {}) == []


def test_a_retried_save_and_a_resent_transcript_append_each_message_once(provider):
    state: dict = {}
    turn = [said("user", "hello", message_id="u1"), said("assistant", "hi", message_id="a1")]
    save(provider, "s", turn, state)
    save(provider, "s", turn, state)  # the same save again
    nxt = [said("user", "more", message_id="u2"), said("assistant", "ok", message_id="a2")]
    save(provider, "s", [*turn, *nxt], state)  # the whole transcript, resent
    assert load(provider, "s", state) == [
        ("user", "hello"),
        ("assistant", "hi"),
        ("user", "more"),
        ("assistant", "ok"),
    ]


def test_a_repeated_input_without_an_id_is_a_new_turn_not_a_replay(provider):
    state: dict = {}
    save(provider, "s", [said("user", "again")], state)
    save(provider, "s", [said("user", "again")], state)
    assert load(provider, "s", state) == [("user", "again"), ("user", "again")]


# ---------------------------------------------------------------------- under the framework's Agent


def test_an_agent_reads_its_history_back_from_the_database():
    client = ScriptedChatClient(["Hi! I'm the agent.", "You said your name is Ada."])
    agent = Agent(
        client=client,
        instructions="Be brief.",
        context_providers=[AgentMemoryHistoryProvider(store=MemoryStore(cache=None))],
    )

    async def conversation() -> list[str]:
        session = agent.create_session(session_id="user-42")
        first = await agent.run("Hello, my name is Ada.", session=session)
        # Another agent and provider -- another process -- carries on the same session.
        other = Agent(
            client=client,
            context_providers=[AgentMemoryHistoryProvider(store=MemoryStore(cache=None))],
        )
        second = await other.run(
            "What is my name?", session=other.create_session(session_id="user-42")
        )
        return [first.text, second.text]

    assert asyncio.run(conversation()) == ["Hi! I'm the agent.", "You said your name is Ada."]
    assert shown(client.inputs[1]) == [
        ("user", "Hello, my name is Ada."),
        ("assistant", "Hi! I'm the agent."),
        ("user", "What is my name?"),
    ]
    stored = MemoryStore(cache=None).read_log("user-42", STREAM)
    assert [item.value["role"] for item in stored] == ["user", "assistant", "user", "assistant"]


def test_the_context_provider_brings_chosen_keys_and_matches_into_the_instructions():
    store = MemoryStore(cache=None, index=Index(embed=HashEmbedder(dims=32), dims=32))
    store.remember("user-42", "name", "Ada")
    store.remember("user-42", "pet", "a cat called Turing")
    store.remember("user-42", "car", "drives a red bicycle")
    store.remember("user-7", "name", "Grace")
    client = ScriptedChatClient(["Noted."])
    agent = Agent(
        client=client,
        instructions="Be brief.",
        context_providers=[AgentMemoryContextProvider(store=store, keys=["name"], limit=1)],
    )

    async def run() -> None:
        await agent.run("tell me about my cat", session=agent.create_session(session_id="user-42"))

    asyncio.run(run())
    (instructions,) = client.instructions
    assert "- name: Ada" in instructions
    assert "- pet: a cat called Turing" in instructions
    assert "bicycle" not in instructions and "Grace" not in instructions


def test_the_context_provider_reads_nothing_without_a_session_and_never_writes():
    store = MemoryStore(cache=None)
    store.remember("someone", "name", "Ada")
    provider = AgentMemoryContextProvider(store=store, keys=["name", "missing"])
    assert asyncio.run(provider.memories(None, "hello")) == []
    assert asyncio.run(provider.memories("someone", "hello")) == [("name", "Ada")]
    shared = AgentMemoryContextProvider(store=store, session_id="someone", keys=["name"])
    assert asyncio.run(shared.memories("another", "")) == [("name", "Ada")]
    assert [len(store.history("someone", "name"))] == [1]


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("session_id", "messages", "field"),
    [
        (None, [said("user", "x")], "session_id"),
        ("", [said("user", "x")], "session_id"),
        ("s", "hello", "messages"),
        ("s", [said("user", "x"), {"role": "user"}], r"messages\[1\]"),
    ],
)
def test_bad_input_to_save_names_the_field_and_changes_nothing(session_id, messages, field):
    provider = AgentMemoryHistoryProvider(store=MemoryStore(cache=None))
    with pytest.raises(InvalidMemory, match=f"^{field}: "):
        asyncio.run(provider.save_messages(session_id, messages))
    assert MemoryStore(cache=None).read_log("s", STREAM) == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"keys": "name"}, "keys"),
        ({"keys": [""]}, "key"),
        ({"limit": -1}, "limit"),
        ({"limit": "5"}, "limit"),
        ({"session_id": ""}, "session_id"),
        ({"title": 5}, "title"),
    ],
)
def test_a_context_provider_built_wrong_is_refused_naming_the_argument(kwargs, field):
    with pytest.raises(InvalidMemory, match=f"^{field}: "):
        AgentMemoryContextProvider(store=MemoryStore(cache=None), **kwargs)


def test_session_ids_that_differ_in_case_accent_or_trailing_space_are_other_sessions():
    provider = AgentMemoryHistoryProvider(store=MemoryStore(cache=None))
    ids = ["s", "S", "s ", "é", "e"]
    for session_id in ids:
        save(provider, session_id, [said("user", session_id)], {})
    assert [load(provider, session_id, {}) for session_id in ids] == [[("user", i)] for i in ids]


# ---------------------------------------------------------------------- concurrency


def test_savers_racing_with_one_transcript_append_each_message_once():
    """Six workers (threads, each its own connection) save the same growing transcript of one
    session at once, as processes serving one conversation after a retry would: every message
    lands once, in order (the framework's in-memory provider dedupes within one process's
    state only)."""
    transcript = [
        said("user" if n % 2 == 0 else "assistant", f"m{n}", message_id=f"id{n}") for n in range(12)
    ]

    def saver(worker: int) -> None:
        provider = AgentMemoryHistoryProvider(store=MemoryStore(cache=None))
        for end in range(2, 13, 2):
            asyncio.run(provider.save_messages("s", transcript[:end]))

    run_threads(saver, 6)
    stored = MemoryStore(cache=None).read_log("s", STREAM)
    assert [item.value["contents"][0]["text"] for item in stored] == [f"m{n}" for n in range(12)]
