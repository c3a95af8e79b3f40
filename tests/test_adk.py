"""agentmemory.integrations.adk: Google ADK's SessionService on the store -- run by ADK's own Runner
(a scripted model, no network), ADK's session cases, and the concurrency its own database service
got wrong (google/adk-python #4751 lost state under concurrent appends, #4954 create races,
#6272 unordered listings)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import connections
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from agentmemory import IdempotencyKeyReused, InvalidMemory, MemoryStore
from agentmemory.integrations import adk
from agentmemory.testing.adk import ScriptedLlm

from .conftest import redis_alias, run_threads

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _empty_cache_tier():
    """The services of these tests use the Redis tier: it starts each test empty, as the test
    database does (a tier never sees the tables emptied under it between tests)."""
    redis_alias()


def AgentMemorySessionService() -> adk.AgentMemorySessionService:
    """A service on the store with the Redis tier (the suite's own database)."""
    return adk.AgentMemorySessionService(MemoryStore(cache="agentmemory"))


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def said(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def event(text: str = "hi", delta: dict[str, Any] | None = None, **fields: Any) -> Event:
    return Event(
        author="user",
        invocation_id="inv",
        content=said(text),
        actions=EventActions(state_delta=delta or {}),
        **fields,
    )


# ---------------------------------------------------------------------- ADK's Runner


def test_a_multi_turn_run_of_adk_keeps_the_conversation_and_the_state():
    model = ScriptedLlm(model="scripted", replies=["Hello Ada.", "Your name is Ada."], seen=[])
    agent = LlmAgent(name="assistant", model=model, instruction="Be brief.", output_key="last")
    service = AgentMemorySessionService()
    runner = Runner(agent=agent, app_name="app", session_service=service)

    async def two_turns() -> list[str]:
        await service.create_session(app_name="app", user_id="ada", session_id="s1")
        answers = []
        for text in ("My name is Ada.", "What is my name?"):
            async for produced in runner.run_async(
                user_id="ada", session_id="s1", new_message=said(text)
            ):
                if produced.is_final_response():
                    answers.append(produced.content.parts[0].text)
        return answers

    assert run(two_turns()) == ["Hello Ada.", "Your name is Ada."]
    assert model.seen[1] == ["My name is Ada.", "Hello Ada.", "What is my name?"]
    stored = run(service.get_session(app_name="app", user_id="ada", session_id="s1"))
    assert [e.author for e in stored.events] == ["user", "assistant", "user", "assistant"]
    assert stored.state["last"] == "Your name is Ada."  # output_key, from the state delta


# ---------------------------------------------------------------------- ADK's session cases


def test_create_get_list_and_delete():
    service = AgentMemorySessionService()

    async def scenario() -> None:
        created = await service.create_session(app_name="app", user_id="u", state={"k": 1})
        assert created.id and created.state == {"k": 1}
        got = await service.get_session(app_name="app", user_id="u", session_id=created.id)
        assert got.state == {"k": 1} and got.events == []
        assert await service.get_session(app_name="app", user_id="u", session_id="none") is None
        assert (
            await service.get_session(app_name="app", user_id="other", session_id=created.id)
            is None
        )
        await service.delete_session(app_name="app", user_id="u", session_id=created.id)
        assert await service.get_session(app_name="app", user_id="u", session_id=created.id) is None
        assert (await service.list_sessions(app_name="app", user_id="u")).sessions == []

    run(scenario())


def test_state_prefixes_as_adk_defines_them():
    service = AgentMemorySessionService()

    async def scenario() -> None:
        s1 = await service.create_session(app_name="app", user_id="u", session_id="s1")
        await service.append_event(
            s1,
            event(delta={"app:theme": "dark", "user:lang": "en", "temp:scratch": 1, "n": 1}),
        )
        assert s1.state["temp:scratch"] == 1  # in the live object for this invocation
        s2 = await service.create_session(app_name="app", user_id="u", session_id="s2")
        other = await service.create_session(app_name="app", user_id="v", session_id="s3")
        assert s2.state == {"app:theme": "dark", "user:lang": "en"}  # app and user carry over
        assert other.state == {"app:theme": "dark"}  # user state is the user's
        again = await service.get_session(app_name="app", user_id="u", session_id="s1")
        assert again.state == {"app:theme": "dark", "user:lang": "en", "n": 1}  # no temp:
        assert "temp:scratch" not in again.events[0].actions.state_delta
        assert await service.get_user_state(app_name="app", user_id="u") == {"lang": "en"}

    run(scenario())


def test_get_session_config_filters_events():
    service = AgentMemorySessionService()

    async def scenario() -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(5):
            await service.append_event(session, event(str(i), timestamp=1000.0 + i))

        async def texts(config: GetSessionConfig) -> list[str]:
            got = await service.get_session(
                app_name="app", user_id="u", session_id="s", config=config
            )
            return [e.content.parts[0].text for e in got.events]

        assert await texts(GetSessionConfig(num_recent_events=2)) == ["3", "4"]
        assert await texts(GetSessionConfig(num_recent_events=0)) == []
        assert await texts(GetSessionConfig(after_timestamp=1002.0)) == ["2", "3", "4"]
        both = GetSessionConfig(after_timestamp=1001.0, num_recent_events=2)
        assert await texts(both) == ["3", "4"]
        # An event stamped before the last one, appended after it: kept in the log's order.
        await service.append_event(session, event("late", timestamp=1002.5))
        assert await texts(GetSessionConfig(after_timestamp=1002.2)) == ["3", "4", "late"]
        assert await texts(GetSessionConfig(after_timestamp=1003.5)) == ["4"]

    run(scenario())


def test_list_sessions_is_ordered_by_last_update_then_id():
    """google/adk-python #6272: list_sessions had no ORDER BY."""
    service = AgentMemorySessionService()

    async def scenario() -> list[tuple[str, str]]:
        for name in ("b", "a", "c"):
            await service.create_session(app_name="app", user_id="u", session_id=name)
        a = await service.get_session(app_name="app", user_id="u", session_id="a")
        await service.append_event(a, event())  # "a" is now the most recent
        await service.create_session(app_name="app", user_id="w", session_id="d")
        mine = await service.list_sessions(app_name="app", user_id="u")
        everyone = await service.list_sessions(app_name="app")
        assert [s.id for s in mine.sessions][-1] == "a"
        assert sorted(s.id for s in everyone.sessions) == ["a", "b", "c", "d"]
        return [(s.user_id, s.id) for s in mine.sessions]

    listed = run(scenario())
    assert [i for _, i in listed][:2] in (["b", "c"], ["c", "b"]) and {u for u, _ in listed} == {
        "u"
    }


def test_a_user_id_that_looks_like_a_prefix_of_another_is_apart():
    service = AgentMemorySessionService()

    async def scenario() -> None:
        await service.create_session(app_name="app", user_id='u"', session_id="x")
        await service.create_session(app_name="app", user_id="u", session_id="y")
        assert [
            s.id for s in (await service.list_sessions(app_name="app", user_id="u")).sessions
        ] == ["y"]

    run(scenario())


# ---------------------------------------------------------------------- stale writers, retries


def test_a_stale_writer_gets_adks_error_and_nothing_is_appended():
    service = AgentMemorySessionService()

    async def scenario() -> None:
        await service.create_session(app_name="app", user_id="u", session_id="s", state={"n": 0})
        mine = await service.get_session(app_name="app", user_id="u", session_id="s")
        theirs = await service.get_session(app_name="app", user_id="u", session_id="s")
        await service.append_event(theirs, event("theirs", {"n": theirs.state["n"] + 1}))
        with pytest.raises(StaleSessionError):
            await service.append_event(mine, event("mine", {"n": mine.state["n"] + 1}))
        now = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert [e.content.parts[0].text for e in now.events] == ["theirs"]
        assert now.state["n"] == 1

    run(scenario())


def test_the_same_event_appended_again_is_stored_once():
    service = AgentMemorySessionService()

    async def scenario() -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        once = event("once", {"k": "v"})
        await service.append_event(session, once)
        await service.append_event(session, once)  # the caller's retry after a timeout
        stale = await service.get_session(app_name="app", user_id="u", session_id="s")
        stale._storage_update_marker = "1"  # the object as it was before the first append
        await service.append_event(stale, once)
        stored = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert [e.id for e in stored.events] == [once.id]
        assert [e.id for e in session.events] == [once.id]
        assert [e.id for e in stale.events] == [once.id]

    run(scenario())


def test_an_event_id_reused_in_another_session_keeps_that_sessions_state_delta():
    """ADK's ids are the caller's: an event id seen in one session says nothing of another. The
    idempotency key was global ("e:" + id) and the second session's user: and app: changes were
    answered with the first's, never stored."""
    service = AgentMemorySessionService()

    async def scenario() -> None:
        first = await service.create_session(app_name="app", user_id="u", session_id="s1")
        second = await service.create_session(app_name="app", user_id="u", session_id="s2")
        await service.append_event(
            first, event("a", {"user:color": "red", "app:mode": "a", "n": 1}, id="E")
        )
        again = event("b", {"user:color": "blue", "app:mode": "b", "n": 2}, id="E")
        await service.append_event(second, again)
        await service.append_event(second, again)  # the caller's retry: stored once
        with pytest.raises(IdempotencyKeyReused, match="another request"):
            # Another event under that id in this session: refused, not taken for the first.
            await service.append_event(second, event("c", {"user:color": "green"}, id="E"))
        stored = await service.get_session(app_name="app", user_id="u", session_id="s2")
        assert [e.id for e in stored.events] == ["E"]
        assert (stored.state["user:color"], stored.state["app:mode"], stored.state["n"]) == (
            "blue",
            "b",
            2,
        )
        other = await service.get_session(app_name="app", user_id="u", session_id="s1")
        assert [e.id for e in other.events] == ["E"] and other.state["n"] == 1

    run(scenario())


def test_a_replay_by_a_stale_object_after_out_of_order_events_is_held_once():
    """The object's revision is older than the event's and its update time is before the
    event's (an event stamped earlier was appended after it): only the store can say that the
    append was a replay -- the object held the event twice when the adapter guessed from
    revisions and timestamps."""
    service = AgentMemorySessionService()

    async def scenario() -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        once = event("once", timestamp=2000.0)
        await service.append_event(session, once)
        await service.append_event(session, event("stamped earlier", timestamp=1000.0))
        stale = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert stale.last_update_time < once.timestamp
        stale._storage_update_marker = "1"  # as loaded before `once` was appended
        await service.append_event(stale, once)  # the caller's retry of `once`
        assert [e.id for e in stale.events].count(once.id) == 1
        stored = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert [e.id for e in stored.events].count(once.id) == 1

    run(scenario())


def test_an_append_to_a_deleted_session_is_refused():
    from google.adk.errors.session_not_found_error import SessionNotFoundError

    service = AgentMemorySessionService()

    async def scenario() -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        await service.delete_session(app_name="app", user_id="u", session_id="s")
        with pytest.raises((SessionNotFoundError, StaleSessionError)):
            await service.append_event(session, event())

    run(scenario())


# ---------------------------------------------------------------------- concurrency


def test_concurrent_create_session_with_one_id_makes_one_session():
    """google/adk-python #4954: SELECT-then-INSERT raised UniqueViolation under concurrency."""

    def create(worker: int) -> str:
        service = AgentMemorySessionService()
        try:
            run(
                service.create_session(
                    app_name="app", user_id="u", session_id="one", state={"by": worker}
                )
            )
            return "created"
        except AlreadyExistsError:
            return "exists"
        finally:
            connections.close_all()

    outcomes = run_threads(create, 6)
    assert sorted(outcomes) == ["created"] + ["exists"] * 5
    service = AgentMemorySessionService()
    assert len(run(service.list_sessions(app_name="app", user_id="u")).sessions) == 1


def increment_concurrently(make_store: Any, workers: int = 2, each: int = 20) -> tuple[int, list]:
    """Each worker reads the session, increments a counter in its state and appends that event;
    a stale one reloads and tries again. Returns the final count and the acknowledged events."""
    run(
        adk.AgentMemorySessionService(make_store()).create_session(
            app_name="app", user_id="u", session_id="s", state={"count": 0}
        )
    )

    def worker(number: int) -> list[str]:
        service = adk.AgentMemorySessionService(make_store())

        async def increments() -> list[str]:
            acknowledged = []
            for i in range(each):
                while True:
                    session = await service.get_session(app_name="app", user_id="u", session_id="s")
                    appended = event(f"{number}:{i}", {"count": session.state["count"] + 1})
                    try:
                        await service.append_event(session, appended)
                    except StaleSessionError:
                        continue
                    acknowledged.append(appended.id)
                    break
            return acknowledged

        try:
            return run(increments())
        finally:
            connections.close_all()

    acknowledged = [e for mine in run_threads(worker, workers) for e in mine]
    final = run(
        adk.AgentMemorySessionService(make_store()).get_session(
            app_name="app", user_id="u", session_id="s"
        )
    )
    assert sorted(e.id for e in final.events) == sorted(acknowledged)
    return final.state["count"], acknowledged


def test_two_services_appending_to_one_session_lose_no_state():
    """google/adk-python #4751 (and the issue's measure: DatabaseSessionService on SQLite lost
    8-12 of 40 acknowledged state deltas with two workers): every acknowledged increment is in
    the count, every acknowledged event stored once."""
    count, acknowledged = increment_concurrently(lambda: MemoryStore(cache="agentmemory"))
    assert count == len(acknowledged) == 40


@pytest.mark.server
def test_without_the_row_lock_acknowledged_increments_are_lost():
    """The same through the store's unsafe seam (its compare-and-set checks a read made before
    the lock): the check above can fail. On a server only: on SQLite the service's transaction
    begins with BEGIN IMMEDIATE, which serializes even the seam's unlocked read."""
    count, acknowledged = increment_concurrently(
        lambda: MemoryStore(cache=None, row_lock=False), workers=3
    )
    assert count < len(acknowledged) == 60, "without the row lock some increments must be lost"


# ---------------------------------------------------------------------- the memory service


def memory_service(**kwargs: Any) -> adk.AgentMemoryMemoryService:
    from agentmemory import Index
    from agentmemory.testing.embeddings import HashEmbedder

    index = Index(embed=HashEmbedder(dims=64), dims=64, fields=["text"])
    return adk.AgentMemoryMemoryService(MemoryStore(cache=None, index=index), **kwargs)


def spoken(text: str, author: str = "user") -> Event:
    return Event(author=author, invocation_id="inv", content=said(text))


def test_the_memory_service_finds_a_users_events_by_meaning():
    service = memory_service()
    sessions = adk.AgentMemorySessionService(service.store)

    async def scenario() -> None:
        session = await sessions.create_session(app_name="app", user_id="ada", session_id="s1")
        for text in ("I prefer window seats on long flights", "my cat is called Tom"):
            await sessions.append_event(session, spoken(text))
        await sessions.append_event(session, Event(author="user", invocation_id="inv"))  # no text
        await service.add_session_to_memory(session)
        other = await sessions.create_session(app_name="app", user_id="bob", session_id="s2")
        await sessions.append_event(other, spoken("window seats on flights, please"))
        await service.add_session_to_memory(other)

        found = await service.search_memory(app_name="app", user_id="ada", query="window seats")
        texts = [entry.content.parts[0].text for entry in found.memories]
        assert texts[0] == "I prefer window seats on long flights" and len(texts) == 2
        best = found.memories[0]
        assert best.author == "user" and best.id == session.events[0].id
        assert best.timestamp.startswith("20") and best.custom_metadata["session_id"] == "s1"
        assert await service.search_memory(app_name="other", user_id="ada", query="seats") == (
            type(found)(memories=[])
        )

    run(scenario())


def test_adding_a_session_again_writes_only_its_new_events_and_a_deleted_one_stays_deleted():
    service = memory_service()
    sessions = adk.AgentMemorySessionService(service.store)
    where = adk._memories("app", "ada")

    async def scenario() -> None:
        session = await sessions.create_session(app_name="app", user_id="ada", session_id="s")
        await sessions.append_event(session, spoken("the first thing"))
        await service.add_session_to_memory(session)
        await sessions.append_event(session, spoken("the second thing"))
        await service.add_session_to_memory(session)
        first, second = (event.id for event in session.events)
        assert [v.version for v in await service.store.ahistory(where, first)] == [1]
        assert await service.store.arecall(where, second) is not None

        await service.delete_memory(app_name="app", user_id="ada", memory_id=first)
        await service.add_session_to_memory(session)
        found = await service.search_memory(app_name="app", user_id="ada", query="the first thing")
        assert [entry.id for entry in found.memories] == [second]

        await service.add_events_to_memory(
            app_name="app", user_id="ada", events=[spoken("a third thing")], session_id="s"
        )
        found = await service.search_memory(app_name="app", user_id="ada", query="third")
        assert len(found.memories) == 2

    run(scenario())


def entry(text: str, **fields: Any) -> Any:
    from google.adk.memory.memory_entry import MemoryEntry

    return MemoryEntry(content=said(text), **fields)


def test_explicit_memories_are_kept_once_and_found_with_their_metadata():
    service = memory_service()
    where = adk._memories("app", "ada")

    async def scenario() -> None:
        memories = [
            entry(
                "Ada is allergic to peanuts", author="doctor", custom_metadata={"source": "form"}
            ),
            entry("Ada flies from Lyon", id="home-airport", timestamp="2026-12-01T10:00:00Z"),
        ]
        await service.add_memory(app_name="app", user_id="ada", memories=memories)
        await service.add_memory(app_name="app", user_id="ada", memories=memories)  # a retry
        found = await service.search_memory(app_name="app", user_id="ada", query="peanuts")
        best = found.memories[0]
        assert best.content.parts[0].text == "Ada is allergic to peanuts"
        assert best.author == "doctor" and best.custom_metadata["source"] == "form"
        assert best.id.startswith("entry-")
        assert [v.version for v in await service.store.ahistory(where, best.id)] == [1]
        assert [v.version for v in await service.store.ahistory(where, "home-airport")] == [1]
        airport = await service.search_memory(app_name="app", user_id="ada", query="Lyon")
        assert airport.memories[0].timestamp == "2026-12-01T10:00:00Z"
        # Another user's memories are their own.
        assert (
            await service.search_memory(app_name="app", user_id="bob", query="Lyon")
        ).memories == []

    run(scenario())


def test_memory_ids_that_differ_only_in_case_accents_or_a_space_are_three_memories():
    service = memory_service()
    where = adk._memories("app", "ada")
    ids = ["home", "Home", "home ", "hôme"]
    memories = [entry(f"Ada's home number {n}", id=i) for n, i in enumerate(ids)]
    run(service.add_memory(app_name="app", user_id="ada", memories=memories))
    stored = service.store.recall_many(where)
    assert sorted(stored) == sorted(ids)
    assert stored["home "].value["text"] == "Ada's home number 2"


@pytest.mark.parametrize(
    "memories, named",
    [
        ("Ada flies from Lyon", "memories"),  # a str where a list belongs
        ([{"content": "Ada"}], "MemoryEntry"),  # a dict, not an entry
        ([None], "MemoryEntry"),
    ],
)
def test_add_memory_refuses_what_is_not_a_list_of_entries(memories, named):
    with pytest.raises(InvalidMemory, match=named):
        run(memory_service().add_memory(app_name="app", user_id="ada", memories=memories))


def test_an_entry_without_text_or_with_a_bad_id_writes_nothing_of_the_call():
    from google.adk.memory.memory_entry import MemoryEntry

    service = memory_service()
    where = adk._memories("app", "ada")
    empty = MemoryEntry(content=types.Content(role="user", parts=[]))
    with pytest.raises(InvalidMemory, match="entry 1 has no text"):
        run(
            service.add_memory(
                app_name="app", user_id="ada", memories=[entry("kept?", id="a"), empty]
            )
        )
    with pytest.raises(InvalidMemory, match="key"):
        run(
            service.add_memory(
                app_name="app",
                user_id="ada",
                memories=[entry("kept?", id="b"), entry("x", id="bad\nid")],
            )
        )
    assert service.store.recall_many(where) == {}


def test_the_memory_service_needs_the_semantic_index():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="SEARCH"):
        adk.AgentMemoryMemoryService(MemoryStore(cache=None))
    with pytest.raises(InvalidMemory, match="memory_id"):
        run(memory_service().delete_memory(app_name="app", user_id="u"))


def test_a_create_and_an_append_whose_commit_answer_was_lost_are_stored_once():
    """The server committed, the client saw a dropped connection (``lose_commit_answer``): the
    retry finds the session's head written under the call's idempotency key and writes nothing
    more -- each state key once, the event once (the state keys carry no key of their own)."""
    from agentmemory.defects import lose_commit_answer

    service = AgentMemorySessionService()
    store = service.store

    async def scenario() -> None:
        state = {"k": 1, "app:a": 1, "user:b": 1}
        with lose_commit_answer():
            session = await service.create_session(
                app_name="app", user_id="u", session_id="s", state=state
            )
        assert session.state == state
        once = event("once", {"k": 2, "user:b": 2})
        with lose_commit_answer():
            await service.append_event(session, once)
        stored = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert [e.id for e in stored.events] == [once.id]
        assert stored.state == {"k": 2, "app:a": 1, "user:b": 2}

    run(scenario())
    versions = {
        owner: {k: [v.version for v in store.history(owner, k)] for k in store.recall_many(owner)}
        for owner in (adk._session("app", "u", "s"), adk._app("app"), adk._user("app", "u"))
    }
    assert list(versions.values()) == [{"k": [1, 2]}, {"a": [1]}, {"b": [1, 2]}]
