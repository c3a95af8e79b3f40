"""agentmemory.integrations.openai_agents: the OpenAI Agents SDK's Session on a log of the store --
run by the SDK's own Runner (a scripted model, no network), the SDK's session cases, and the
concurrency its own backends got wrong (openai-agents-python #4988, #1900, #1658)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.memory import Session
from agents.memory.session_settings import SessionSettings
from django.db import connections, transaction

from agentmemory import InvalidMemory, MemoryStore
from agentmemory.integrations.openai_agents import STREAM, AgentMemorySession
from agentmemory.models import Log
from agentmemory.testing.openai_agents import ScriptedModel

from .conftest import run_threads

pytestmark = pytest.mark.django_db(transaction=True)
set_tracing_disabled(True)  # tracing would export to OpenAI: no network in the suite


def contents(items: list[Any]) -> list[Any]:
    """What each item said: a user's string, or an assistant message's text."""
    said = []
    for item in items:
        content = item.get("content")
        said.append(content if isinstance(content, str) else content[0]["text"])
    return said


def test_a_multi_turn_run_of_the_sdk_keeps_the_conversation():
    model = ScriptedModel(["Hi! I'm the agent.", "You said your name is Ada."])
    agent = Agent(name="assistant", instructions="Be brief.", model=model)
    session = AgentMemorySession("user-42")

    async def two_turns() -> list[str]:
        first = await Runner.run(agent, "Hello, my name is Ada.", session=session)
        second = await Runner.run(agent, "What is my name?", session=session)
        return [first.final_output, second.final_output]

    assert asyncio.run(two_turns()) == ["Hi! I'm the agent.", "You said your name is Ada."]
    # The second turn's model saw the first turn, read back from the database.
    assert contents(model.inputs[1]) == [
        "Hello, my name is Ada.",
        "Hi! I'm the agent.",
        "What is my name?",
    ]
    stored = MemoryStore(cache=None).read_log("user-42", STREAM)
    assert [item.seq for item in stored] == [1, 2, 3, 4]
    assert contents([item.value for item in stored])[-1] == "You said your name is Ada."


def test_it_is_a_session_of_the_sdk():
    session = AgentMemorySession("s", session_settings={"limit": 3})
    assert isinstance(session, Session)
    assert session.session_settings == SessionSettings(limit=3)
    assert AgentMemorySession("s").session_settings.limit is None


# ---------------------------------------------------------------------- the SDK's session cases
# As the SDK's tests of SQLiteSession (tests/test_session.py) check them.


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_add_get_pop_and_clear():
    session = AgentMemorySession("case")
    items = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"}]

    async def scenario() -> None:
        await session.add_items(items)
        assert await session.get_items() == items
        assert await session.pop_item() == items[1]
        assert await session.get_items() == items[:1]
        await session.add_items([])  # nothing
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None

    run(scenario())


def test_get_items_limit_returns_the_latest_in_order():
    session = AgentMemorySession("limits", session_settings=SessionSettings(limit=2))
    items = [{"role": "user", "content": f"m{i}"} for i in range(5)]

    async def scenario() -> None:
        await session.add_items(items)
        assert await session.get_items() == items[-2:]  # the settings' limit
        assert await session.get_items(limit=3) == items[-3:]  # an explicit one wins
        assert await session.get_items(limit=0) == []
        assert await session.get_items(limit=-1) == items  # SQLite's negative LIMIT: all
        assert await session.get_items(limit=100) == items

    run(scenario())


def test_sessions_are_isolated_by_id_and_stream():
    async def scenario() -> None:
        a, b = AgentMemorySession("a"), AgentMemorySession("b")
        other = AgentMemorySession("a", stream="another-agent")
        await a.add_items([{"role": "user", "content": "for a"}])
        await b.add_items([{"role": "user", "content": "for b"}])
        assert contents(await a.get_items()) == ["for a"]
        assert await other.get_items() == []
        await b.clear_session()
        assert contents(await a.get_items()) == ["for a"]

    run(scenario())


def test_bad_session_ids_and_items_are_refused_before_anything_is_written():
    with pytest.raises(InvalidMemory, match="session_id"):
        AgentMemorySession("")
    session = AgentMemorySession("s")
    with pytest.raises(InvalidMemory, match=r"items\[1\]"):
        run(session.add_items([{"role": "user", "content": "ok"}, {"content": b"bytes"}]))
    assert not Log.objects.exists()


# ---------------------------------------------------------------------- concurrency


def test_concurrent_pops_never_return_the_same_item():
    """openai-agents-python #4988: concurrent pop_item calls returned one item twice."""
    session = AgentMemorySession("pops")
    run(session.add_items([{"role": "user", "content": str(i)} for i in range(100)]))

    async def popper() -> list[str]:
        popped = []
        while (item := await session.pop_item()) is not None:
            popped.append(item["content"])
        return popped

    async def four_poppers() -> list[list[str]]:
        return await asyncio.gather(*(popper() for _ in range(4)))

    popped = [c for mine in run(four_poppers()) for c in mine]
    assert sorted(popped, key=int) == [str(i) for i in range(100)]


