"""The benchmark: the store against the raw-driver limit and against LangGraph's stores, on every
available backend, in one process and one run.

    .venv/bin/python bench/run.py            # full run: docs/benchmarks.{json,md,png}
    .venv/bin/python bench/run.py --quick    # < 1 minute, writes out/ only (CI runs this)
    .venv/bin/python bench/run.py --backends sqlite,postgres --repeats 5

Each figure is measured ``--repeats`` times, interleaved with its baselines, and reported as
min/median/max ops/s and as ratios of the medians. The raw-driver baseline runs the same protocol
directly on the driver (sqlite3, mysqlclient, psycopg, redis-py): begin; insert-if-missing;
``SELECT ... FOR UPDATE``; update the row; insert the history row; commit -- or, for reads, one
primary-key ``SELECT`` (or Redis ``GET``) and a JSON decode. LangGraph's ``SqliteStore`` and
``PostgresStore`` keep no versions and no history: their figures are the cost of a last-write-wins
put/get, for comparison, not the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402

from agentmemory import MemoryStore, aio  # noqa: E402
from agentmemory.cache import READ_SCRIPT  # noqa: E402
from agentmemory.consistency.runner import run_memcheck  # noqa: E402
from agentmemory.consistency.workloads import WorkloadConfig  # noqa: E402
from bench import raw  # noqa: E402

SIZES = {
    # ops per thread (writes), threads, read keys x rounds, remember_many calls, memcheck ops
    "full": {"writes": 300, "threads": 8, "reads": (100, 10), "many": 40, "memcheck": 2000},
    "quick": {"writes": 40, "threads": 4, "reads": (50, 2), "many": 5, "memcheck": 300},
}


def run_header(**figures: Any) -> dict[str, Any]:
    """A results dict's first entries: when and on what machine it was measured, then
    ``figures``' (calls, repeats, the tables the benchmark fills)."""
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        **figures,
    }


def write_results(
    name: str,
    results: dict[str, Any],
    render: Callable[[dict[str, Any]], str],
    quick: bool,
    chart: Callable[[dict[str, Any], Path], None] | None = None,
) -> None:
    """``<name>.json`` and ``<name>.md`` (and ``<name>.png`` with ``chart``) into docs/, or
    into out/ for a quick run (a loaded machine's figures are not worth publishing); the page
    printed too."""
    out = ROOT / ("out" if quick else "docs")
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    page = render(results)
    (out / f"{name}.md").write_text(page)
    if chart is not None:
        chart(results, out / f"{name}.png")
    print(page)


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- set-up


def available_backends(wanted: list[str]) -> list[str]:
    found = []
    for alias in wanted:
        try:
            raw.create_database(settings.DATABASES[alias])
            call_command("migrate", database=alias, verbosity=0)
            found.append(alias)
        except Exception as exc:  # a server that is down is reported, the others still run
            progress(f"{alias}: skipped ({type(exc).__name__}: {exc})")
    return found


def redis_available() -> bool:
    try:
        MemoryStore(cache="agentmemory").cache.client.ping()
        return True
    except Exception as exc:
        progress(f"Redis: skipped ({exc})")
        return False


# ---------------------------------------------------------------- measuring


def rate(calls: int, call: Callable[[int], Any]) -> float:
    """calls/s of ``call(n)`` for n in 0 .. calls - 1, one after the other."""
    started = time.perf_counter()
    for n in range(calls):
        call(n)
    return calls / (time.perf_counter() - started)


