"""Semantic search at scale: ``MemoryStore.search`` against LangGraph's ``InMemoryStore`` and
``SqliteStore`` (sqlite-vec), with the same embedder, the same data and the same queries, in one run.

    .venv/bin/python bench/search.py                      # 1,000 / 10,000 / 100,000 memories, SQLite
    .venv/bin/python bench/search.py --sizes 1000 --queries 10           # quick (CI)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/agentmemory_bench .venv/bin/python bench/search.py
    .venv/bin/python bench/search.py --write               # docs/search-benchmarks.{json,png}

Every memory is one value ``{"text": 8 words of 500, "n": i}`` in one session (one LangGraph
namespace); the embedder is the deterministic ``HashEmbedder`` of ``--dims`` dimensions (no model:
the figures are the stores' own cost, and embedding the query is the same call for all). Each
store answers the same ``--queries`` queries (``limit=10``), after one warm-up query; the table
gives the median query time and searches per second, and agentmemory's ratio to each peer (> 1:
faster). Loading goes through each store's own bulk path (``remember_many`` of 500, LangGraph's
``batch`` of 500 puts) and is timed too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("DJANGO_DEBUG", "0")
os.environ.setdefault(
    "DATABASE_URL", f"sqlite:///{tempfile.gettempdir()}/agentmemory-bench.sqlite3"
)

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from langgraph.store.base import PutOp  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402
from langgraph.store.sqlite import SqliteStore  # noqa: E402

from agentmemory import Index, MemoryStore  # noqa: E402
from agentmemory.testing.embeddings import HashEmbedder  # noqa: E402

SESSION = "bench-search"
NAMESPACE = ("bench", "search")
CHUNK = 500


def progress(message: str) -> None:
    print(f"bench-search: {message}", file=sys.stderr, flush=True)


def corpus(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = [f"w{n}" for n in range(500)]
    return [{"text": " ".join(rng.sample(words, 8)), "n": i} for i in range(count)]


def queries(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{n}" for n in range(500)]
    return [" ".join(rng.sample(words, 3)) for _ in range(count)]


def timed_load(put_chunk, values: list[dict]) -> float:
    started = time.perf_counter()
    for at in range(0, len(values), CHUNK):
        put_chunk(at, values[at : at + CHUNK])
        if at and at % (10 * CHUNK) == 0:
            progress(f"  {at:,}/{len(values):,}")
    return time.perf_counter() - started


def timed_queries(search, asked: list[str], before=None) -> list[float]:
    search(asked[0])  # warm-up: caches, statement preparation, the extension loaded
    times = []
    for at, query in enumerate(asked):
        if before is not None:
            before(at)  # not timed
        started = time.perf_counter()
        found = search(query)
        times.append(time.perf_counter() - started)
        assert len(found) == 10, len(found)
    return times


@contextmanager
def peer_store(path: str, index: dict) -> Iterator[SqliteStore]:
    """LangGraph's SqliteStore on a connection that can load sqlite-vec: pyenv's (and macOS's)
    Python builds leave extension loading out of the standard sqlite3 module, so the connection
    comes from pysqlite3 (SQLite with it built in) when the standard one cannot."""
    probe = sqlite3.connect(":memory:")
    module: Any = sqlite3
    if not hasattr(probe, "enable_load_extension"):
        try:
            import pysqlite3.dbapi2 as module  # type: ignore[no-redef]
        except ImportError:
            raise SystemExit(
                "this Python's sqlite3 cannot load extensions (sqlite-vec): pip install "
                "pysqlite3-binary (agentmemory[bench] does)"
            ) from None
    probe.close()
    conn = module.connect(path, check_same_thread=False, isolation_level=None)
    try:
        peer = SqliteStore(conn, index=index)
        peer.setup()
        yield peer
    finally:
        conn.close()


def run(size: int, dims: int, asked: list[str]) -> dict:
    values = corpus(size)
    index = {"dims": dims, "embed": HashEmbedder(dims), "fields": ["text"]}
    ours = MemoryStore(
        cache=None, index=Index(embed=HashEmbedder(dims), dims=dims, fields=["text"])
    )
    ours.erase_session(SESSION)
    figures: dict = {"size": size}

    progress(f"{size:,} memories: agentmemory ({connection.vendor})")
    figures["load_s"] = {
        "agentmemory": timed_load(
            lambda at, chunk: ours.remember_many(
                SESSION, {f"m{at + i:06d}": v for i, v in enumerate(chunk)}
            ),
            values,
        )
    }
    times = {"agentmemory": timed_queries(lambda q: ours.search(SESSION, q), asked)}
    # The same with one memory rewritten before each search: the session's stacked matrix is
    # built again (the vectors of the others still come from the process's cache).
    times["agentmemory, a write before each"] = timed_queries(
        lambda q: ours.search(SESSION, q),
        asked,
        before=lambda at: ours.remember(SESSION, f"m{at:06d}", corpus(1, seed=at + 7)[0]),
    )

    progress(f"{size:,} memories: LangGraph InMemoryStore")
    memory = InMemoryStore(index=index)
    figures["load_s"]["InMemoryStore"] = timed_load(
        lambda at, chunk: memory.batch(
            [PutOp(NAMESPACE, f"m{at + i:06d}", v) for i, v in enumerate(chunk)]
        ),
        values,
    )
    times["InMemoryStore"] = timed_queries(lambda q: memory.search(NAMESPACE, query=q), asked)

    progress(f"{size:,} memories: LangGraph SqliteStore (sqlite-vec)")
    with (
        tempfile.TemporaryDirectory() as folder,
        peer_store(f"{folder}/peer.sqlite3", index) as peer,
    ):
        figures["load_s"]["SqliteStore"] = timed_load(
            lambda at, chunk: peer.batch(
                [PutOp(NAMESPACE, f"m{at + i:06d}", v) for i, v in enumerate(chunk)]
            ),
            values,
        )
        times["SqliteStore"] = timed_queries(lambda q: peer.search(NAMESPACE, query=q), asked)
    ours.erase_session(SESSION)

    figures["median_ms"] = {name: statistics.median(t) * 1000 for name, t in times.items()}
    figures["per_s"] = {name: 1000 / ms for name, ms in figures["median_ms"].items()}
    ours_ms = figures["median_ms"]["agentmemory"]
    figures["ratio"] = {
        peer: figures["median_ms"][peer] / ours_ms for peer in ("InMemoryStore", "SqliteStore")
    }
    return figures


def table(results: list[dict], vendor: str) -> str:
    lines = [
        f"| memories | agentmemory ({vendor}) | the same, a write before each | InMemoryStore | "
        "SqliteStore | vs InMemoryStore | vs SqliteStore (after a write) | "
        "load, s (ours / InMemory / Sqlite) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        ms, load = r["median_ms"], r["load_s"]
        after = ms["agentmemory, a write before each"]
        lines.append(
            f"| {r['size']:,} | {ms['agentmemory']:.2f} ms | {after:.2f} ms | "
            f"{ms['InMemoryStore']:.2f} ms | {ms['SqliteStore']:.2f} ms | "
            f"{r['ratio']['InMemoryStore']:.2f}x | {r['ratio']['SqliteStore']:.2f}x "
            f"({ms['SqliteStore'] / after:.2f}x) | {load['agentmemory']:.1f} / "
            f"{load['InMemoryStore']:.1f} / {load['SqliteStore']:.1f} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: Path, vendor: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["size"] for r in results]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name in ("agentmemory", "agentmemory, a write before each", "InMemoryStore", "SqliteStore"):
        label = name.replace("agentmemory", f"agentmemory ({vendor})", 1)
        if name in ("InMemoryStore", "SqliteStore"):
            label = f"LangGraph {name}"
        ax.plot(sizes, [r["median_ms"][name] for r in results], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("memories in the namespace")
    ax.set_ylabel("median search time, ms (lower is better)")
    ax.set_title("search(query, limit=10), exact cosine ranking")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--write", action="store_true", help="docs/search-benchmarks.*")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    vendor = connection.vendor
    asked = queries(args.queries)
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        results.append(run(size, args.dims, asked))
        progress(table(results[-1:], vendor).splitlines()[-1])
    print(table(results, vendor))
    if args.write:
        stem = ROOT / "docs" / f"search-benchmarks-{vendor}"
        stem.with_suffix(".json").write_text(
            json.dumps({"vendor": vendor, "dims": args.dims, "results": results}, indent=2) + "\n"
        )
        plot(results, stem.with_suffix(".png"), vendor)
        (ROOT / "docs" / "search-benchmarks.md").write_text(
            f"`bench/search.py`: one session (one LangGraph namespace) of N memories, each "
            f'`{{"text": 8 words of 500}}` embedded by the deterministic `HashEmbedder` '
            f"({args.dims} dimensions; the same embedder, data and queries for every store); "
            f"the median of {args.queries} searches (`limit=10`) after one warm-up; ratios > 1: "
            'agentmemory faster. "A write before each": one memory rewritten before every '
            "timed search (the session's kept matrix is patched). Load: each store's bulk path "
            f"(`remember_many` of {CHUNK}; LangGraph's `batch` of {CHUNK} puts). "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {vendor}, this machine "
            "(2 cores).\n\n"
            + table(results, vendor)
            + f"\n\n![search](search-benchmarks-{vendor}.png)\n"
        )
        progress(f"wrote {stem}.json and .png, docs/search-benchmarks.md")


if __name__ == "__main__":
    main()
