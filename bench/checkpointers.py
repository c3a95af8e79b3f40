"""The checkpointer benchmark: ``AgentMemorySaver`` against LangGraph's own ``SqliteSaver`` and
``PostgresSaver``, on the same machine, in one run.

    .venv/bin/python bench/checkpointers.py           # docs/checkpointer-benchmarks.{json,md}
    .venv/bin/python bench/checkpointers.py --quick   # seconds, into out/ (CI runs it)

For each backend (SQLite: a file each; PostgreSQL: the same server and database) and each thread
length (10 and 10,000 checkpoints): sequential ``put`` (extending the thread's latest checkpoint,
four of its 10 channels changed, ~4 KB of state in all, as an agent's loop does), ``put_writes``
(3 writes of a new task), ``get_tuple`` (the latest), ``list`` (the latest 10), and a whole graph
step (``invoke`` of a one-node graph on the thread: load, run, save) -- ops/s, median of ``--repeats`` interleaved runs,
and agentmemory's ratio to each peer in the same run (> 1: agentmemory is faster).

And the race no throughput figure shows: two writers load one thread's latest checkpoint and both
put its child, ``--rounds`` times; how many rounds left the thread forked (a checkpoint with two
children), per saver. No speed is asserted anywhere.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402
from langgraph.channels.delta import DeltaChannel  # noqa: E402
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from agentmemory import CheckpointConflict, MemoryStore, aio  # noqa: E402
from agentmemory.integrations.langgraph import AgentMemorySaver  # noqa: E402
from bench.run import available_backends, progress, run_header, write_results  # noqa: E402

SIZES = {
    "full": {"sizes": (10, 10_000), "calls": 200, "repeats": 3, "rounds": 10, "runs": 500},
    "quick": {"sizes": (10, 200), "calls": 20, "repeats": 1, "rounds": 3, "runs": 20},
}
OURS = "AgentMemorySaver"
WALK = "AgentMemorySaver with LangGraph's default walk"


def messages(n: int) -> list[dict[str, str]]:
    """A conversation channel as an agent's state holds it: the latest 10 turns."""
    return [
        {"role": "user", "content": f"turn {i}: " + "lorem ipsum " * 6} for i in range(n, n + 10)
    ]


# ---------------------------------------------------------------- the savers