def test_concurrent_writers_from_threads_keep_every_item_once_and_in_their_order():
    def writer(worker: int) -> None:
        session = AgentMemorySession("threads")

        async def adds() -> None:
            for i in range(50):
                await session.add_items([{"role": "user", "content": f"{worker}:{i}"}])

        asyncio.run(adds())

    run_threads(writer, 8)
    stored = contents(run(AgentMemorySession("threads").get_items()))
    assert len(stored) == 400
    for worker in range(8):
        mine = [int(c.split(":")[1]) for c in stored if c.startswith(f"{worker}:")]
        assert mine == list(range(50))


# ---------------------------------------------------------------------- cancellation


class Announcing(dict):
    """An item that tells when the store's validation reached it -- on the pool thread, so
    the write is running there."""

    def __init__(self, content: dict[str, Any], reached: threading.Event) -> None:
        super().__init__(content)
        self.reached = reached

    def items(self):  # the store's validation walks each object's items
        self.reached.set()
        return super().items()


def test_a_cancelled_add_items_is_finished_before_the_cancellation_returns():
    """openai-agents-python #1658: the write ran on after the caller saw its add_items
    cancelled. Here the log's lock is held by another transaction while the cancellation
    comes; the lock is released a moment after: the caller's CancelledError must come only
    once the write is done, all of it."""
    session = AgentMemorySession("cancelled")
    run(session.add_items([{"role": "user", "content": "before"}]))
    locked, release = threading.Event(), threading.Event()

    def hold_the_log() -> None:
        with transaction.atomic():
            list(Log.objects.select_for_update().filter(session_id="cancelled"))
            Log.objects.filter(session_id="cancelled").update(length=1)  # SQLite: a write lock
            locked.set()
            release.wait(30)
        connections.close_all()

    holder = threading.Thread(target=hold_the_log)
    holder.start()
    locked.wait(30)
    reached = threading.Event()
    batch = [
        Announcing({"role": "user", "content": "one"}, reached),
        {"role": "user", "content": "two"},
        {"role": "user", "content": "three"},
    ]

    async def cancel_it_mid_write() -> list[Any]:
        task = asyncio.create_task(session.add_items(batch))
        await asyncio.to_thread(reached.wait, 30)
        task.cancel()
        threading.Timer(0.5, release.set).start()  # the lock goes a moment after the cancel
        with pytest.raises(asyncio.CancelledError):
            await task
        # What the caller sees right when the cancellation reached it:
        return contents(await AgentMemorySession("cancelled").get_items())

    try:
        seen = run(cancel_it_mid_write())
    finally:
        release.set()
        holder.join(30)
    assert seen == ["before", "one", "two", "three"]


# ---------------------------------------------------------------------- compaction (#45, item 4)


