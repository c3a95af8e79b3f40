"""LangGraph's ``DeltaChannel`` on AgentMemorySaver: ``get_delta_channel_history`` read in a few
statements (instead of LangGraph's default, a ``get_tuple`` per ancestor) and equal to that
default on real graphs, forks, long chains and looping parents; and ``prune(keep_latest)``
refusing a thread whose channels are rebuilt from their history."""

from __future__ import annotations

import asyncio
import math
from typing import Annotated, Any, TypedDict

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.graph import END, START, StateGraph

from agentmemory import InvalidMemory
from agentmemory.checkpoints import BRANCHES, DELTA_FIRST_PAGE, DELTA_PAGE, WHOLE_READS
from agentmemory.integrations.langgraph import AgentMemorySaver
from agentmemory.models import Checkpoint

from .test_langgraph_checkpointer import config, read_while_deleted

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def saver() -> AgentMemorySaver:
    return AgentMemorySaver()


def langgraphs_walk(saver: AgentMemorySaver, cfg: dict[str, Any], channels: list[str]) -> Any:
    """LangGraph's own answer: the base class's walk, one ``get_tuple`` per ancestor."""
    return BaseCheckpointSaver.get_delta_channel_history(saver, config=cfg, channels=channels)


def appended(state: list[int] | None, writes: list[list[int]]) -> list[int]:
    return [*(state or []), *(item for write in writes for item in write)]


class State(TypedDict):
    items: Annotated[list, DeltaChannel(appended, snapshot_frequency=4)]
    n: int


def delta_graph(saver: AgentMemorySaver) -> Any:
    def step(state: State) -> dict[str, Any]:
        return {"items": [state["n"]], "n": state["n"] + 1}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


def test_a_delta_graphs_history_is_langgraphs_own_at_every_checkpoint_of_a_forked_thread(saver):
    graph = delta_graph(saver)
    cfg = config("delta-forked")
    for n in range(15):
        graph.invoke({"n": n * 10}, cfg)
    assert graph.get_state(cfg).values["items"] == [n * 10 for n in range(15)]
    # Time travel: go on from the state after the 6th run -- a fork the walk must not cross.
    past = [s for s in graph.get_state_history(cfg) if s.values.get("items") == [0, 10, 20, 30]]
    forked = graph.invoke({"n": 999}, past[0].config)
    assert forked["items"] == [0, 10, 20, 30, 999]

    checked = 0
    for found in saver.list(cfg):
        ours = saver.get_delta_channel_history(config=found.config, channels=["items", "n"])
        assert ours == langgraphs_walk(saver, found.config, ["items", "n"])
        checked += 1
    assert checked > 40
    # And the thread's latest, named by its thread alone, is the fork's.
    latest = saver.get_delta_channel_history(config=cfg, channels=["items"])
    assert latest == langgraphs_walk(saver, cfg, ["items"])
    assert graph.get_state(cfg).values["items"] == [0, 10, 20, 30, 999]


def put(saver: AgentMemorySaver, thread: str, parent: str | None, number: int, value: Any) -> str:
    """A checkpoint whose channel ``items`` gets a new version: its value stored (``value``
    given) or not (a DeltaChannel's step), and one pending write to ``items``."""
    checkpoint = empty_checkpoint()
    checkpoint["id"] = f"{number:08d}"
    version = f"{number:08d}"
    if value is not None:
        checkpoint["channel_values"] = {"items": value}
    checkpoint["channel_versions"] = {"items": version}
    returned = saver.put(config(thread, parent), checkpoint, {"step": number}, {"items": version})
    checkpoint_id = returned["configurable"]["checkpoint_id"]
    saver.put_writes(config(thread, checkpoint_id), [("items", [number])], f"task-{number}")
    return checkpoint_id


def test_a_walk_past_several_pages_is_a_few_statements_and_langgraphs_answer(saver):
    length = DELTA_FIRST_PAGE + DELTA_PAGE + 10
    parent = put(saver, "delta-long", None, 0, ["seed"])
    for number in range(1, length):
        parent = put(saver, "delta-long", parent, number, None)
    target = config("delta-long", parent)

    with CaptureQueriesContext(connection) as queries:
        ours = saver.get_delta_channel_history(config=target, channels=["items"])
    assert ours["items"]["seed"] == ["seed"]
    # The seed's own write and every later ancestor's; the target's own are not the walk's.
    assert [write[2] for write in ours["items"]["writes"]] == [[n] for n in range(length - 1)]
    assert ours == langgraphs_walk(saver, target, ["items"])
    # Three pages, each one statement (the MySQL family: then its blobs' lookups, BRANCHES a
    # statement), then the writes, then a look that the thread is still there -- where
    # LangGraph's walk is a get_tuple per ancestor.
    lookups = 0 if connection.vendor in WHOLE_READS else math.ceil((DELTA_PAGE + 1) / BRANCHES)
    assert len(queries) <= 3 * (1 + lookups) + 2, [q["sql"][:80] for q in queries]


