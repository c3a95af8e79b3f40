"""What sharding costs and gives: ``remember`` and ``recall`` through
:class:`~agentmemory.ShardedStore` against :class:`~agentmemory.MemoryStore` on the same
database (one shard: the router's own cost), and eight threads' throughput over 1, 2 and 4
shards (SQLite files; PostgreSQL databases of one server) -- interleaved, in one run.

On this two-core machine the shards share the cores (and PostgreSQL's shards one server): the
ratio to one shard measures the router's overhead and, on SQLite, one writer per file instead of
one for all -- not what separate servers would give.

    .venv/bin/python bench/sharding.py           # docs/sharding-benchmarks.{json,md}
    .venv/bin/python bench/sharding.py --quick   # seconds, into out/
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import django  # noqa: E402

django.setup()

from agentmemory import MemoryStore, ShardedStore  # noqa: E402
from agentmemory.sharding import place, record_shards  # noqa: E402
from bench.run import (  # noqa: E402
    available_backends,
    progress,
    rate,
    run_header,
    run_threads,
    write_results,
)

SIZES = {
    "full": {"calls": 2000, "repeats": 5, "threads": 8, "per_thread": 200, "moves": 20},
    "quick": {"calls": 200, "repeats": 1, "threads": 4, "per_thread": 30, "moves": 4},
}
SHARD_COUNTS = (1, 2, 4)


def overhead(base: str, calls: int, flip: bool) -> dict[str, dict[str, float]]:
    """Sequential calls/s of one session's remember, then recall, by the plain store and by a
    one-shard router over the same database -- each call's two figures side by side, in turn
    first (``flip``): SQLite's reads slow down as its write-ahead log grows between checkpoints,
    so whichever ran after more writes would pay for it."""
    stores = {
        "MemoryStore": MemoryStore(using=base, cache=None),
        "ShardedStore, 1 shard": sharded([base]),
    }
    order = list(stores.items())[:: -1 if flip else 1]
    sessions = {name: f"bench-{uuid.uuid4().hex[:8]}" for name in stores}
    figures: dict[str, dict[str, float]] = {name: {} for name in stores}
    for name, store in order:
        session = sessions[name]
        figures[name]["remember"] = rate(calls, lambda n, s=store, i=session: s.remember(i, "k", n))
    for name, store in order:
        session = sessions[name]
        figures[name]["recall"] = rate(calls, lambda n, s=store, i=session: s.recall(i, "k"))
    for name, store in stores.items():
        store.erase_session(sessions[name])
    return figures


def sharded(aliases: list[str]) -> ShardedStore:
    """A router over ``aliases``, each recording them as its list first (the benchmark changes
    the list between figures, as an operator does with ``agentmemory_shards set``)."""
    for alias in aliases:
        record_shards(alias, aliases)
    return ShardedStore(aliases, cache=None)


def throughput(aliases: list[str], threads: int, per_thread: int) -> float:
    """ops/s of ``threads`` threads, each writing and reading keys of sessions of its own
    (a remember then a recall, ``per_thread`` times) through a router over ``aliases``."""
    store = sharded(aliases)
    run = uuid.uuid4().hex[:8]

    def work(index: int) -> int:
        for n in range(per_thread):
            session = f"bench-{run}-{index}-{n % 16}"
            store.remember(session, "k", n)
            store.recall(session, "k")
        return 2 * per_thread

    ops = run_threads(threads, work)
    for index in range(threads):
        for n in range(16):
            store.erase_session(f"bench-{run}-{index}-{n}")
    return ops


#: The session a move moves: memories with a few versions each and a log -- an agent's session
#: of ordinary size.
MOVED_MEMORIES, MOVED_VERSIONS, MOVED_ITEMS = 50, 3, 50


def moving(aliases: list[str], moves: int) -> dict[str, float]:
    """Milliseconds of one move (``ShardedStore.move``) of a session of ordinary size between
    the first two shards, back and forth ``moves`` times: the median, and the rows it copies."""
    store = sharded(aliases[:2])
    session = f"bench-move-{uuid.uuid4().hex[:8]}"
    for n in range(MOVED_MEMORIES):
        for version in range(MOVED_VERSIONS):
            store.remember(session, f"fact-{n}", {"n": n, "version": version, "text": "x" * 200})
    store.append(session, "chat", [{"role": "user", "text": "y" * 200}] * MOVED_ITEMS)
    spans, rows = [], 0
    for _ in range(moves):
        target = next(alias for alias in aliases[:2] if alias != store.locate(session))
        report = store.move(session, target)
        spans.append(report.seconds * 1000)
        rows = report.rows
    store.erase_session(session)
    return {"ms": statistics.median(spans), "rows": rows}


def placing_us(shards: int, calls: int) -> float:
    """Microseconds of one placement among ``shards`` aliases, each session id new (the
    placement's cache of recent ids never answers)."""
    aliases = [f"shard{n}" for n in range(shards)]
    ids = [f"session-{n}-{uuid.uuid4().hex}" for n in range(calls)]
    started = time.perf_counter()
    for session_id in ids:
        place(session_id, aliases)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    results: dict[str, Any] = run_header(
        calls=size["calls"],
        repeats=size["repeats"],
        threads=size["threads"],
        per_thread=size["per_thread"],
        overhead={},
        throughput={},
        moves=size["moves"],
        placing_us={n: placing_us(n, 20_000) for n in (1, 2, 4, 16)},
    )
    for base in ("sqlite", "postgres"):
        aliases = available_backends([base, *(f"{base}-shard{n}" for n in range(1, 4))])
        if len(aliases) < 4:
            progress(f"{base}: not every shard is available, skipped")
            continue
        samples: dict[str, dict[str, list[float]]] = {}
        counts: dict[int, list[float]] = {n: [] for n in SHARD_COUNTS}
        for round_ in range(size["repeats"]):
            progress(f"{base}: round {round_ + 1} of {size['repeats']}")
            for name, figures in overhead(base, size["calls"], flip=bool(round_ % 2)).items():
                for op, value in figures.items():
                    samples.setdefault(name, {}).setdefault(op, []).append(value)
            for n in SHARD_COUNTS:
                counts[n].append(throughput(aliases[:n], size["threads"], size["per_thread"]))
        results["overhead"][base] = {
            name: {op: statistics.median(v) for op, v in ops.items()}
            for name, ops in samples.items()
        }
        results["throughput"][base] = {str(n): statistics.median(v) for n, v in counts.items()}
        results.setdefault("moving", {})[base] = moving(aliases, size["moves"])
    write_results("sharding-benchmarks", results, render, args.quick)


def render(results: dict[str, Any]) -> str:
    lines = [
        "# What sharding costs and gives",
        "",
        "Written by `bench/sharding.py` (`make bench`). Interleaved rounds in one run, the median "
        f"of {results['repeats']}; measured {results['when']} on {results['machine']}.",
        "",
        "## The router's own cost",
        "",
        f"One session's calls one after the other ({results['calls']} each), calls/s, and in "
        "parentheses the ratio to MemoryStore on the same database (1.00: no cost).",
        "",
        "| database | store | remember | recall |",
        "|---|---|---|---|",
    ]
    for base, stores in results["overhead"].items():
        plain = stores["MemoryStore"]
        for name, figures in stores.items():
            cells = [
                f"{figures[op]:,.0f}"
                + ("" if name == "MemoryStore" else f" ({figures[op] / plain[op]:.2f})")
                for op in ("remember", "recall")
            ]
            lines.append(f"| {base} | {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Placing a session among n shards (rendezvous hashing: one BLAKE2b of the id, then an "
        "integer mix per shard), a new id each call, µs: "
        + ", ".join(f"n={n}: {us:.2f}" for n, us in results["placing_us"].items())
        + ". A process keeps the placement of its 65,536 most recent ids.",
        "",
        "## Throughput over 1, 2 and 4 shards",
        "",
        f"{results['threads']} threads, each a remember and a recall {results['per_thread']} "
        "times over 16 sessions of its own, ops/s, and the ratio to one shard. The shards share "
        "this machine's two cores (PostgreSQL's: one server): the ratio shows the router's cost "
        "and, on SQLite, one writer per file -- not what separate servers give.",
        "",
        "| database | 1 shard | 2 shards | 4 shards |",
        "|---|---|---|---|",
    ]
    for base, by_count in results["throughput"].items():
        one = by_count["1"]
        cells = [
            f"{by_count[str(n)]:,.0f}" + ("" if n == 1 else f" ({by_count[str(n)] / one:.2f})")
            for n in SHARD_COUNTS
        ]
        lines.append(f"| {base} | " + " | ".join(cells) + " |")
    if results.get("moving"):
        lines += [
            "",
            "## Moving a session online",
            "",
            f"`ShardedStore.move` of a session of {MOVED_MEMORIES} memories with "
            f"{MOVED_VERSIONS} versions each and a log of {MOVED_ITEMS} items, between two "
            "shards of the same engine, back and forth: the median of "
            f"{results.get('moves', '?')} moves. The session's writes wait only while its rows "
            "are copied; its reads never do.",
            "",
            "| database | rows copied | ms per move |",
            "|---|---|---|",
        ]
        for base, figures in results["moving"].items():
            lines.append(f"| {base} | {figures['rows']:,} | {figures['ms']:.0f} |")
    lines += [
        "",
        "The `ShardedStore` rows above include each write's pass of its session's gate (what "
        "makes moving sessions online safe); a `MemoryStore` pays none.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
