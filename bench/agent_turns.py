"""The agent-level benchmark: N agents at once, each turn what an agent's backend does per turn,
on agentmemory's stack against the frameworks' own, on the same machine, in one run.

    .venv/bin/python bench/agent_turns.py           # docs/agent-benchmarks.{json,md,png}
    .venv/bin/python bench/agent_turns.py --quick   # seconds, into out/ (CI runs it)

A turn (asyncio, as the frameworks' async interfaces are used by an agent server): load the
session's recent items (``get_items(limit=20)``), load the thread's latest checkpoint
(``aget_tuple``), save the step's writes and its checkpoint (``aput_writes``, ``aput``: 10
channels, ~4 KB, 4 changed a step, as ``bench/checkpointers.py``), add the turn's two items to the
session (``add_items``), write one long-term memory (``aput``), and every 5th turn list the
user's memories (``asearch`` of the namespace, no query: a vector search would need pgvector on
the peers' side and a model here).

The stacks, on one database each:

- **agentmemory**: ``AgentMemorySaver`` + ``AgentMemorySession`` + ``AgentMemoryStore`` on one
  ``MemoryStore`` (Redis off, and on where a Redis answers: the store's reads and writes go
  through the tier);
- **PostgreSQL peers**: ``AsyncPostgresSaver`` + ``AsyncPostgresStore`` on one psycopg pool (as
  LangGraph's docs set them up for production) + the SDK's ``SQLAlchemySession`` on one engine;
- **SQLite peers**: ``AsyncSqliteSaver`` + ``AsyncSqliteStore`` (aiosqlite) + the SDK's
  ``SQLiteSession`` (its default).

For 1, 8 and 32 agents (each its own thread and session): turns per second and p50/p99 turn
latency, median of ``--repeats`` interleaved runs. Then what each stack got wrong under
contention: pairs of workers serving one conversation at once (a retried request, a double
submit), each doing its turns; counted afterwards: threads left forked (a checkpoint with two
children: one worker's step is gone from what the thread loads) and session items lost. A
conflict agentmemory raises is retried by the worker (the turn reloads and runs again), as the
integration pages say to. No speed is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

from agentmemory import CheckpointConflict, MemoryStore, aio  # noqa: E402
from bench.checkpointers import CHANNELS, changed, value  # noqa: E402
from bench.run import available_backends, progress, redis_available, run_header, write_results  # noqa: E402
from bench.sessions import sqlalchemy_url  # noqa: E402

SIZES = {
    "full": {"agents": (1, 8, 32), "turns": 30, "repeats": 3, "pairs": 8, "pair_turns": 10},
    "quick": {"agents": (1, 8), "turns": 4, "repeats": 1, "pairs": 2, "pair_turns": 3},
}
OURS, OURS_REDIS = "agentmemory", "agentmemory + Redis"


@dataclass
class Stack:
    """One backend stack: a checkpointer, a long-term store, a session per conversation."""

    name: str
    saver: Any
    store: Any
    session: Callable[[str], Any]
    closers: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)
    conflicts: int = 0

    async def close(self) -> None:
        for close in self.closers:
            await close()


# ---------------------------------------------------------------- the stacks


def ours(alias: str, cached: bool) -> Stack:
    from agentmemory.integrations.langgraph import AgentMemorySaver, AgentMemoryStore
    from agentmemory.integrations.openai_agents import AgentMemorySession

    store = MemoryStore(using=alias, **({} if cached else {"cache": None}))
    return Stack(
        OURS_REDIS if cached else OURS,
        AgentMemorySaver(store),
        AgentMemoryStore(store),
        lambda sid: AgentMemorySession(sid, store=store),
    )


async def postgres_peers(alias: str, agents: int) -> Stack:
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.store.postgres.aio import AsyncPostgresStore
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool
    from sqlalchemy.ext.asyncio import create_async_engine

    db = settings.DATABASES[alias]
    url = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    pool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max(agents, 2),
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
    )
    await pool.open()
    saver = AsyncPostgresSaver(pool)
    await saver.setup()
    store = AsyncPostgresStore(pool)
    await store.setup()
    engine = create_async_engine(sqlalchemy_url(alias, Path()), pool_size=max(agents, 2))
    return Stack(
        "LangGraph + SDK on PostgreSQL",
        saver,
        store,
        lambda sid: SQLAlchemySession(sid, engine=engine, create_tables=True),
        [pool.close, engine.dispose],
    )


async def sqlite_peers(folder: Path) -> Stack:
    import aiosqlite
    from agents import SQLiteSession
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    saver_conn = await aiosqlite.connect(folder / "peer-checkpoints.sqlite3")
    await saver_conn.execute("PRAGMA journal_mode=WAL")
    saver = AsyncSqliteSaver(saver_conn)
    await saver.setup()
    # As AsyncSqliteStore.from_conn_string opens it: the store begins its transactions itself.
    store_conn = await aiosqlite.connect(folder / "peer-store.sqlite3", isolation_level=None)
    await store_conn.execute("PRAGMA journal_mode=WAL")
    store = AsyncSqliteStore(store_conn)
    await store.setup()
    path = str(folder / "peer-sessions.sqlite3")
    return Stack(
        "LangGraph + SDK on SQLite",
        saver,
        store,
        lambda sid: SQLiteSession(sid, db_path=path),
        [saver_conn.close, store_conn.close],
    )


# ---------------------------------------------------------------- a turn


def item(role: str, agent: str, n: int) -> dict[str, Any]:
    return {"role": role, "content": f"{agent} turn {n}: " + "lorem ipsum " * 8}


def next_checkpoint(
    saver: Any, loaded: Any, n: int
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The step's checkpoint after ``loaded`` (a tuple, or None on a new thread): as
    ``bench/checkpointers.py``'s, four of the 10 channels changed."""
    before = loaded.checkpoint["channel_versions"] if loaded is not None else {}
    versions = {channel: before.get(channel) for channel in CHANNELS}
    new = {}
    for channel in changed(n) if before else CHANNELS:
        versions[channel] = new[channel] = saver.get_next_version(versions[channel], None)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {channel: value(channel, n) for channel in new}
    checkpoint["channel_versions"] = versions
    return checkpoint, {"source": "loop", "step": n, "parents": {}}, new