def test_a_channel_never_stored_walks_to_the_root_and_has_no_seed(saver):
    parent = None
    for number in range(5):
        parent = put(saver, "delta-rootless", parent, number, None)
    ours = saver.get_delta_channel_history(config=config("delta-rootless"), channels=["items"])
    assert "seed" not in ours["items"]
    assert [write[2] for write in ours["items"]["writes"]] == [[0], [1], [2], [3]]
    assert ours == langgraphs_walk(saver, config("delta-rootless"), ["items"])


def test_parents_that_loop_end_the_walk(saver):
    first = put(saver, "delta-loop", None, 1, None)
    second = put(saver, "delta-loop", first, 2, None)
    # The first checkpoint put again under the second: a stored id is rewritten, so the
    # chain's parents now loop (LangGraph's own walk would never end here).
    checkpoint = empty_checkpoint()
    checkpoint["id"] = first
    checkpoint["channel_versions"] = {"items": "00000001"}
    saver.put(config("delta-loop", second), checkpoint, {}, {})
    ours = saver.get_delta_channel_history(config=config("delta-loop", second), channels=["items"])
    assert ours == {"items": {"writes": [("task-1", "items", [1])]}}


def test_channels_are_matched_exactly_and_asked_for_as_a_list(saver):
    parent = put(saver, "delta-names", None, 0, ["seed"])
    child = put(saver, "delta-names", parent, 1, None)
    saver.put_writes(
        config("delta-names", parent),
        [("Items", ["case"]), ("items ", ["space"]), ("ítems", ["accent"])],
        "other-task",
    )
    found = saver.get_delta_channel_history(config=config("delta-names", child), channels=["items"])
    assert found == {"items": {"writes": [("task-0", "items", [0])], "seed": ["seed"]}}
    both = saver.get_delta_channel_history(
        config=config("delta-names", child), channels=["items", "Items", "items"]
    )
    assert both == langgraphs_walk(saver, config("delta-names", child), ["items", "Items"])
    assert both["Items"] == {"writes": [("other-task", "Items", ["case"])]}

    assert saver.get_delta_channel_history(config=config("delta-names"), channels=[]) == {}
    assert saver.get_delta_channel_history(config=config("nowhere"), channels=["items"]) == {
        "items": {"writes": []}
    }
    for bad, field in [("items", "channels"), ({"items"}, "channels"), ([3], "channel")]:
        with pytest.raises(InvalidMemory) as refused:
            saver.get_delta_channel_history(config=config("delta-names"), channels=bad)
        assert field in str(refused.value)
    with pytest.raises(InvalidMemory):
        saver.get_delta_channel_history(config={"configurable": {}}, channels=["items"])


def test_the_async_history_is_the_synchronous_one(saver):
    graph = delta_graph(saver)
    cfg = config("delta-async")
    for n in range(6):
        graph.invoke({"n": n}, cfg)
    ours = asyncio.run(saver.aget_delta_channel_history(config=cfg, channels=["items"]))
    assert ours == saver.get_delta_channel_history(config=cfg, channels=["items"])
    assert ours == langgraphs_walk(saver, cfg, ["items"])


def test_keep_latest_refuses_a_delta_thread_and_prunes_nothing(saver):
    graph = delta_graph(saver)
    for n in range(6):
        graph.invoke({"n": n}, config("delta-pruned"))
        graph.invoke({"n": n}, config("plain-pruned"))
    plain_metadata = {"source": "loop", "step": 0, "parents": {}}
    parent = None
    for number in range(3):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"n": number}
        checkpoint["channel_versions"] = {"n": f"{number:08d}"}
        parent = saver.put(
            config("plain-pruned-too", parent), checkpoint, plain_metadata, {"n": f"{number:08d}"}
        )["configurable"]["checkpoint_id"]
    stored = Checkpoint.objects.count()

    with pytest.raises(NotImplementedError, match="delta-pruned"):
        saver.prune(["plain-pruned-too", "delta-pruned"], strategy="keep_latest")
    assert Checkpoint.objects.count() == stored
    assert graph.get_state(config("delta-pruned")).values["items"] == list(range(6))

    saver.prune(["plain-pruned-too"], strategy="keep_latest")
    assert len(list(saver.list(config("plain-pruned-too")))) == 1
    saver.prune(["delta-pruned"], strategy="delete")
    assert list(saver.list(config("delta-pruned"))) == []


def test_a_thread_deleted_during_the_walk_reads_as_deleted_never_as_seeds_without_writes(saver):
    """The walk and the writes are separate statements, each reading the database as it is
    then: a thread deleted between them must read as the thread that is not there -- not as its
    seed without the writes after it, which a DeltaChannel would rebuild into a state that
    silently lost them."""
    parent = None
    for number in range(6):
        parent = put(saver, "delta-doomed", parent, number, ["seed"] if number == 0 else None)
    cfg = config("delta-doomed")
    before = saver.get_delta_channel_history(config=cfg, channels=["items"])
    assert before["items"]["seed"] == ["seed"] and len(before["items"]["writes"]) == 5
    found = read_while_deleted(
        saver,
        "delta-doomed",
        lambda: saver.get_delta_channel_history(config=cfg, channels=["items"]),
    )
    nothing = saver.get_delta_channel_history(config=config("never-stored"), channels=["items"])
    assert found == nothing, found
