"""The framework adapters on a ShardedStore (agentmemory.sharding): LangGraph's checkpointer with
each thread's chains on its thread id's shard (LangGraph's own conformance suite runs on it too:
tests/test_langgraph_conformance.py), a listing of every thread merged from the shards, copies
between shards, deletes and prunes on every shard, no fork; the LangGraph store, the Agents SDK
session and LlamaIndex's chat store routed by session; ADK's session service refused, naming the
way. The shards are the suite's two databases, ``default`` and ``other``."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from agentmemory import CheckpointConflict, InvalidMemory, ShardedStore
from agentmemory.integrations.adk import AgentMemorySessionService
from agentmemory.integrations.langgraph import AgentMemorySaver, AgentMemoryStore
from agentmemory.integrations.openai_agents import AgentMemorySession
from agentmemory.models import Checkpoint, CheckpointThread, Log
from agentmemory.records import CHECKPOINT_PAGE
from agentmemory.sharding import forget_checked

from .test_langgraph_checkpointer import children, config, put_step, race_two_writers

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])

SHARDS = ["default", "other"]


@pytest.fixture(autouse=True)
def _checked_again():
    forget_checked()


@pytest.fixture
def sharded() -> ShardedStore:
    return ShardedStore(SHARDS, cache=None)


def thread_on(store: ShardedStore, alias: str, stem: str = "thread") -> str:
    return next(
        f"{stem}-{n}" for n in range(100) if store.checkpoints.alias(f"{stem}-{n}") == alias
    )


def stored_pairs(alias: str) -> Counter:
    heads = dict(CheckpointThread.objects.using(alias).values_list("id", "thread_id"))
    return Counter(
        (heads[head], checkpoint_id)
        for head, checkpoint_id in Checkpoint.objects.using(alias).values_list(
            "thread_id", "checkpoint_id"
        )
    )


def listed_pairs(saver: AgentMemorySaver, **kwargs) -> list[tuple[str, str]]:
    return [
        (found.config["configurable"]["thread_id"], found.config["configurable"]["checkpoint_id"])
        for found in saver.list(None, **kwargs)
    ]


def test_a_listing_of_every_thread_merges_the_shards_newest_first_across_pages(sharded):
    saver = AgentMemorySaver(sharded)
    threads = [f"thread-{n}" for n in range(60)]
    for thread in threads:
        loaded = put_step(saver, config(thread), 1)
        put_step(saver, loaded, 2)
    for thread in threads:  # every thread's chain is on its shard alone
        home = sharded.checkpoints.alias(thread)
        assert {t for t, _ in stored_pairs(home)} >= {thread}
        assert thread not in {t for t, _ in stored_pairs(next(a for a in SHARDS if a != home))}
    # Copies of threads of each shard onto the other: the same checkpoint ids on both shards.
    for alias in SHARDS:
        source = thread_on(sharded, alias)
        target = thread_on(sharded, next(a for a in SHARDS if a != alias), stem=f"copy-{alias}")
        saver.copy_thread(source, target)
    stored = stored_pairs("default") + stored_pairs("other")
    assert sum(stored.values()) > CHECKPOINT_PAGE  # the listing takes more than one page
    listed = listed_pairs(saver)
    assert Counter(listed) == stored  # none missing, none twice
    ids = [checkpoint_id for _, checkpoint_id in listed]
    assert ids == sorted(ids, reverse=True)  # newest first, across the shards
    assert listed_pairs(saver, filter={"step": 0}) == listed  # filtered: pages of 100
    assert listed_pairs(saver, limit=7) == listed[:7]
    before = {"configurable": {"checkpoint_id": ids[50]}}
    assert listed_pairs(saver, before=before) == [p for p in listed if p[1] < ids[50]]


def test_a_listing_page_that_ends_between_two_copies_of_one_checkpoint(sharded):
    """One checkpoint id on both shards (a copy), with exactly a page less one newer: the first
    page ends on the first copy; the next must begin with the other shard's."""
    saver = AgentMemorySaver(sharded)
    source = thread_on(sharded, "default", stem="first")
    put_step(saver, config(source), "root")
    saver.copy_thread(source, thread_on(sharded, "other", stem="copy"))
    newer = 0
    while newer < CHECKPOINT_PAGE - 1:
        put_step(saver, config(f"newer-{newer}"), newer)
        newer += 1
    listed = listed_pairs(saver)
    assert Counter(listed) == stored_pairs("default") + stored_pairs("other")
    assert len(listed) == CHECKPOINT_PAGE + 1
    assert listed[CHECKPOINT_PAGE - 1][1] == listed[CHECKPOINT_PAGE][1]  # the boundary's pair


def test_a_thread_copied_to_a_thread_on_another_shard(sharded):
    saver = AgentMemorySaver(sharded)
    source = thread_on(sharded, "default")
    target = thread_on(sharded, "other", stem="target")
    loaded = put_step(saver, config(source), "root")
    latest = put_step(saver, loaded, "next")
    saver.put_writes(latest, [("value", "pending")], "task-1")
    saver.copy_thread(source, target)
    original, copy = saver.get_tuple(config(source)), saver.get_tuple(config(target))
    assert copy.checkpoint == original.checkpoint
    assert copy.pending_writes == original.pending_writes == [("task-1", "value", "pending")]
    assert [t.checkpoint["id"] for t in saver.list(config(target))] == [
        t.checkpoint["id"] for t in saver.list(config(source))
    ]
    assert {t for t, _ in stored_pairs("other")} == {target}


