"""Past one server: the guarantees across the nodes of a MariaDB Galera cluster (aliases default,
node2, node3 -- ``scripts/cluster.sh`` starts one on this machine, ``make test`` runs this module on
it). Lost updates and compare-and-set across nodes, read-after-write on every node (made
deterministic by holding a node's applier with ``FLUSH TABLES WITH READ LOCK``), a node killed
mid-run, and memcheck across the nodes with node faults."""

from __future__ import annotations

import json
import threading
from io import StringIO

import MySQLdb
import pytest
from django.core.management import call_command
from django.db import connections

from agentmemory import MemoryStore, VersionConflict
from agentmemory.consistency.nodes import (
    kill_and_restart,
    local_node,
    wait_cluster_synced,
    wait_synced,
)

from .conftest import run_threads
from .helpers import history_ops

NODES = ["default", "node2", "node3"]
pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True, databases=NODES)]


@pytest.fixture(autouse=True)
def _fresh_connections():
    """Connections take their causal-read setting when they open: every test starts and ends
    with none open, so a test's setting never leaks into the next."""
    wait_cluster_synced(NODES)  # a node a previous test restarted is back in a cluster of 3
    connections.close_all()
    yield
    connections.close_all()


def stores(cache=None):
    return [MemoryStore(using=alias, cache=cache) for alias in NODES]


def raw(alias):
    settings = connections[alias].settings_dict
    return MySQLdb.connect(
        host=settings["HOST"],
        port=int(settings["PORT"]),
        user=settings["USER"],
        passwd=settings["PASSWORD"],
        db=settings["NAME"],
        autocommit=True,
    )


class HeldApplier:
    """``FLUSH TABLES WITH READ LOCK`` on one node: it goes on certifying the cluster's writes but
    applies none of them until released -- the window in which it would serve older versions."""

    def __init__(self, alias):
        self.link = raw(alias)
        self.held = False

    def __enter__(self):
        self.link.cursor().execute("FLUSH TABLES WITH READ LOCK")
        self.held = True
        return self

    def __exit__(self, *exc):
        self.release()
        self.link.close()

    def release(self):
        if self.held:
            self.link.cursor().execute("UNLOCK TABLES")
            self.held = False

    def release_once_a_read_waits(self):
        """Wait until the node shows a store read waiting (the event, not a time), then let the
        applier go on."""
        cursor = self.link.cursor()
        while True:
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() "
                "AND COMMAND = 'Query' AND INFO LIKE 'SELECT%agentmemory_memory%'"
            )
            if cursor.fetchone()[0]:
                return self.release()


def caught_up(alias):
    """Wait until the node has applied every write the cluster committed (one causal read on a
    connection of its own)."""
    link = raw(alias)
    try:
        cursor = link.cursor()
        cursor.execute("SET SESSION wsrep_sync_wait = 1")
        cursor.execute("SELECT COUNT(*) FROM agentmemory_memory")
    finally:
        link.close()


def test_updates_from_every_node_lose_nothing():
    nodes = stores()
    nodes[0].remember("s", "n", 0)

    def bump(worker):
        store = nodes[worker % 3]
        for _ in range(40):
            store.update("s", "n", lambda n: n + 1)

    run_threads(bump, 3)
    for store in nodes:
        assert store.recall("s", "n").value == 120
        assert [h.version for h in store.history("s", "n")] == list(range(1, 122))


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def test_a_hot_key_from_every_node_on_a_loaded_machine_loses_no_update_and_gives_up_none():
    """Certification conflicts are Galera's answer to writers of one row on several nodes: the
    store retries them until its deadline. With both cores of the machine kept busy on
    purpose (four spinning processes), 18 writers (6 per node) updating one counter 25 times
    each all succeed. When ATTEMPTS bounded conflicts, a writer gave up with MemoryUnavailable
    after 12 conflicts in 1.7-2.8 s of a 30 s deadline (here: 1 run of 2)."""
    import multiprocessing

    nodes = stores()
    nodes[0].remember("s", "hot", 0)
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(4)]
    for hog in hogs:
        hog.start()
    try:

        def bump(worker):
            store = nodes[worker % 3]
            for _ in range(25):
                store.update("s", "hot", lambda n: n + 1)

        run_threads(bump, 18)
    finally:
        stop.set()
        for hog in hogs:
            hog.join(10)
    conflicts = sum(store.retries["conflict"] for store in nodes)
    for store in nodes:
        assert store.recall("s", "hot").value == 450, conflicts
    assert conflicts > 0  # the load made contention: the retries absorbed it


