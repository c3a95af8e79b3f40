"""AgentMemorySaver beyond LangGraph's conformance suite (tests/test_langgraph_conformance.py): what
concurrent writers of one thread may and may not do to its checkpoint chain, on real threads, and
real LangGraph graphs run on 20 threads with parallel nodes, interrupts and resumes."""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from django.db import connection, connections
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from agentmemory import CheckpointConflict, InvalidMemory, MemoryStore, aio, defects
from agentmemory.conf import get_config
from agentmemory.integrations.langgraph import AgentMemorySaver
from agentmemory.integrations.langgraph_saver import EXPECT

from .conftest import run_threads
from .helpers import run_processes

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 10


@pytest.fixture
def saver() -> AgentMemorySaver:
    return AgentMemorySaver()


def config(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def put_step(saver: AgentMemorySaver, loaded: dict[str, Any], value: Any) -> dict[str, Any]:
    """Put the next checkpoint after the one ``loaded`` names, as LangGraph's loop does: the
    loaded tuple's config, with one channel changed."""
    checkpoint = empty_checkpoint()
    version = saver.get_next_version(None, None)
    checkpoint["channel_values"] = {"value": value}
    checkpoint["channel_versions"] = {"value": version}
    metadata = {"source": "loop", "step": 0, "parents": {}}
    return saver.put(loaded, checkpoint, metadata, {"value": version})


def children(saver: AgentMemorySaver, thread: str) -> Counter[str]:
    """How many checkpoints of the thread name each checkpoint as their parent."""
    return Counter(
        found.parent_config["configurable"]["checkpoint_id"]
        for found in saver.list(config(thread))
        if found.parent_config is not None
    )


def race_two_writers(saver: AgentMemorySaver, thread: str) -> list[Any]:
    """Two writers load the thread's latest checkpoint, then both put its child."""
    both_loaded = threading.Barrier(2)

    def writer(i: int) -> Any:
        loaded = saver.get_tuple(config(thread))
        both_loaded.wait(timeout=30)
        try:
            return put_step(saver, loaded.config, f"writer {i}")
        except CheckpointConflict as conflict:
            return conflict

    return run_threads(writer, 2)


# ---------------------------------------------------------------------- the fork rule


def test_two_writers_extending_one_latest_checkpoint_never_fork(saver):
    for round_ in range(ROUNDS):
        thread = f"race-{round_}"
        put_step(saver, config(thread), "root")
        outcomes = race_two_writers(saver, thread)
        conflicts = [o for o in outcomes if isinstance(o, CheckpointConflict)]
        assert len(conflicts) == 1, outcomes
        winner = next(o for o in outcomes if not isinstance(o, CheckpointConflict))
        assert conflicts[0].latest == winner["configurable"]["checkpoint_id"]
        assert max(children(saver, thread).values()) == 1
        assert len(list(saver.list(config(thread)))) == 2


def test_without_the_lock_the_same_race_forks_and_is_seen():
    """The unsafe seam (``row_lock=False``: the latest checkpoint read before the lock) forks
    in the race above -- the check that finds forks finds it."""
    saver = AgentMemorySaver(MemoryStore(cache=None, row_lock=False))
    forks = 0
    for round_ in range(ROUNDS):
        thread = f"unlocked-{round_}"
        put_step(saver, config(thread), "root")
        outcomes = race_two_writers(saver, thread)
        if max(children(saver, thread).values()) > 1:
            forks += 1
            assert not any(isinstance(o, CheckpointConflict) for o in outcomes)
    assert forks >= 1


def test_a_fork_asked_for_by_checkpoint_id_is_made(saver):
    first = put_step(saver, config("travel"), "first")
    second = put_step(saver, saver.get_tuple(config("travel")).config, "second")
    # Back to the first checkpoint, asked for by its id: LangGraph's time travel.
    older = saver.get_tuple(config("travel", first["configurable"]["checkpoint_id"]))
    assert older.config["configurable"][EXPECT] == first["configurable"]["checkpoint_id"]
    branch = put_step(saver, older.config, "branch")
    assert children(saver, "travel")[first["configurable"]["checkpoint_id"]] == 2
    latest = saver.get_tuple(config("travel"))
    assert latest.config["configurable"]["checkpoint_id"] == branch["configurable"]["checkpoint_id"]
    assert latest.checkpoint["channel_values"] == {"value": "branch"}
    # The branch goes on from its own latest checkpoint; the old line is not the latest.
    put_step(saver, latest.config, "branch 2")
    with pytest.raises(CheckpointConflict):
        put_step(saver, second, "second 2")


def test_a_put_of_a_stored_checkpoint_again_is_no_fork(saver):
    loaded = saver.get_tuple(config("again")) or None
    assert loaded is None
    root = put_step(saver, config("again"), "root")
    latest = saver.get_tuple(config("again")).config
    checkpoint = empty_checkpoint()
    metadata = {"source": "loop", "step": 1, "parents": {}}
    saver.put(latest, checkpoint, metadata, {})
    put_step(saver, saver.get_tuple(config("again")).config, "next")
    # The first put's acknowledgement was lost; the caller puts the same checkpoint again.
    saver.put(latest, checkpoint, metadata, {})
    assert len(list(saver.list(config("again")))) == 3
    assert max(children(saver, "again").values()) == 1
    assert root["configurable"]["checkpoint_id"] in children(saver, "again")


def test_two_writers_going_on_from_a_put_on_a_new_thread_never_fork(saver):
    """A run that began on a new thread (get_tuple found nothing) puts from the caller's own
    config, without the saver's key; the config that put returns must carry it, or every later
    put of the run is stored by LangGraph's rule alone -- SqliteSaver's silent fork (#8796)."""
    for round_ in range(ROUNDS):
        thread = f"new-{round_}"
        assert saver.get_tuple(config(thread)) is None
        first = put_step(saver, config(thread), "first")
        assert first["configurable"][EXPECT] == ""
        both = threading.Barrier(2)

        def writer(i: int, first: dict[str, Any] = first, both: Any = both) -> Any:
            both.wait(timeout=30)
            try:
                return put_step(saver, first, f"writer {i}")
            except CheckpointConflict as conflict:
                return conflict

        outcomes = run_threads(writer, 2)
        assert sum(isinstance(o, CheckpointConflict) for o in outcomes) == 1, outcomes
        assert max(children(saver, thread).values()) == 1
        # The async saver returns the same key.
        metadata: Any = {"source": "input", "step": -1, "parents": {}}
        began = asyncio.run(saver.aput(config(f"a{thread}"), empty_checkpoint(), metadata, {}))
        assert began["configurable"][EXPECT] == ""


def test_a_config_built_by_hand_is_stored_by_langgraphs_rule(saver):
    """No loaded tuple, no expectation: a put names its parent and is stored there, as every
    LangGraph saver stores it (the conformance suite's configs are such)."""
    root = put_step(saver, config("by-hand"), "root")
    root_id = root["configurable"]["checkpoint_id"]
    for value in ("a", "b"):
        put_step(saver, config("by-hand", root_id), value)
    assert children(saver, "by-hand")[root_id] == 2


def steps_in_a_process(thread: str, steps: int) -> int:
    """``steps`` steps of a run on ``thread``, each retried on a conflict as a caller would
    (load the new latest checkpoint, step again); returns the conflicts met."""
    saver, conflicts, done = AgentMemorySaver(), 0, 0
    while done < steps:
        loaded = saver.get_tuple(config(thread))
        try:
            put_step(saver, loaded.config, f"step {done}")
            done += 1
        except CheckpointConflict:
            conflicts += 1
    return conflicts


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_four_processes_stepping_one_thread_leave_one_chain():
    """Four processes, 15 steps each, on one thread: every step lands, in one chain, and the
    races between them were conflicts the callers retried -- never a fork."""
    put_step(AgentMemorySaver(), config("processes"), "root")
    run_processes(steps_in_a_process, [("processes", 15)] * 4)
    saver = AgentMemorySaver()
    assert len(list(saver.list(config("processes")))) == 1 + 4 * 15
    assert_linear(saver, "processes")


# ---------------------------------------------------------------------- pending writes


def test_concurrent_put_writes_of_one_checkpoint_all_land_and_repeats_land_once(saver):
    stored = put_step(saver, config("writes"), "root")

    def task(i: int) -> None:
        saver.put_writes(stored, [("value", f"{i}-{n}") for n in range(3)], f"task-{i}")
        # Every worker also saves the same task's writes: stored once.
        saver.put_writes(stored, [("value", f"shared-{n}") for n in range(3)], "shared")

    run_threads(task, 8)
    writes = saver.get_tuple(stored).pending_writes
    assert len(writes) == 8 * 3 + 3
    assert sorted(v for t, _, v in writes if t == "shared") == ["shared-0", "shared-1", "shared-2"]
    for i in range(8):
        assert [v for t, _, v in writes if t == f"task-{i}"] == [f"{i}-{n}" for n in range(3)]


def test_special_writes_replace_and_plain_writes_are_kept(saver):
    stored = put_step(saver, config("special"), "root")
    saver.put_writes(stored, [("value", 1), ("__error__", "first")], "t")
    saver.put_writes(stored, [("value", 2), ("__error__", "second")], "t")
    assert saver.get_tuple(stored).pending_writes == [
        ("t", "__error__", "second"),
        ("t", "value", 1),
    ]


# ---------------------------------------------------------------------- bad input


def test_bad_configs_are_refused_before_any_query(saver):
    with pytest.raises(InvalidMemory, match="needs a thread_id"):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(InvalidMemory, match="thread_id: must be 1 to 255 characters"):
        put_step(saver, config("x" * 256), "v")
    with pytest.raises(InvalidMemory, match="checkpoint_ns: must be 0 to 500"):
        saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": "n" * 501}})
    with pytest.raises(InvalidMemory, match=r"configurable\.checkpoint_id"):
        saver.put_writes(config("t"), [("value", 1)], "task")
    with pytest.raises(InvalidMemory, match="strategy: must be one of 'keep_latest', 'delete'"):
        saver.prune(["t"], strategy="keep_oldest")
    assert list(saver.list(None)) == []


# ---------------------------------------------------------------------- real graphs


class Branches(TypedDict):
    log: Annotated[list[str], operator.add]
    answer: str


def branching_graph(saver: AgentMemorySaver, *, pause: threading.Barrier | None = None) -> Any:
    """START -> (left, right in parallel) -> join -> ask (an interrupt) -> END."""

    def left(state: Branches) -> dict[str, Any]:
        if pause is not None:
            pause.wait(timeout=30)
        return {"log": ["left"]}

    def right(state: Branches) -> dict[str, Any]:
        return {"log": ["right"]}

    def join(state: Branches) -> dict[str, Any]:
        return {"log": ["join"]}

    def ask(state: Branches) -> dict[str, Any]:
        return {"answer": interrupt("your answer?")}

    graph = StateGraph(Branches)
    for name, node in (("left", left), ("right", right), ("join", join), ("ask", ask)):
        graph.add_node(name, node)
    graph.add_edge(START, "left")
    graph.add_edge(START, "right")
    graph.add_edge(["left", "right"], "join")
    graph.add_edge("join", "ask")
    graph.add_edge("ask", END)
    return graph.compile(checkpointer=saver)


def assert_linear(saver: AgentMemorySaver, thread: str) -> None:
    """Every checkpoint of the thread but its root has its parent in the thread, and no
    checkpoint has two children."""
    found = list(saver.list(config(thread)))
    ids = {f.config["configurable"]["checkpoint_id"] for f in found}
    roots = [f for f in found if f.parent_config is None]
    assert len(roots) == 1
    assert all(
        f.parent_config["configurable"]["checkpoint_id"] in ids for f in found if f.parent_config
    )
    assert max(children(saver, thread).values()) == 1


def test_a_graph_on_20_threads_with_parallel_nodes_interrupts_and_resumes(saver):
    graph = branching_graph(saver)

    def run(i: int) -> dict[str, Any]:
        thread = config(f"graph-{i}")
        paused = graph.invoke({"log": [f"start {i}"]}, thread)
        assert paused["__interrupt__"][0].value == "your answer?"
        return graph.invoke(Command(resume=f"answer {i}"), thread)

    finals = run_threads(run, 20)
    for i, final in enumerate(finals):
        assert final["answer"] == f"answer {i}"
        assert final["log"][0] == f"start {i}" and final["log"][-1] == "join"
        assert sorted(final["log"][1:3]) == ["left", "right"]
        state = graph.get_state(config(f"graph-{i}"))
        assert state.values == final and state.next == ()
        assert_linear(saver, f"graph-{i}")


def test_two_runs_of_one_thread_never_fork_it_one_raises_a_conflict(saver):
    seed = branching_graph(saver)
    seed.invoke({"log": ["seed"]}, config("shared"))
    seed.invoke(Command(resume="seed answer"), config("shared"))
    graph = branching_graph(saver, pause=threading.Barrier(2))

    def run(i: int) -> Any:
        try:
            return graph.invoke({"log": [f"run {i}"]}, config("shared"))
        except CheckpointConflict as conflict:
            return conflict

    outcomes = run_threads(run, 2)
    assert sum(isinstance(o, CheckpointConflict) for o in outcomes) == 1
    assert_linear(saver, "shared")
    winner = next(o for o in outcomes if not isinstance(o, CheckpointConflict))
    assert graph.get_state(config("shared")).values["log"] == winner["log"]


def test_time_travel_and_update_state_fork_where_asked(saver):
    graph = branching_graph(saver)
    graph.invoke({"log": ["first"]}, config("travel"))
    graph.invoke(Command(resume="first answer"), config("travel"))
    history = list(graph.get_state_history(config("travel")))
    before_ask = next(s for s in history if s.next == ("ask",))
    # Resume from an older checkpoint (by its id): a branch, no conflict.
    replayed = graph.invoke(None, before_ask.config)
    assert replayed["__interrupt__"]
    graph.invoke(Command(resume="second answer"), config("travel"))
    assert graph.get_state(config("travel")).values["answer"] == "second answer"
    # update_state on an older checkpoint forks there; on the latest, it extends it.
    graph.update_state(before_ask.config, {"log": ["edited"]})
    assert graph.get_state(config("travel")).values["log"][-1] == "edited"
    graph.update_state(config("travel"), {"log": ["edited again"]})
    assert graph.get_state(config("travel")).values["log"][-2:] == ["edited", "edited again"]
    assert children(saver, "travel")[before_ask.config["configurable"]["checkpoint_id"]] == 3


def test_the_async_interface_runs_a_graph_too(saver):
    graph = branching_graph(saver)

    async def run() -> tuple[Any, Any, list[Any]]:
        paused = await graph.ainvoke({"log": ["async"]}, config("async"))
        final = await graph.ainvoke(Command(resume="yes"), config("async"))
        return paused, final, [s.next async for s in graph.aget_state_history(config("async"))]

    paused, final, nexts = asyncio.run(run())
    assert paused["__interrupt__"] and final["answer"] == "yes" and nexts[0] == ()
    aio.close_connections()
    assert_linear(saver, "async")


# ---------------------------------------------------------------------- connections


@pytest.fixture
def persistent_connections():
    """Persistent connections (``CONN_MAX_AGE = None``): a thread's connection stays open until
    someone closes it -- where a connection per short-lived thread would pile up."""
    settings = connections["default"].settings_dict
    was = settings["CONN_MAX_AGE"]
    settings["CONN_MAX_AGE"] = None
    connections.close_all()
    yield
    settings["CONN_MAX_AGE"] = was
    aio.close_connections()
    connections.close_all()


def open_connections() -> int:
    """Connections to the test database, as the server counts them (this one included)."""
    query = (
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()"
        if connection.vendor == "postgresql"
        else "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
    )
    with connection.cursor() as cursor:
        cursor.execute(query)
        return cursor.fetchone()[0]


@pytest.mark.server
def test_graphs_on_20_threads_hold_no_more_connections_than_the_pool(saver, persistent_connections):
    """LangGraph saves checkpoints from worker threads it starts for each run. Measured before
    the saver ran such calls on the store's pool: 20 runs at once on PostgreSQL left every worker
    thread's connection open and ran out of the server's 100 ("too many clients already")."""
    graph = branching_graph(saver)
    before = open_connections()

    def run(i: int) -> None:
        thread = config(f"conn-{i}")
        graph.invoke({"log": [str(i)]}, thread)
        graph.invoke(Command(resume="yes"), thread)

    for _ in range(3):
        run_threads(run, 20)
    assert open_connections() <= before + get_config()["ASYNC_THREADS"]


# ---------------------------------------------------------------------- a crash mid-step


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_crash_between_a_steps_writes_and_its_checkpoint_resumes_correctly(saver, durability):
    """The parallel nodes of a step finish and their pending writes are saved; the checkpoint
    that ends the step is not (the failpoint: the process dies there). Resumed, the graph ends
    as if nothing had happened, and the thread's chain stays linear.

    With ``durability="sync"`` a step's checkpoint is stored before its nodes run, so the
    writes saved are the stored checkpoint's: neither node runs again. With ``"async"``
    (LangGraph's default) the checkpoint of the step may still be on its way when its nodes
    finish, and the next step may start before the failure surfaces -- the steps after the
    last stored checkpoint run again (at least once; writes saved for a checkpoint that was
    never stored are never read)."""
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def node(name: str, *, crash_after: bool = False) -> Any:
        def run(state: Branches) -> dict[str, Any]:
            with lock:
                runs[name] += 1
                first = runs[name] == 1
            if crash_after and first:
                # With "async", the thread's first checkpoint (the input's) may still be on its
                # way here: on a loaded machine the failpoint then hit it, and nothing was left to
                # resume from ("Received no input for __start__"). The crash is meant after it:
                # wait until it is stored (the event), then arm.
                deadline = time.monotonic() + 30
                while saver.get_tuple(config("crash")) is None and time.monotonic() < deadline:
                    time.sleep(0.005)
                defects.fail_next_checkpoint()
            return {"log": [name]}

        return run

    graph = StateGraph(Branches)
    graph.add_node("left", node("left"))
    graph.add_node("right", node("right", crash_after=True))
    graph.add_node("join", node("join"))
    graph.add_edge(START, "left")
    graph.add_edge(START, "right")
    graph.add_edge(["left", "right"], "join")
    graph.add_edge("join", END)
    compiled = graph.compile(checkpointer=saver)
    try:
        with pytest.raises(defects.InjectedFailure):
            compiled.invoke({"log": ["start"]}, config("crash"), durability=durability)
    finally:
        defects.disarm_checkpoint_failure()
    if durability == "sync":
        stopped = saver.get_tuple(config("crash"))
        assert sorted(v for _, c, v in stopped.pending_writes if c == "log") == [
            ["left"],
            ["right"],
        ]
    final = compiled.invoke(None, config("crash"), durability=durability)
    assert final["log"][0] == "start" and sorted(final["log"][1:3]) == ["left", "right"]
    assert final["log"][3:] == ["join"]
    if durability == "sync":
        assert runs == {"left": 1, "right": 1, "join": 1}
    assert_linear(saver, "crash")


def test_a_put_and_put_writes_whose_commit_answer_was_lost_are_stored_once(saver):
    """The commit lands, its answer is lost (a node dies during COMMIT): the retry stores
    nothing more and raises no conflict -- the checkpoint it finds is its own."""
    root = put_step(saver, config("lost"), "root")
    loaded = saver.get_tuple(config("lost")).config
    with defects.lose_commit_answer():
        child = put_step(saver, loaded, "child")
    with defects.lose_commit_answer():
        saver.put_writes(child, [("value", "w")], task_id="task")
    stored = list(saver.list(config("lost")))
    assert [s.config["configurable"]["checkpoint_id"] for s in stored] == [
        child["configurable"]["checkpoint_id"],
        root["configurable"]["checkpoint_id"],
    ]
    assert saver.get_tuple(child).pending_writes == [("task", "value", "w")]
    assert saver.store.retries["disconnect"] == 2


@pytest.mark.mysql
def test_a_thread_deleted_between_the_mysql_familys_two_reads_reads_as_deleted(saver):
    """On the MySQL family a checkpoint is read in two statements (its row, then its blobs and
    writes), each reading the database as it is then: a thread deleted between them must read
    as the thread that is not there -- not as a checkpoint whose channels are silently empty,
    which a graph would go on from."""
    stored = put_step(saver, config("doomed"), "the thread's state")
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"value": "the thread's state"}
    found = read_while_deleted(saver, "doomed", lambda: saver.get_tuple(config("doomed")))
    assert found is None, found.checkpoint["channel_values"]