def test_deletes_and_prunes_reach_every_shard(sharded):
    saver = AgentMemorySaver(sharded)
    threads = [thread_on(sharded, alias, stem=f"run-{alias}") for alias in SHARDS]
    for thread in threads:
        loaded = put_step(saver, config(thread), "root")
        put_step(saver, loaded, "next")
    saver.prune(threads, strategy="keep_latest")
    assert [len(list(saver.list(config(thread)))) for thread in threads] == [1, 1]
    for thread in threads:
        saver.put(
            saver.get_tuple(config(thread)).config,
            {**saver.get_tuple(config(thread)).checkpoint, "id": f"run-{thread}"},
            {"source": "loop", "step": 1, "parents": {}, "run_id": "r-1"},
            {},
        )
    saver.delete_for_runs(["r-1"])
    assert [len(list(saver.list(config(thread)))) for thread in threads] == [1, 1]
    saver.delete_thread(threads[1])
    assert stored_pairs("other") == Counter() and len(stored_pairs("default")) == 1


def test_two_writers_of_one_thread_on_its_shard_never_fork(sharded):
    saver = AgentMemorySaver(sharded)
    for alias in SHARDS:
        thread = thread_on(sharded, alias, stem="race")
        put_step(saver, config(thread), "root")
        outcomes = race_two_writers(saver, thread)
        assert sum(isinstance(o, CheckpointConflict) for o in outcomes) == 1, outcomes
        assert max(children(saver, thread).values()) == 1


def test_the_langgraph_store_lists_and_searches_every_shard_in_order(sharded):
    store = AgentMemoryStore(store=sharded)
    namespaces = [("users", f"u{n}") for n in range(12)]
    for namespace in namespaces:
        store.put(namespace, "a", {"n": namespace[1]})
        store.put(namespace, "b", {"n": namespace[1]})
    found = [(item.namespace, item.key) for item in store.search(("users",), limit=100)]
    assert found == sorted((ns, key) for ns in namespaces for key in "ab")
    assert store.list_namespaces(prefix=("users",)) == sorted(namespaces)
    assert store.search(("users",), limit=3, offset=4) == store.search(("users",), limit=100)[4:7]
    assert all(store_rows(alias) for alias in SHARDS)  # the namespaces are on both shards


def store_rows(alias: str) -> bool:
    from agentmemory.models import Memory

    return Memory.objects.using(alias).exists()


def test_an_agents_sdk_session_lives_on_its_sessions_shard(sharded):
    sessions = {alias: None for alias in SHARDS}
    for n in range(50):
        alias = sharded.place(f"user-{n}")
        sessions[alias] = sessions[alias] or f"user-{n}"
    for alias, session_id in sessions.items():
        session = AgentMemorySession(session_id, store=sharded)
        asyncio.run(session.add_items([{"role": "user", "content": alias}]))
        assert asyncio.run(session.get_items()) == [{"role": "user", "content": alias}]
        assert set(Log.objects.using(alias).values_list("session_id", flat=True)) == {session_id}


def test_adks_session_service_refuses_a_sharded_store_naming_the_way(sharded):
    with pytest.raises(InvalidMemory, match=r"store\.shard\(app_name\)") as refused:
        AgentMemorySessionService(store=sharded)
    assert refused.value.field == "store"
    service = AgentMemorySessionService(store=sharded.shard("my-app"))
    created = asyncio.run(service.create_session(app_name="my-app", user_id="u"))
    assert created.app_name == "my-app"


def test_keep_latest_over_shards_refuses_a_delta_thread_and_prunes_nothing_anywhere(sharded):
    """As on one database: a ``DeltaChannel`` thread on one shard refuses the whole prune --
    the plain thread on the shard asked first keeps every checkpoint."""
    from .test_langgraph_delta import delta_graph

    saver = AgentMemorySaver(sharded)
    plain = thread_on(sharded, "default", stem="plain")
    delta = thread_on(sharded, "other", stem="delta")
    graph = delta_graph(saver)
    for n in range(3):
        graph.invoke({"n": n}, config(delta))
    loaded = put_step(saver, config(plain), "root")
    put_step(saver, loaded, "next")
    with pytest.raises(NotImplementedError, match=delta):
        saver.prune([plain, delta], strategy="keep_latest")
    assert len(list(saver.list(config(plain)))) == 2
    saver.prune([plain], strategy="keep_latest")
    assert len(list(saver.list(config(plain)))) == 1


@pytest.mark.parametrize(
    "twins",
    [("Thread", "thread"), ("café", "cafe"), ("t", "t ")],
    ids=["case", "accent", "trailing-space"],
)
def test_thread_ids_that_differ_in_case_accents_or_spaces_are_distinct_threads(sharded, twins):
    saver = AgentMemorySaver(sharded)
    for value, thread in enumerate(twins):
        put_step(saver, config(thread), value)
    for value, thread in enumerate(twins):
        (only,) = saver.list(config(thread))
        assert only.checkpoint["channel_values"] == {"value": value}
        home = sharded.checkpoints.alias(thread)
        assert {t for t, _ in stored_pairs(home)} >= {thread}
        assert thread not in {t for t, _ in stored_pairs(next(a for a in SHARDS if a != home))}


def test_a_str_where_a_list_of_ids_belongs_is_refused_on_shards_too(sharded):
    saver = AgentMemorySaver(sharded)
    put_step(saver, config("abc"), 1)
    for call in (
        lambda: saver.prune("abc", strategy="keep_latest"),
        lambda: saver.delete_for_runs("run-1"),
    ):
        with pytest.raises(InvalidMemory, match="single str"):
            call()
    assert len(list(saver.list(config("abc")))) == 1