def test_exactly_one_compare_and_set_per_version_wins_across_nodes():
    nodes = stores()
    nodes[0].remember("s", "k", "v1")
    wins = []

    def contend(worker):
        store = nodes[worker % 3]
        for _ in range(15):
            seen = store.recall("s", "k")
            try:
                store.remember("s", "k", f"w{worker}", expected_version=seen.version)
                wins.append(seen.version)
            except VersionConflict:
                pass

    run_threads(contend, 6)
    history = nodes[2].history("s", "k")
    assert sorted(wins) == sorted(set(wins)), "two writers won against one version"
    assert [h.version for h in history] == list(range(1, len(wins) + 2))


def test_a_write_acknowledged_on_one_node_is_read_on_every_other():
    writer, reader = (
        MemoryStore(using="default", cache=None),
        MemoryStore(using="node2", cache=None),
    )
    writer.remember("s", "k", "v1")
    assert reader.recall("s", "k").value == "v1"
    with HeldApplier("node2") as held:
        acknowledged = writer.remember("s", "k", "v2")
        releaser = threading.Thread(target=held.release_once_a_read_waits)
        releaser.start()
        served = reader.recall("s", "k")  # begins after the acknowledgement: waits for it
        releaser.join()
    assert (served.version, served.value) == (acknowledged.version, "v2")


def searchers():
    from agentmemory import Index
    from agentmemory.testing.embeddings import HashEmbedder

    index = Index(embed=HashEmbedder(32), dims=32, fields=["text"])
    return (
        MemoryStore(using="default", cache=None, index=index),
        MemoryStore(using="node2", cache=None, index=index),
    )


def test_a_write_acknowledged_on_one_node_is_found_by_search_on_every_other():
    writer, reader = searchers()
    writer.remember("s", "k", {"text": "apples"})
    assert [r.version for r in reader.search("s", "apples")] == [1]
    with HeldApplier("node2") as held:
        acknowledged = writer.remember("s", "k", {"text": "rockets"})
        releaser = threading.Thread(target=held.release_once_a_read_waits)
        releaser.start()
        found = reader.search("s", "rockets")  # begins after the acknowledgement: waits for it
        releaser.join()
    assert [(r.version, r.value["text"], round(r.score, 5)) for r in found] == [
        (acknowledged.version, "rockets", 1.0)
    ]


def test_without_causal_reads_search_on_a_node_misses_an_acknowledged_write(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CAUSAL_READS": False}
    writer, reader = searchers()
    writer.remember("s", "k", {"text": "apples"})
    caught_up("node2")
    with HeldApplier("node2"):
        writer.remember("s", "k", {"text": "rockets"})
        found = reader.search("s", "rockets")
    assert [(r.version, r.value["text"]) for r in found] == [(1, "apples")]


def test_without_causal_reads_a_node_serves_an_older_version(settings):
    """The seam ``CAUSAL_READS=False`` shows what the causal reads prevent (and E013 forbids)."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CAUSAL_READS": False}
    writer, reader = (
        MemoryStore(using="default", cache=None),
        MemoryStore(using="node2", cache=None),
    )
    writer.remember("s", "k", "v1")
    caught_up("node2")
    assert reader.recall("s", "k").value == "v1"
    with HeldApplier("node2"):
        acknowledged = writer.remember("s", "k", "v2")
        served = reader.recall("s", "k")
    assert acknowledged.version == 2 and (served.version, served.value) == (1, "v1")


def test_a_node_killed_mid_run_loses_no_acknowledged_write():
    nodes = stores()
    acknowledged = {}
    stop = threading.Event()

    def write(worker):
        store, count = nodes[worker], 0
        while not stop.is_set() or count < 20:
            count += 1
            try:
                record = store.remember("s", f"k{worker}", count)
            except Exception:  # indeterminate while the cluster reconfigures
                continue
            acknowledged[worker] = record.version

    writers = [threading.Thread(target=write, args=(w,)) for w in (0, 1)]
    for thread in writers:
        thread.start()
    kill_and_restart(local_node("node3"))  # kill -9, restart, wait until Synced
    stop.set()
    for thread in writers:
        thread.join()
    connections.close_all()
    for store in nodes:
        for worker, version in acknowledged.items():
            record = store.recall("s", f"k{worker}")
            assert record.version >= version, (store.using, worker)
            history = [h.version for h in store.history("s", f"k{worker}")]
            assert history == list(range(1, record.version + 1))


def memcheck(*args, history=None):
    out = StringIO()
    extra = ("--history", str(history)) if history is not None else ()
    try:
        call_command(
            "memcheck",
            "--database",
            ",".join(NODES),
            "--format",
            "json",
            *extra,
            *args,
            stdout=out,
        )
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, json.loads(out.getvalue())


def explained(report, history) -> str:
    """A failed run's anomalies, and every recorded operation on their keys (from the run's
    ``--history``): what is needed to find the cause from the CI log alone."""
    anomalies = report["anomalies"]
    keys = {(a["session_id"], a["key"]) for a in anomalies[:5]}
    lines = [json.dumps(a) for a in anomalies[:5]]
    if history is not None and history.exists():
        ops = history_ops(history)
        lines.append(f"history: {history} ({len(ops)} operations); on the anomalies' keys:")
        lines += [json.dumps(op) for op in ops if (op["session_id"], op["key"]) in keys][:200]
    return "\n".join(lines)


def test_memcheck_across_nodes_passes_and_reports_every_node(tmp_path):
    for node in NODES:
        wait_synced(node)  # a test before this one may have restarted a node
    history = tmp_path / "history.jsonl"
    code, report = memcheck(history=history)
    assert code == 0, explained(report, history)
    assert set(report["nodes"]) == set(NODES)
    assert all(report["nodes"][node]["ok"] > 0 for node in NODES)
    assert {"idempotent", "search", "many"} <= set(report["config"]["workloads"])


def test_memcheck_across_nodes_finds_stale_reads_without_causal_reads(settings):
    """Without the Redis tier (which would answer from one place for every node), reads go to
    each client's node."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CAUSAL_READS": False, "CACHE": None}
    code, report = memcheck("--seconds", "4")
    assert code == 1
    assert any(a["check"] == "stale-read" for a in report["anomalies"]), report["anomalies"][:3]


