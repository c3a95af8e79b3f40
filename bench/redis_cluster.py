"""What the Redis tier costs on a Redis Cluster against one Redis: ``recall`` (warm: served by
Redis), ``recall_many`` of ten keys and ``remember``, one session after another, and eight
threads over many sessions (spread over the cluster's groups) -- the same database (SQLite), a
Redis server and a three-primary cluster of the benchmark's own on this machine, interleaved
rounds in one run.

On this two-core machine the cluster's six processes share the cores with the benchmark: the
ratio to one Redis measures what the cluster client and the per-group names cost a call, not what
separate servers give.

    .venv/bin/python bench/redis_cluster.py           # docs/redis-cluster-benchmarks.{json,md}
    .venv/bin/python bench/redis_cluster.py --quick   # seconds, into out/
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.cache import caches  # noqa: E402

from agentmemory import MemoryStore  # noqa: E402
from agentmemory.consistency.redis_servers import ClusterGroup, RedisServer  # noqa: E402
from bench.run import (  # noqa: E402
    available_backends,
    progress,
    rate,
    run_header,
    run_threads,
    write_results,
)
from project.settings import redis_cache  # noqa: E402

SIZES = {
    "full": {"calls": 2000, "repeats": 5, "threads": 8, "per_thread": 200},
    "quick": {"calls": 200, "repeats": 1, "threads": 4, "per_thread": 30},
}
TIERS = ("one Redis", "Redis Cluster")
KEYS = [f"k{n}" for n in range(10)]


def sequential(store: MemoryStore, calls: int, session: str) -> dict[str, float]:
    store.remember_many(session, {key: {"n": 0} for key in KEYS})
    for _ in range(3):  # warm: the fence up, the entries filled
        store.recall(session, "k0")
        store.recall_many(session, KEYS)
    figures = {
        "recall": rate(calls, lambda n: store.recall(session, "k0")),
        "recall_many": rate(calls, lambda n: store.recall_many(session, KEYS)),
        "remember": rate(calls, lambda n: store.remember(session, KEYS[n % 10], {"n": n})),
    }
    hits = store.cache.stats["hits"] if store.cache is not None else 0
    figures["hits"] = hits
    return figures


def throughput(store: MemoryStore, threads: int, per_thread: int, tag: str) -> float:
    """ops/s of ``threads`` threads, each a remember and three recalls over 16 sessions of its
    own (on a cluster: over the groups), per step."""

    def work(index: int) -> int:
        sessions = [f"{tag}-t{index}-s{n}" for n in range(16)]
        for n in range(per_thread):
            session = sessions[n % 16]
            store.remember(session, "k", {"n": n})
            for _ in range(3):
                store.recall(session, "k")
        return per_thread * 4

    return run_threads(threads, work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    (database,) = available_backends(["sqlite"])
    results: dict[str, Any] = run_header(
        calls=size["calls"],
        repeats=size["repeats"],
        threads=size["threads"],
        per_thread=size["per_thread"],
        sequential={},
        throughput={},
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-redis-") as folder,
        RedisServer(Path(folder) / "one") as one,
        ClusterGroup(Path(folder) / "cluster") as cluster,
    ):
        settings.CACHES = {
            **settings.CACHES,
            "one Redis": redis_cache(one.url),
            "Redis Cluster": redis_cache(cluster.url),
        }
        stores = {tier: MemoryStore(using=database, cache=tier) for tier in TIERS}
        samples: dict[str, dict[str, list[float]]] = {tier: {} for tier in TIERS}
        counts: dict[str, list[float]] = {tier: [] for tier in TIERS}
        for round_ in range(size["repeats"]):
            progress(f"round {round_ + 1} of {size['repeats']}")
            order = TIERS if round_ % 2 == 0 else TIERS[::-1]  # each goes first in turn
            for tier in order:
                session = f"seq-{round_}-{tier.replace(' ', '-')}"
                for op, value in sequential(stores[tier], size["calls"], session).items():
                    samples[tier].setdefault(op, []).append(value)
                tag = f"thr-{round_}-{tier.replace(' ', '-')}"
                counts[tier].append(
                    throughput(stores[tier], size["threads"], size["per_thread"], tag)
                )
        caches.close_all()
    results["sequential"] = {
        tier: {op: statistics.median(values) for op, values in ops.items()}
        for tier, ops in samples.items()
    }
    results["throughput"] = {tier: statistics.median(values) for tier, values in counts.items()}
    write_results("redis-cluster-benchmarks", results, render, args.quick)


def render(results: dict[str, Any]) -> str:
    one = results["sequential"]["one Redis"]
    lines = [
        "# The Redis tier on a Redis Cluster",
        "",
        "Written by `bench/redis_cluster.py` (`make bench`). The same SQLite database; a Redis "
        "server and a cluster of three primaries and three replicas, the benchmark's own, on "
        f"this machine; interleaved rounds, the median of {results['repeats']}; measured "
        f"{results['when']} on {results['machine']}. The cluster's processes share the two "
        "cores with the benchmark: the ratio to one Redis is what the cluster client and the "
        "per-group names cost a call, not what separate servers give.",
        "",
        f"One session's calls one after the other ({results['calls']} each; `recall` and "
        "`recall_many` of ten keys warm, served by Redis), calls/s, and in parentheses the "
        "ratio to one Redis.",
        "",
        "| tier | recall | recall_many (10) | remember |",
        "|---|---|---|---|",
    ]
    for tier, figures in results["sequential"].items():
        cells = [
            f"{figures[op]:,.0f}"
            + ("" if tier == "one Redis" else f" ({figures[op] / one[op]:.2f})")
            for op in ("recall", "recall_many", "remember")
        ]
        lines.append(f"| {tier} | " + " | ".join(cells) + " |")
    base = results["throughput"]["one Redis"]
    lines += [
        "",
        f"{results['threads']} threads, each a remember and three recalls per step over 16 "
        f"sessions of its own, {results['per_thread']} steps, ops/s:",
        "",
        "| tier | ops/s |",
        "|---|---|",
    ]
    for tier, value in results["throughput"].items():
        ratio = "" if tier == "one Redis" else f" ({value / base:.2f})"
        lines.append(f"| {tier} | {value:,.0f}{ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