def savers(alias: str, folder: Path) -> dict[str, Callable[[], BaseCheckpointSaver]]:
    """Saver factories by name, ours first, then LangGraph's on the same kind of database."""
    makers: dict[str, Callable[[], BaseCheckpointSaver]] = {
        OURS: lambda: AgentMemorySaver(MemoryStore(using=alias, cache=None))
    }
    if alias == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        def sqlite_saver() -> BaseCheckpointSaver:
            conn = sqlite3.connect(folder / "peer.sqlite3", check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            saver = SqliteSaver(conn)
            saver.setup()
            return saver

        makers["SqliteSaver"] = sqlite_saver
    else:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.rows import dict_row

        db = settings.DATABASES[alias]
        url = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"

        def postgres_saver() -> BaseCheckpointSaver:
            conn = Connection.connect(
                url, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
            saver = PostgresSaver(conn)
            saver.setup()
            return saver

        makers["PostgresSaver"] = postgres_saver
    return makers


#: A realistic agent state: 10 channels, ~4 KB in all; each step changes the messages and three
#: others (a 2-channel state hid what a read costs per channel: one blob each).
CHANNELS = ("messages", *(f"slot{i}" for i in range(9)))
CHANGED_PER_STEP = 4


def value(channel: str, n: int) -> Any:
    """The value of ``channel`` at step ``n``: the latest 10 turns, or ~300 bytes of notes."""
    if channel == "messages":
        return messages(n)
    return {"step": n, "notes": f"{channel} at step {n}: " + "dolor sit amet " * 18}


def changed(n: int) -> tuple[str, ...]:
    """The channels step ``n`` writes: all at the first, then the messages and three others."""
    if n == 0:
        return CHANNELS
    others = CHANNELS[1:]
    return ("messages", *(others[(3 * n + i) % len(others)] for i in range(CHANGED_PER_STEP - 1)))


def step(saver: BaseCheckpointSaver, loaded: dict[str, Any], n: int) -> dict[str, Any]:
    """Put the checkpoint after ``loaded``: four channels changed, the others kept at the
    versions ``loaded`` had."""
    checkpoint = empty_checkpoint()
    before = loaded.get("versions", {})
    versions = {channel: before.get(channel) for channel in CHANNELS}
    new = {}
    for channel in changed(n) if before else CHANNELS:
        versions[channel] = saver.get_next_version(versions[channel], None)
        new[channel] = versions[channel]
    checkpoint["channel_values"] = {channel: value(channel, n) for channel in new}
    checkpoint["channel_versions"] = versions
    config = saver.put(loaded, checkpoint, {"source": "loop", "step": n, "parents": {}}, new)
    return {**config, "versions": versions}


def filled(saver: BaseCheckpointSaver, size: int) -> tuple[str, dict[str, Any]]:
    """A new thread of ``size`` checkpoints; its id and the latest checkpoint's config."""
    thread = f"bench-{uuid.uuid4().hex[:10]}"
    config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    for n in range(size):
        config = step(saver, config, n)
    return thread, loaded(saver, config)


def loaded(saver: BaseCheckpointSaver, config: dict[str, Any]) -> dict[str, Any]:
    """The config of ``config``'s checkpoint as a graph's load gives it, with its channels'
    versions (what :func:`step` extends)."""
    found = saver.get_tuple(config)
    return {**found.config, "versions": found.checkpoint["channel_versions"]}


def measure(
    saver: BaseCheckpointSaver, thread: str, latest: dict[str, Any], calls: int
) -> dict[str, float]:
    figures = {}
    base = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    config = loaded(saver, base)
    started = time.perf_counter()
    for n in range(calls):
        config = step(saver, config, 100_000 + n)
    figures["put"] = calls / (time.perf_counter() - started)
    # The writes of tasks of an older checkpoint: the latest keeps none, as in a graph between
    # steps, so get_tuple below reads what a graph's load reads.
    older = {
        "configurable": {
            **config["configurable"],
            "checkpoint_id": latest["configurable"]["checkpoint_id"],
        }
    }
    run = uuid.uuid4().hex[:8]  # new tasks in every run: a repeated one writes nothing
    started = time.perf_counter()
    for n in range(calls):
        saver.put_writes(older, [("messages", messages(n)[:1])] * 3, f"task-{run}-{n}", "~node")
    figures["put_writes"] = calls / (time.perf_counter() - started)
    figures["get_tuple"] = rate(calls, lambda: saver.get_tuple(base))
    figures["list"] = rate(calls, lambda: list(saver.list(base, limit=10)))
    graph = one_node_graph(saver)
    figures["graph step"] = rate(max(calls // 4, 5), lambda: graph.invoke({"turn": 1}, base))
    return figures


class Turn(TypedDict):
    turn: int


def one_node_graph(saver: BaseCheckpointSaver) -> Any:
    graph = StateGraph(Turn)
    graph.add_node("reply", lambda state: {"turn": state["turn"] + 1})
    graph.add_edge(START, "reply")
    graph.add_edge("reply", END)
    return graph.compile(checkpointer=saver)


def appended(state: list[int] | None, writes: list[list[int]]) -> list[int]:
    return [*(state or []), *(item for write in writes for item in write)]


class Items(TypedDict):
    items: Annotated[list, DeltaChannel(appended, snapshot_frequency=1_000_000)]
    n: int


def delta_thread(saver: BaseCheckpointSaver, runs: int) -> dict[str, Any]:
    """A thread of a graph whose channel ``items`` is a ``DeltaChannel`` that never snapshots:
    ``runs`` runs of one node, two checkpoints each; the latest checkpoint's config."""
    graph = StateGraph(Items)
    graph.add_node("add", lambda state: {"items": [state["n"]], "n": state["n"] + 1})
    graph.add_edge(START, "add")
    graph.add_edge("add", END)
    compiled = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": f"delta-{uuid.uuid4().hex[:10]}"}}
    for n in range(runs):
        compiled.invoke({"n": n}, config)
    return saver.get_tuple(config).config


def delta_rates(saver: BaseCheckpointSaver, name: str, runs: int, calls: int) -> dict[str, float]:
    """``get_delta_channel_history`` of a thread's latest checkpoint, the walk crossing every
    checkpoint of :func:`delta_thread`: the saver's, and (ours) LangGraph's default walk."""
    config = delta_thread(saver, runs)
    figures = {
        name: rate(
            calls, lambda: saver.get_delta_channel_history(config=config, channels=["items"])
        )
    }
    if name == OURS:
        default = BaseCheckpointSaver.get_delta_channel_history
        figures[WALK] = rate(calls, lambda: default(saver, config=config, channels=["items"]))
    return figures


def rate(calls: int, call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return calls / (time.perf_counter() - started)


def race(saver: BaseCheckpointSaver, config: dict[str, Any]) -> list[Any]:
    """Two writers load the latest checkpoint of ``config``'s thread, then both put its child."""
    loaded_both = threading.Barrier(2)
    outcomes: list[Any] = []

    def writer(i: int) -> None:
        latest = loaded(saver, config)
        loaded_both.wait(timeout=30)
        try:
            outcomes.append(step(saver, latest, 1 + i))
        except CheckpointConflict as conflict:
            outcomes.append(conflict)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def forks(saver: BaseCheckpointSaver, rounds: int) -> dict[str, int]:
    """:func:`race` ``rounds`` times on new threads; how many left the thread forked."""
    forked = conflicts = 0
    for _ in range(rounds):
        thread, _latest = filled(saver, 1)
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        outcomes = race(saver, config)
        parents = Counter(
            found.parent_config["configurable"]["checkpoint_id"]
            for found in saver.list(config)
            if found.parent_config
        )
        forked += max(parents.values()) > 1
        conflicts += sum(isinstance(o, CheckpointConflict) for o in outcomes)
    return {"rounds": rounds, "forked": forked, "conflicts raised": conflicts}


# ---------------------------------------------------------------- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, into out/")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    backends = available_backends(args.backends.split(","))
    results: dict[str, Any] = run_header(
        **{
            "calls": size["calls"],
            "repeats": size["repeats"],
            "throughput": {},
            "forks": {},
            "delta": {},
            "delta runs": size["runs"],
        }
    )
    with tempfile.TemporaryDirectory(prefix="bench-checkpointers-") as tmp:
        folder = Path(tmp)
        for alias in backends:
            made = {name: make() for name, make in savers(alias, folder).items()}
            for n in size["sizes"]:
                threads = {}
                for name, saver in made.items():
                    progress(f"{alias}: {name}, a thread of {n:,} checkpoints")
                    threads[name] = filled(saver, n)
                samples: dict[str, dict[str, list[float]]] = {name: {} for name in made}
                for repeat in range(size["repeats"]):
                    for name, saver in made.items():
                        progress(f"{alias} @ {n:,}: {name}, run {repeat + 1} of {size['repeats']}")
                        for figure, value in measure(saver, *threads[name], size["calls"]).items():
                            samples[name].setdefault(figure, []).append(value)
                results["throughput"][f"{alias} @ {n}"] = {
                    name: {figure: statistics.median(v) for figure, v in figures.items()}
                    for name, figures in samples.items()
                }
            for name, saver in made.items():
                progress(f"{alias}: {name}, a DeltaChannel's history over {2 * size['runs']:,}")
                found = delta_rates(saver, name, size["runs"], max(size["calls"] // 20, 3))
                results["delta"].setdefault(alias, {}).update(found)
            for name, saver in made.items():
                progress(f"{alias}: {name}, two writers on one latest checkpoint")
                results["forks"][f"{alias}: {name}"] = forks(saver, size["rounds"])
            aio.close_connections()
            connections[alias].close()
    write_results("checkpointer-benchmarks", results, render, args.quick)


FIGURES = ("put", "put_writes", "get_tuple", "list", "graph step")


def render(results: dict[str, Any]) -> str:
    lines = [
        "# LangGraph checkpointers: AgentMemorySaver against LangGraph's own",
        "",
        "Written by `bench/checkpointers.py` (`make bench`). Each figure: sequential calls on "
        "one thread already holding N checkpoints, each saver on the same database server as "
        "ours (SQLite: a file each); ops/s, and in parentheses agentmemory's ratio to that peer "
        "in the same run (> 1: agentmemory is faster). `put` extends the latest checkpoint with "
        "four of its 10 channels changed (~4 KB of state); `put_writes` saves 3 writes of a "
        "new task; `get_tuple` loads the latest; `list` the latest 10; a graph step is one "
        "`invoke` of a one-node graph.",
        "",
        f"Measured {results['when']} on {results['machine']}: {results['calls']} sequential "
        f"calls per figure, median of {results['repeats']}.",
        "",
        "| backend @ checkpoints | saver | " + " | ".join(FIGURES) + " |",
        "|---|---|" + "---|" * len(FIGURES),
    ]
    for where, by_name in results["throughput"].items():
        ours = by_name[OURS]
        for name, figures in by_name.items():
            cells = [
                f"{figures[k]:,.0f}"
                if name == OURS
                else f"{figures[k]:,.0f} ({ours[k] / figures[k]:.2f})"
                for k in FIGURES
            ]
            lines.append(f"| {where} | {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"**A `DeltaChannel`'s history** (`get_delta_channel_history` of a thread's latest "
        f"checkpoint, {2 * results['delta runs']:,} checkpoints back to the thread's root: the "
        "graph's load when the channel has not snapshotted): calls/s, and ours' ratio to each.",
        "",
        "| backend | saver | calls/s |",
        "|---|---|---|",
    ]
    for where, by_name in results["delta"].items():
        for name, figure in by_name.items():
            ratio = "" if name == OURS else f" ({by_name[OURS] / figure:.2f})"
            lines.append(f"| {where} | {name} | {figure:,.1f}{ratio} |")
    lines += [
        "",
        "**Two writers on one latest checkpoint** (both load it, then both put its child): "
        "rounds that left the thread forked -- a checkpoint with two children, of which "
        "`get_tuple` returns one and the other run's work is gone from the thread's history.",
        "",
        "| backend: saver | rounds | forked | conflicts raised |",
        "|---|---|---|---|",
    ]
    for where, figures in results["forks"].items():
        lines.append(
            f"| {where} | {figures['rounds']} | {figures['forked']} | {figures['conflicts raised']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