def test_memcheck_with_node_faults_loses_nothing(tmp_path):
    for node in NODES:
        wait_synced(node)
    history = tmp_path / "history.jsonl"
    code, report = memcheck("--faults", "db", "--seconds", "20", history=history)
    injected = report["faults"]["injected"]
    assert injected.get("node-kill", 0) >= 1, report["faults"]
    assert injected.get("node-pause", 0) >= 1, report["faults"]
    assert code == 0, explained(report, history)
    for node in NODES:
        wait_synced(node)


# ---------------------------------------------------------------------- logs on every node


def test_appenders_and_poppers_on_every_node_keep_a_log_exact():
    """Semantics 14 across the nodes: appends from the three nodes' clients at once (the
    cluster's certification conflicts are retried) give every item once, numbered 1..180, each
    writer's in its order; pops from the three nodes never return one item twice."""

    def writer(worker):
        store = MemoryStore(using=NODES[worker % 3], cache=None)
        return [store.append("g", "chat", [[worker, i]])[0].seq for i in range(30)]

    acknowledged = run_threads(writer, 6)
    assert sorted(s for mine in acknowledged for s in mine) == list(range(1, 181))
    items = [i.value for i in MemoryStore(using="node3", cache=None).read_log("g", "chat")]
    for worker in range(6):
        assert [i for w, i in items if w == worker] == list(range(30))

    def popper(worker):
        store = MemoryStore(using=NODES[worker % 3], cache=None)
        popped = []
        while (item := store.pop("g", "chat")) is not None:
            popped.append(tuple(item.value))
        return popped

    popped = [p for mine in run_threads(popper, 3) for p in mine]
    assert sorted(popped) == sorted(map(tuple, items))


def test_checkpoint_steps_from_every_node_never_fork_a_thread():
    """LangGraph runs of one thread on three nodes, each step from the latest checkpoint it
    loaded: every step lands in one chain (a node's row lock does not reach the others; the
    cluster's certification refuses the loser, which the store retries into a conflict)."""
    from langgraph.checkpoint.base import empty_checkpoint

    from agentmemory import CheckpointConflict
    from agentmemory.integrations.langgraph import AgentMemorySaver

    savers = [AgentMemorySaver(MemoryStore(using=node, cache=None)) for node in NODES]
    thread = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

    def put(saver, loaded):
        checkpoint = empty_checkpoint()
        saver.put(loaded, checkpoint, {"source": "loop", "step": 0}, {})

    put(savers[0], thread)

    def run(worker):
        saver, done = savers[worker % 3], 0
        while done < 10:
            loaded = saver.get_tuple(thread)
            try:
                put(saver, loaded.config)
                done += 1
            except CheckpointConflict:
                pass

    run_threads(run, 6)
    found = list(savers[2].list(thread))
    parents = [f.parent_config["configurable"]["checkpoint_id"] for f in found if f.parent_config]
    assert len(found) == 1 + 6 * 10
    assert len(set(parents)) == len(parents), "a checkpoint has two children: a fork"