def read_while_deleted(saver: AgentMemorySaver, thread: str, read: Callable[[], Any]) -> Any:
    """What ``read()``, run in a thread of its own, returns when ``thread`` is deleted between
    two of its statements (the hold point ``defects.hold_next_checkpoint_read``)."""
    hold = defects.hold_next_checkpoint_read(lambda name, _keys: name == thread)
    found: list[Any] = []

    def reader() -> None:
        try:
            found.append(read())
        finally:
            connections.close_all()  # this thread's

    worker = threading.Thread(target=reader)
    worker.start()
    try:
        assert hold.reached.wait(10), "the read never got between its statements"
        saver.delete_thread(thread)
    finally:
        defects.disarm(hold)
        worker.join()
    assert found, "the read raised"
    return found[0]


@pytest.mark.mysql
def test_a_checkpoint_with_a_channel_written_empty_is_read_in_two_statements(saver):
    """The look-up of a fractured read runs only when a version's row is missing: a channel
    written empty has its row, so a whole checkpoint is still its rows and then its parts."""
    from django.test.utils import CaptureQueriesContext

    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"full": 1}
    checkpoint["channel_versions"] = {"full": "1", "emptied": "1"}
    stored = saver.put(config("empties"), checkpoint, {"step": 0}, {"full": "1", "emptied": "1"})
    with CaptureQueriesContext(connection) as queries:
        found = saver.get_tuple(stored)
    assert found.checkpoint["channel_values"] == {"full": 1}
    assert len(queries) == 2, [q["sql"][:80] for q in queries]