class FakeCompactingClient:
    """``client.responses.compact`` as the SDK calls it: the whole input becomes one summary
    message (records what it was given)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.responses = self

    async def compact(self, **kwargs: Any) -> Any:
        from types import SimpleNamespace

        self.calls.append(kwargs)
        summary = {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": f"summary of {len(kwargs.get('input', []))}"}
            ],
        }
        return SimpleNamespace(output=[summary], usage=None)


def user_items(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text} for text in texts]


def test_the_sdks_compaction_session_replaces_the_history_at_once():
    """``OpenAIResponsesCompactionSession`` over ours: a forced compaction goes through the
    atomic replacement hook -- one clear and one append, committed together."""
    from agents.memory import OpenAIResponsesCompactionSession

    class Watched(AgentMemorySession):
        replaced: list[int] = []

        async def _atomic_replace_items(self, items: list[Any]) -> bool:
            self.replaced.append(len(items))
            return await super()._atomic_replace_items(items)

    session = Watched("compact-1")
    asyncio.run(session.add_items(user_items("a", "b", "c")))
    client = FakeCompactingClient()
    compacting = OpenAIResponsesCompactionSession("compact-1", session, client=client)
    asyncio.run(compacting.run_compaction({"force": True}))
    assert Watched.replaced == [1]  # the SDK took the atomic path, not a clear and an add
    assert contents(asyncio.run(session.get_items())) == ["summary of 3"]
    events = [e.op for e in MemoryStore(cache=None).log_history("compact-1", STREAM)]
    assert events == ["append", "clear", "append"]


def test_a_compaction_snapshot_is_replaced_only_while_it_is_still_the_end_of_the_log():
    session = AgentMemorySession("compact-2")
    asyncio.run(session.add_items(user_items("a", "b", "c", "d")))
    snapshot = asyncio.run(session._get_compaction_snapshot(3))
    assert contents(snapshot.items) == ["b", "c", "d"] and snapshot.complete is False
    # Another writer adds an item: the snapshot's suffix is no longer the end -- nothing
    # replaced, the new item kept.
    asyncio.run(AgentMemorySession("compact-2").add_items(user_items("e")))
    summary = user_items("summary")
    assert asyncio.run(snapshot.replace_suffix(1, summary)) is False
    assert contents(asyncio.run(session.get_items())) == ["a", "b", "c", "d", "e"]
    fresh = asyncio.run(session._get_compaction_snapshot(10))
    assert fresh.complete is True
    assert asyncio.run(fresh.replace_suffix(3, summary)) is True
    assert contents(asyncio.run(session.get_items())) == ["a", "b", "c", "summary"]

    def drop_a(item: dict[str, Any]) -> bool:
        return item.get("content") == "a"

    last = asyncio.run(session._get_compaction_snapshot(10, prune_prefix=drop_a))
    assert asyncio.run(last.replace_suffix(2, user_items("s3"))) is True
    assert contents(asyncio.run(session.get_items())) == ["b", "s3"]
    assert asyncio.run(AgentMemorySession("empty")._get_compaction_snapshot(5)).items == []


def test_a_reader_never_sees_a_compaction_half_done():
    """One thread replaces the history again and again (the hook compaction uses), others
    read it: every read is the whole old history or the whole new one -- the SDK's fallback,
    a clear and then an add, shows readers an empty session between them."""
    old, new = user_items(*"abcde"), user_items("summary")
    session = AgentMemorySession("compact-3")
    asyncio.run(session.add_items(old))
    done = threading.Event()

    def work(worker: int) -> list[int]:
        sizes = []
        if worker == 0:
            for n in range(30):
                asyncio.run(session._atomic_replace_items(new if n % 2 == 0 else old))
            done.set()
        else:
            reader = AgentMemorySession("compact-3")
            while not done.is_set():
                sizes.append(len(asyncio.run(reader.get_items())))
        return sizes

    seen = {size for sizes in run_threads(work, 3) for size in sizes}
    assert seen and seen <= {1, 5}, seen