async def turn(stack: Stack, thread: str, session: Any, user: str, n: int) -> None:
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    await session.get_items(limit=20)
    while True:
        loaded = await stack.saver.aget_tuple(config)
        checkpoint, metadata, new = next_checkpoint(stack.saver, loaded, n)
        try:
            if loaded is not None:
                writes = [("messages", value("messages", n))]
                await stack.saver.aput_writes(loaded.config, writes, f"task-{thread}-{n}")
            await stack.saver.aput(loaded.config if loaded else config, checkpoint, metadata, new)
            break
        except CheckpointConflict:
            stack.conflicts += 1  # another worker stepped the thread: reload, run the step again
    await session.add_items([item("user", thread, n), item("assistant", thread, n)])
    await stack.store.aput(("memories", user), f"fact-{thread}-{n}", {"text": f"turn {n}"})
    if n % 5 == 4:
        await stack.store.asearch(("memories", user), limit=10)


async def agents_run(stack: Stack, agents: int, turns: int) -> dict[str, float]:
    """``agents`` agents at once, ``turns`` turns each: turns/s and turn latencies (ms)."""
    run = uuid.uuid4().hex[:8]
    latencies: list[float] = []

    async def agent(i: int) -> None:
        thread = f"agent-{run}-{i}"
        session = stack.session(thread)
        for n in range(turns):
            started = time.perf_counter()
            await turn(stack, thread, session, f"user-{run}-{i % 4}", n)
            latencies.append(1000 * (time.perf_counter() - started))

    started = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(agents)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "turns/s": agents * turns / elapsed,
        "p50 ms": latencies[len(latencies) // 2],
        "p99 ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


async def contention(stack: Stack, pairs: int, turns: int) -> dict[str, int]:
    """Two workers per conversation at once; forks and lost items counted afterwards."""
    run = uuid.uuid4().hex[:8]
    conflicts_before = stack.conflicts

    async def worker(thread: str, w: int) -> None:
        session = stack.session(thread)
        for n in range(turns):
            await turn(stack, thread, session, f"user-{run}", 1000 * w + n)

    threads = [f"shared-{run}-{p}" for p in range(pairs)]
    await asyncio.gather(*(worker(thread, w) for thread in threads for w in range(2)))
    forked = lost = 0
    for thread in threads:
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        parents = Counter(
            [
                found.parent_config["configurable"]["checkpoint_id"]
                async for found in stack.saver.alist(config)
                if found.parent_config is not None
            ]
        )
        forked += bool(parents) and max(parents.values()) > 1
        lost += 2 * 2 * turns - len(await stack.session(thread).get_items())
    return {
        "conversations": pairs,
        "forked": forked,
        "items lost": lost,
        "conflicts retried": stack.conflicts - conflicts_before,
    }


# ---------------------------------------------------------------- the run


async def backend_run(alias: str, size: dict[str, Any], folder: Path) -> dict[str, Any]:
    most = max(size["agents"])
    stacks = [ours(alias, cached=False)]
    if redis_available():
        stacks.append(ours(alias, cached=True))
    stacks.append(
        await (sqlite_peers(folder) if alias == "sqlite" else postgres_peers(alias, most))
    )
    samples: dict[str, dict[int, list[dict[str, float]]]] = {s.name: {} for s in stacks}
    for stack in stacks:  # connections opened, tables created, statements prepared: not timed
        progress(f"{alias}: {stack.name}, warming up")
        await agents_run(stack, 2, 2)
    for agents in size["agents"]:
        for repeat in range(size["repeats"]):
            for stack in stacks:
                progress(f"{alias}: {stack.name}, {agents} agents, run {repeat + 1}")
                figures = await agents_run(stack, agents, size["turns"])
                samples[stack.name].setdefault(agents, []).append(figures)
    errors = {}
    for stack in stacks:
        progress(f"{alias}: {stack.name}, two workers per conversation")
        errors[stack.name] = await contention(stack, size["pairs"], size["pair_turns"])
    for stack in stacks:
        await stack.close()
    return {
        "throughput": {
            name: {
                str(agents): {k: statistics.median(run[k] for run in runs) for k in runs[0]}
                for agents, runs in by_agents.items()
            }
            for name, by_agents in samples.items()
        },
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, into out/")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    results: dict[str, Any] = run_header(
        **{
            "turns": size["turns"],
            "repeats": size["repeats"],
            "pair turns": size["pair_turns"],
            "backends": {},
        }
    )
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp:
        for alias in available_backends(args.backends.split(",")):
            results["backends"][alias] = asyncio.run(backend_run(alias, size, Path(tmp)))
            aio.close_connections()
            connections[alias].close()
    write_results("agent-benchmarks", results, render, args.quick, chart=chart)


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Agents at once: agentmemory's stack against the frameworks' own",
        "",
        "Written by `bench/agent_turns.py` (`make bench-agents`). N agents at once on one database, "
        "each turn: the session's latest 20 items, the thread's latest checkpoint, the step's "
        "writes and checkpoint (10 channels, ~4 KB), two session items, one long-term memory, "
        "and every 5th turn a listing of the user's memories. Turns per second and turn "
        "latency; in parentheses agentmemory's ratio to the peers' stack in the same run "
        "(throughput: > 1 is faster; latency: < 1 is faster).",
        "",
        f"Measured {results['when']} on {results['machine']}: {results['turns']} turns per "
        f"agent, median of {results['repeats']} interleaved runs.",
        "",
        "![Turns per second against agents at once, per backend and stack](agent-benchmarks.png)",
        "",
        "| backend | stack | agents | turns/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for alias, found in results["backends"].items():
        by_stack = found["throughput"]
        peer = next(name for name in by_stack if not name.startswith(OURS))
        for name, by_agents in by_stack.items():
            for agents, figures in by_agents.items():
                theirs = by_stack[peer][agents]
                cells = [
                    f"{figures[k]:,.1f}"
                    + ("" if name == peer else f" ({figures[k] / theirs[k]:.2f})")
                    for k in ("turns/s", "p50 ms", "p99 ms")
                ]
                lines.append(f"| {alias} | {name} | {agents} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"**Two workers per conversation at once** ({results['pair turns']} turns each): "
        "threads left forked (a checkpoint with two children: one worker's step is gone from "
        "what the thread loads), session items lost, and the conflicts agentmemory raised "
        "that the workers retried.",
        "",
        "| backend | stack | conversations | forked | items lost | conflicts retried |",
        "|---|---|---|---|---|---|",
    ]
    for alias, found in results["backends"].items():
        for name, e in found["errors"].items():
            lines.append(
                f"| {alias} | {name} | {e['conversations']} | {e['forked']} | "
                f"{e['items lost']} | {e['conflicts retried']} |"
            )
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any], path: Path) -> None:
    """Turns/s against agents, a panel per backend, a line per stack."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the report extra is not installed: the table is the result
        return
    backends = results["backends"]
    fig, axes = plt.subplots(1, len(backends), figsize=(5 * len(backends), 3.6), squeeze=False)
    for ax, (alias, found) in zip(axes[0], backends.items(), strict=True):
        for name, by_agents in found["throughput"].items():
            agents = [int(a) for a in by_agents]
            ax.plot(agents, [f["turns/s"] for f in by_agents.values()], marker="o", label=name)
        ax.set_title(alias)
        ax.set_xlabel("agents at once")
        ax.set_ylabel("turns per second")
        ax.set_xscale("log", base=2)
        ax.set_xticks(agents, [str(a) for a in agents])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