def run_threads(threads: int, work: Callable[[int], int]) -> float:
    """ops/s of ``work(thread index) -> ops done`` in ``threads`` threads started together."""
    barrier, done = threading.Barrier(threads + 1), [0] * threads
    errors: list[BaseException] = []

    def body(index: int) -> None:
        barrier.wait()
        try:
            done[index] = work(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    pool = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in pool:
        thread.join()
    if errors:
        raise errors[0]
    return sum(done) / (time.perf_counter() - started)


def timed_reads(read: Callable[[str], Any], keys: list[str], rounds: int) -> dict[str, float]:
    latencies = []
    for _ in range(rounds):
        for key in keys:
            started = time.perf_counter()
            found = read(key)
            latencies.append(time.perf_counter() - started)
            assert found is not None, key
    latencies.sort()
    return {
        "ops": len(latencies) / sum(latencies),
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
    }


def bind(call: Callable[..., Any], where: Any, keys: list[str], value: Any) -> Callable[[int], int]:
    """A thread body calling ``call(where, key, value)`` for each key; returns the calls made."""

    def body(_index: int) -> int:
        for key in keys:
            call(where, key, value)
        return len(keys)

    return body


def bind_read(read: Callable[[Any, str], Any], where: Any) -> Callable[[str], Any]:
    return lambda key: read(where, key)


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


# ---------------------------------------------------------------- the figures


def write_figures(alias: str, size: dict, cached: bool) -> dict[str, Callable[[], float]]:
    """Each figure as a no-argument function returning ops/s, for the store and its baseline."""
    store = MemoryStore(using=alias, cache="agentmemory" if cached else None)
    writes, threads = size["writes"], size["threads"]
    driver = raw.Driver(settings.DATABASES[alias])
    value = {"note": "a memory of typical size", "tags": ["a", "b", "c"], "n": 0}
    # With the cache tier on, the raw protocol also does the least a cache that is never stale
    # needs (raw.Driver.writes): one Redis round trip before COMMIT, one after.
    redis = store.cache.client if store.cache is not None else None

    def session() -> str:
        return f"bench-{uuid.uuid4().hex[:10]}"

    def store_single() -> float:
        s = session()
        return run_threads(
            1, lambda _: [store.remember(s, f"k{i % 20}", value) for i in range(writes)] and writes
        )

    def raw_single() -> float:
        s = session()
        return run_threads(
            1, lambda _: driver.writes(s, [f"k{i % 20}" for i in range(writes)], value, redis=redis)
        )

    def store_hot() -> float:
        s = session()
        return run_threads(
            threads, lambda _: [store.remember(s, "hot", value) for _ in range(writes)] and writes
        )

    def raw_hot() -> float:
        s = session()
        return run_threads(
            threads, lambda _: driver.writes(s, ["hot"] * writes, value, redis=redis)
        )

    def spread_keys(index: int) -> list[str]:
        rng = random.Random(index)
        return [f"k{rng.randrange(1000)}" for _ in range(writes)]

    def store_spread() -> float:
        s = session()

        def work(index: int) -> int:
            for key in spread_keys(index):
                store.remember(s, key, value)
            return writes

        return run_threads(threads, work)

    def raw_spread() -> float:
        s = session()
        return run_threads(threads, lambda i: driver.writes(s, spread_keys(i), value, redis=redis))

    def store_update_hot() -> float:
        s = session()
        bump = lambda v: {**v, "n": v["n"] + 1}
        return run_threads(
            threads,
            lambda _: (
                [store.update(s, "hot", bump, default=value) for _ in range(writes)] and writes
            ),
        )

    def store_many() -> float:
        s = session()
        items = {f"k{i}": value for i in range(20)}
        calls = size["many"]
        return run_threads(
            1, lambda _: [store.remember_many(s, items) for _ in range(calls)] and calls
        )

    def raw_many() -> float:
        s = session()
        keys = [f"k{i}" for i in range(20)]
        calls = size["many"]
        return run_threads(
            1,
            lambda _: (
                [
                    driver.writes(s, keys, value, one_transaction=True, redis=redis)
                    for _ in range(calls)
                ]
                and calls
            ),
        )

    return {
        "remember, 1 thread": (store_single, raw_single),
        f"remember, {threads} threads, one hot key": (store_hot, raw_hot),
        f"remember, {threads} threads, 1,000 keys": (store_spread, raw_spread),
        f"update(fn), {threads} threads, one hot key": (store_update_hot, raw_hot),
        "remember_many (20 keys), calls/s": (store_many, raw_many),
    }


def measure(alias: str, size: dict, repeats: int, redis: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for cached in [False, True] if redis else [False]:
        for name, (ours, baseline) in write_figures(alias, size, cached).items():
            progress(f"{alias}{' +redis' if cached else ''}: {name}")
            store_runs, raw_runs = [], []
            for _ in range(repeats):  # interleaved: drift hits both alike
                store_runs.append(ours())
                raw_runs.append(baseline())
            label = "raw driver + Redis" if cached else "raw driver"
            rows.append(figure(alias, cached, name, store_runs, {label: raw_runs}))
    rows += read_figures(alias, size, repeats, redis)
    return rows


def async_figures(alias: str, size: dict, repeats: int) -> list[dict[str, Any]]:
    """32 concurrent ``aremember`` tasks in one event loop against ``threads`` threads calling
    ``remember``: the same writes (spread over 1,000 keys), the same total."""
    store = MemoryStore(using=alias, cache=None)
    value = {"note": "a memory of typical size", "tags": ["a", "b", "c"], "n": 0}
    threads, writes, tasks = size["threads"], size["writes"], 32
    total = threads * writes

    def keys(index: int, count: int) -> list[str]:
        rng = random.Random(index)
        return [f"k{rng.randrange(1000)}" for _ in range(count)]

    def sync_threads() -> float:
        s = f"bench-{uuid.uuid4().hex[:10]}"
        return run_threads(
            threads, lambda i: [store.remember(s, k, value) for k in keys(i, writes)] and writes
        )

    def async_tasks() -> float:
        s = f"bench-{uuid.uuid4().hex[:10]}"
        per_task = total // tasks

        async def task(index: int) -> None:
            for key in keys(index, per_task):
                await store.aremember(s, key, value)

        async def main() -> float:
            started = time.perf_counter()
            await asyncio.gather(*(task(i) for i in range(tasks)))
            return per_task * tasks / (time.perf_counter() - started)

        return asyncio.run(main())

    progress(f"{alias}: aremember, {tasks} tasks")
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(async_tasks())
        theirs.append(sync_threads())
    aio.close_connections()
    label = f"remember, {threads} threads (sync)"
    return [figure(alias, False, f"aremember, {tasks} concurrent tasks", ours, {label: theirs})]


def figure(
    alias: str,
    cached: bool,
    name: str,
    ours: list[float],
    baselines: dict[str, list[float]],
    **extra: Any,
) -> dict[str, Any]:
    mine = summary(ours)
    return {
        "backend": alias,
        "redis": cached,
        "figure": name,
        "ops_per_s": mine,
        "baselines": {
            label: {**summary(runs), "ratio": mine["median"] / statistics.median(runs)}
            for label, runs in baselines.items()
        },
        **extra,
    }


def read_figures(alias: str, size: dict, repeats: int, redis: bool) -> list[dict[str, Any]]:
    count, rounds = size["reads"]
    value = {"note": "a memory of typical size", "tags": ["a", "b", "c"], "n": 0}
    session = f"bench-read-{uuid.uuid4().hex[:8]}"
    keys = [f"k{i}" for i in range(count)]
    plain = MemoryStore(using=alias, cache=None)
    plain.remember_many(session, {key: value for key in keys})
    driver = raw.Driver(settings.DATABASES[alias])
    rows = []
    progress(f"{alias}: recall, database")
    ours, base = [], []
    for _ in range(repeats):
        ours.append(timed_reads(lambda k: plain.recall(session, k), keys, rounds))
        base.append(timed_reads(lambda k: driver.read(session, k), keys, rounds))
    rows.append(read_row(alias, False, "recall, database", ours, {"raw driver": base}))
    if redis:
        progress(f"{alias}: recall, warm Redis")
        cached = MemoryStore(using=alias, cache="agentmemory")
        for key in keys:
            cached.recall(session, key)
            cached.recall(session, key)
        client = cached.cache.client
        client.mset({f"bench-raw:{key}": json.dumps(value) for key in keys})
        # The cache tier's read script called straight on redis-py, its entry decoded: the
        # protocol's own cost (entry, fence, server identity, Redis clock, lease in one round
        # trip), without the store's Python around it.
        sha = client.script_load(READ_SCRIPT)
        names = {key: cached.cache._names(session, key) for key in keys}
        fence = cached.cache.fence_key

        def script_read(key: str) -> Any:
            entry, lease = names[key]
            found = client.evalsha(sha, 3, entry, fence, lease, "bench", 5000, "11")[0]
            return json.loads(found.split(b"|", 2)[2])["v"]

        ours, base, script = [], [], []
        for _ in range(repeats):
            ours.append(timed_reads(lambda k: cached.recall(session, k), keys, rounds))
            base.append(
                timed_reads(lambda k: json.loads(client.get(f"bench-raw:{k}")), keys, rounds)
            )
            # The fence lives CACHE_FENCE_SECONDS (1 s); a recall renews it when it finds none,
            # the raw script does not: renewed here, as a reader that found none would.
            seconds, micros = client.time()
            cached.cache.renew_fence(seconds * 1000 + micros // 1000)
            script.append(timed_reads(script_read, keys, rounds))
        assert cached.cache.stats["hits"] > 0
        baselines = {"raw Redis GET": base, "the read script, raw": script}
        rows.append(read_row(alias, True, "recall, warm Redis", ours, baselines))
    connections.close_all()
    return rows


def read_row(
    alias: str, cached: bool, name: str, ours: list[dict], baselines: dict[str, list[dict]]
) -> dict[str, Any]:
    row = figure(
        alias,
        cached,
        name,
        [r["ops"] for r in ours],
        {k: [r["ops"] for r in v] for k, v in baselines.items()},
    )
    row["p50_us"] = statistics.median(r["p50_us"] for r in ours)
    row["p99_us"] = statistics.median(r["p99_us"] for r in ours)
    for label, runs in baselines.items():
        row["baselines"][label]["p50_us"] = statistics.median(r["p50_us"] for r in runs)
    return row


def langgraph_figures(alias: str, size: dict, repeats: int) -> list[dict[str, Any]]:
    """LangGraph's own store on the same server: put and get, one thread."""
    try:
        vendor = connections[alias].vendor
        if vendor == "sqlite":
            from langgraph.store.sqlite import SqliteStore as Peer

            conn = str(settings.OUT / "bench-langgraph.sqlite3")
        elif vendor == "postgresql":
            from langgraph.store.postgres import PostgresStore as Peer

            db = settings.DATABASES[alias]
            conn = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        else:
            return []
    except ImportError as exc:
        progress(f"LangGraph store for {alias}: skipped ({exc})")
        return []
    progress(f"{alias}: LangGraph {Peer.__name__} put/get")
    writes, (_, rounds) = size["writes"], size["reads"]
    value = {"note": "a memory of typical size", "tags": ["a", "b", "c"], "n": 0}
    store = MemoryStore(using=alias, cache=None)
    rows = []
    with Peer.from_conn_string(conn) as peer:
        peer.setup()
        from agentmemory.integrations.langgraph import AgentMemoryStore

        ours_lg = AgentMemoryStore(store)
        ours, theirs, our_reads, their_reads, lg_puts, lg_gets = [], [], [], [], [], []
        for _ in range(repeats):
            s = f"bench-lg-{uuid.uuid4().hex[:8]}"
            keys = [f"k{i % 20}" for i in range(writes)]
            # In this (main) thread, as a graph's caller would: ops/s of one put after another.
            ours.append(timed_reads(lambda k, s=s: store.remember(s, k, value), keys, 1)["ops"])
            theirs.append(
                timed_reads(lambda k, s=s: peer.put((s,), k, value) or True, keys, 1)["ops"]
            )
            lg_puts.append(
                timed_reads(lambda k, s=s: ours_lg.put((s,), k, value) or True, keys, 1)["ops"]
            )
            keys = keys[:20]
            our_reads.append(timed_reads(bind_read(store.recall, s), keys, rounds)["ops"])
            their_reads.append(timed_reads(bind_read(peer.get, (s,)), keys, rounds)["ops"])
            lg_gets.append(timed_reads(bind_read(ours_lg.get, (s,)), keys, rounds)["ops"])
    label = f"LangGraph {Peer.__name__} (no versions, no history)"
    rows.append(figure(alias, False, "remember vs put, 1 thread", ours, {label: theirs}))
    rows.append(figure(alias, False, "recall vs get, database", our_reads, {label: their_reads}))
    rows.append(figure(alias, False, "AgentMemoryStore.put vs put", lg_puts, {label: theirs}))
    rows.append(figure(alias, False, "AgentMemoryStore.get vs get", lg_gets, {label: their_reads}))
    return rows


def round_trips(alias: str) -> dict[str, Any]:
    """Statements per ``remember`` of an existing key, store and raw protocol. MySQL/MariaDB count
    exactly on the server (``Questions``: every statement, autocommit toggles and COMMIT
    included); elsewhere the statements the client sends are counted (``execute_wrapper``) and
    the transaction's BEGIN and COMMIT added by hand (psycopg sends BEGIN itself)."""
    store, driver = MemoryStore(using=alias, cache=None), raw.Driver(settings.DATABASES[alias])
    session, value, n = f"bench-rt-{uuid.uuid4().hex[:8]}", {"n": 1}, 20
    store.remember(session, "k", value)
    driver.writes(session, ["r"], value)
    connection = connections[alias]
    if connection.vendor == "mysql":

        def questions(cursor: Any) -> int:
            cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
            return int(cursor.fetchone()[1])

        with connection.cursor() as cursor:
            before = questions(cursor)
            for _ in range(n):
                store.remember(session, "k", value)
            ours = (questions(cursor) - before - 1) / n
        cursor = driver.connection().cursor()
        before = questions(cursor)
        driver.writes(session, ["r"] * n, value)
        theirs = (questions(cursor) - before - 1) / n
        how = "server-counted (Questions)"
    else:
        sent: list[tuple[str, bool]] = []  # (statement, run in autocommit)
        with connection.execute_wrapper(
            lambda execute, sql, *a: (
                sent.append((sql, connection.get_autocommit())),
                execute(sql, *a),
            )[1]
        ):
            for _ in range(n):
                store.remember(session, "k", value)
        # + COMMIT (a driver call, not a statement), + BEGIN where psycopg sends it itself; none
        # for a statement run in autocommit (PostgreSQL's one-statement write without Redis)
        transactions = sum(not autocommit for _, autocommit in sent) > 0
        ours = len(sent) / n + (
            0 if not transactions else 1 if connection.vendor == "sqlite" else 2
        )
        # the raw protocol: BEGIN (IMMEDIATE), 4 statements, COMMIT
        theirs = 6.0
        how = (
            "client-counted statements, in autocommit (no BEGIN, no COMMIT)"
            if not transactions
            else "client-counted statements + COMMIT"
            + ("" if connection.vendor == "sqlite" else " + BEGIN")
        )
    connections.close_all()
    return {
        "backend": alias,
        "figure": "statements per remember",
        "store": ours,
        "raw": theirs,
        "how": how,
    }


def memcheck_figure(alias: str, size: dict, redis: bool) -> dict[str, Any]:
    progress(f"{alias}: memcheck, {size['memcheck']} ops")
    previous = settings.AGENTMEMORY
    settings.AGENTMEMORY = {"DATABASE": alias, "CACHE": "agentmemory" if redis else None}
    from agentmemory.conf import get_config

    get_config.cache_clear()
    try:
        result = run_memcheck(alias, WorkloadConfig(ops=size["memcheck"]))
    finally:
        settings.AGENTMEMORY = previous
        get_config.cache_clear()
    return {
        "backend": alias,
        "redis": redis,
        "figure": f"memcheck default run ({size['memcheck']} ops)",
        "seconds": round(result.seconds, 2),
        "anomalies": len(result.anomalies),
    }


# ---------------------------------------------------------------- output


def machine() -> dict[str, Any]:
    servers = {}
    for alias in ("mariadb", "postgres"):
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT VERSION()")
                servers[alias] = cursor.fetchone()[0].split(",")[0][:60]
        except Exception:
            servers[alias] = "unavailable"
    import sqlite3

    servers["sqlite"] = sqlite3.sqlite_version
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "servers": servers,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Produced by `python bench/run.py` ({report['mode']} mode, {report['repeats']} repeats, "
        f"{report['seconds']:.0f} s) on {m['date']}: {m['platform']}, {m['cpus']} CPUs, "
        f"Python {m['python']}, Django {m['django']}; "
        + ", ".join(f"{k} {v}" for k, v in m["servers"].items())
        + ". All servers on the same machine as the benchmark (loopback).",
        "",
        "Ratios compare medians: store / baseline (1.00 = as fast as the baseline; higher is faster).",
        "The raw-driver baseline is the same protocol written directly on the driver; LangGraph's",
        "stores keep no versions and no history, so they do less work per put.",
        "",
        "| backend | Redis | figure | store ops/s (min-max) | baseline | baseline ops/s | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["figures"]:
        if "ops_per_s" not in row:
            continue
        ops = row["ops_per_s"]
        for label, base in row["baselines"].items():
            lines.append(
                f"| {row['backend']} | {'on' if row['redis'] else 'off'} | {row['figure']} | "
                f"{ops['median']:,.0f} ({ops['min']:,.0f}-{ops['max']:,.0f}) | {label} | "
                f"{base['median']:,.0f} | {base['ratio']:.2f} |"
            )
    lines += [
        "",
        "| backend | statements per remember: store | raw protocol | counted |",
        "|---|---|---|---|",
    ]
    for row in report["figures"]:
        if row["figure"] == "statements per remember":
            lines.append(
                f"| {row['backend']} | {row['store']:.1f} | {row['raw']:.1f} | {row['how']} |"
            )
    lines += ["", "| backend | Redis | memcheck | wall time | anomalies |", "|---|---|---|---|---|"]
    for row in report["figures"]:
        if "seconds" in row:
            lines.append(
                f"| {row['backend']} | {'on' if row['redis'] else 'off'} | {row['figure']} | "
                f"{row['seconds']} s | {row['anomalies']} |"
            )
    lines += ["", "![ratios](benchmarks.png)", ""]
    scale = ROOT / "docs" / "history-scale.md"  # bench/history_scale.py --write
    if scale.exists():
        lines += ["", "## Costs as history grows", "", scale.read_text()]
    search = ROOT / "docs" / "search-benchmarks.md"  # bench/search.py --write
    if search.exists():
        lines += ["", "## Semantic search at scale", "", search.read_text()]
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        (f"{r['backend']}{' +redis' if r['redis'] else ''}: {r['figure']}", label, base["ratio"])
        for r in report["figures"]
        if "ops_per_s" in r
        for label, base in r["baselines"].items()
    ]
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(rows) + 1.5))
    colours = ["#ef6c00" if "LangGraph" in label else "#1565c0" for _, label, _ in rows]
    ax.barh(range(len(rows)), [ratio for *_, ratio in rows], color=colours)
    ax.set_yticks(
        range(len(rows)),
        [f"{name} / {label.split(' (')[0]}" for name, label, _ in rows],
        fontsize=7,
    )
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(0.8, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("store / baseline, median ops/s (dashed: the 0.8x target against the raw driver)")
    ax.set_title(
        "agentmemory against the raw-driver limit and its own baselines (blue) "
        "and LangGraph's stores (orange)"
    )
    fig.subplots_adjust(left=0.4, right=0.97, top=0.97, bottom=0.06)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat, out/ only")
    parser.add_argument("--backends", default="sqlite,mariadb,postgres,postgres+prepared")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON/MD/PNG")
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="only redraw the table and chart of a report"
    )
    args = parser.parse_args()
    if args.render:
        report = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(markdown(report))
        chart(report, args.render.with_suffix(".png"))
        return
    mode = "quick" if args.quick else "full"
    size, repeats = SIZES[mode], args.repeats or (1 if args.quick else 3)
    out = args.out or (settings.OUT if args.quick else ROOT / "docs")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    backends = available_backends(args.backends.split(","))
    redis = redis_available()
    figures: list[dict[str, Any]] = []
    for alias in backends:
        figures += measure(alias, size, repeats, redis)
        figures += async_figures(alias, size, repeats)
        figures += langgraph_figures(alias, size, repeats)
        figures.append(round_trips(alias))
        figures.append(memcheck_figure(alias, size, redis))
    report = {
        "mode": mode,
        "repeats": repeats,
        "seconds": time.perf_counter() - started,
        "machine": machine(),
        "figures": figures,
    }
    (out / "benchmarks.json").write_text(json.dumps(report, indent=2))
    (out / "benchmarks.md").write_text(markdown(report))
    chart(report, out / "benchmarks.png")
    print(markdown(report))
    progress(f"done in {report['seconds']:.0f}s: {out}/benchmarks.{{json,md,png}}")


if __name__ == "__main__":
    main()
