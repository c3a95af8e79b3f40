"""When the Redis tier pays: recall throughput and latency with the tier on and off, with the
database under load (N reader threads, M writer threads) and behind a network round trip.

    .venv/bin/python bench/tier.py            # docs/tier-benchmarks.{json,md,png}
    .venv/bin/python bench/tier.py --quick    # out/, seconds

The database (MariaDB, or ``--backend postgres``) is reached through a delay proxy of this
benchmark's own, in a process of its own: every chunk of bytes is forwarded after a fixed
one-way delay, in both directions, in order -- the added round trip is twice that (0 to 2 ms:
one host, one rack, another zone). Redis stays on loopback, as a cache beside the application
is. (``tc netem`` would be the usual tool; this machine's kernel has no netem, so the delay is
added in user space, which costs the proxy's CPU on the same two cores: the figures at 0 ms
include that cost too, the proxy forwarding without delay.)

Readers recall keys drawn from a hot set; writers ``remember`` keys of the same set (each
write, with the tier on, updates Redis after its commit: the readers' next hit is the new
version). Each configuration runs for ``--seconds``; throughput is the readers' recalls per
second, p50/p99 their latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"


# ---------------------------------------------------------------- the delay proxy


def _proxy(listen: socket.socket, upstream: tuple[str, int], delay: float) -> None:
    """Forward every connection accepted on ``listen`` to ``upstream``, each chunk ``delay``
    seconds later, in order (a fixed delay keeps the order)."""

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(65536):
                if delay:
                    loop.call_later(delay, writer.write, data)
                else:
                    writer.write(data)
        except ConnectionError:
            pass
        finally:
            loop.call_later(delay, writer.close)

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        sock = client_w.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server_r, server_w = await asyncio.open_connection(*upstream)
        server_w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w))

    async def main() -> None:
        server = await asyncio.start_server(serve, sock=listen)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class DelayProxy:
    """A :func:`_proxy` process on a free loopback port."""

    def __init__(self, upstream: tuple[str, int], delay_ms: float) -> None:
        self.listen = socket.socket()
        self.listen.bind(("127.0.0.1", 0))
        self.listen.listen(128)
        self.port = self.listen.getsockname()[1]
        self.process = multiprocessing.get_context("fork").Process(
            target=_proxy, args=(self.listen, upstream, delay_ms / 1000), daemon=True
        )

    def __enter__(self) -> DelayProxy:
        self.process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.join()
        self.listen.close()


# ---------------------------------------------------------------- the workload


def run_config(
    alias: str, cached: bool, readers: int, writers: int, seconds: float, keys: list[str]
) -> dict[str, Any]:
    from django.db import connections

    from agentmemory import MemoryStore

    store = MemoryStore(using=alias, cache="agentmemory" if cached else None)
    session = f"bench-tier-{uuid.uuid4().hex[:8]}"
    store.remember_many(session, {key: {"key": key, "n": 0} for key in keys})
    if cached:
        for key in keys:  # warm: the fence renewed, every entry present
            store.recall(session, key)
        store.cache.stats.clear()
    stop = threading.Event()
    start = threading.Barrier(readers + writers + 1)
    latencies: list[list[float]] = [[] for _ in range(readers)]
    writes = [0] * writers

    def reader(index: int) -> None:
        rng = random.Random(index)
        mine = latencies[index]
        start.wait()
        try:
            while not stop.is_set():
                key = rng.choice(keys)
                began = time.perf_counter()
                found = store.recall(session, key)
                mine.append(time.perf_counter() - began)
                assert found is not None and found.value["key"] == key
        finally:
            connections.close_all()

    def writer(index: int) -> None:
        rng = random.Random(1000 + index)
        start.wait()
        try:
            while not stop.is_set():
                key = rng.choice(keys)
                store.remember(session, key, {"key": key, "n": writes[index]})
                writes[index] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    threads += [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)  # the measured interval itself (a benchmark's clock, not a wait)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    every = sorted(x for mine in latencies for x in mine)
    hits = store.cache.stats["hits"] if store.cache is not None else 0
    store.erase_session(session)
    connections.close_all()
    return {
        "recalls_per_s": len(every) / elapsed,
        "writes_per_s": sum(writes) / elapsed,
        "p50_us": every[len(every) // 2] * 1e6,
        "p99_us": every[int(len(every) * 0.99)] * 1e6,
        "hit_share": hits / len(every) if cached else 0.0,
    }


# ---------------------------------------------------------------- report


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# When the Redis tier pays",
        "",
        f"Produced by `python bench/tier.py` on {report['when']}: {report['backend']} behind a "
        f"delay proxy, Redis on loopback; {report['readers']} reader and {report['writers']} "
        f"writer threads, {report['keys']} hot keys, {report['seconds']} s per configuration, "
        f"{report['repeats']} repeats (medians). {report['machine']}.",
        "",
        "| added round trip | tier | recalls/s | p50 µs | p99 µs | writes/s | hits | "
        "recalls/s on / off |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        for cached in (False, True):
            r = row["on" if cached else "off"]
            ratio = row["on"]["recalls_per_s"] / row["off"]["recalls_per_s"]
            lines.append(
                f"| {row['rtt_ms']:.1f} ms | {'on' if cached else 'off'} | "
                f"{r['recalls_per_s']:,.0f} | {r['p50_us']:,.0f} | {r['p99_us']:,.0f} | "
                f"{r['writes_per_s']:,.0f} | {r['hit_share']:.0%} | "
                f"{f'{ratio:.2f}' if cached else ''} |"
            )
    lines += ["", "![recalls/s and latency against the added round trip](tier-benchmarks.png)"]
    return "\n".join(lines) + "\n"


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rtts = [row["rtt_ms"] for row in report["rows"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for cached, colour in ((False, "#6d4c41"), (True, "#c62828")):
        side = "on" if cached else "off"
        label = "Redis tier on" if cached else "database only"
        left.plot(
            rtts,
            [r[side]["recalls_per_s"] for r in report["rows"]],
            "o-",
            color=colour,
            label=label,
        )
        right.plot(
            rtts,
            [r[side]["p50_us"] for r in report["rows"]],
            "o-",
            color=colour,
            label=f"{label}, p50",
        )
        right.plot(
            rtts,
            [r[side]["p99_us"] for r in report["rows"]],
            "o--",
            color=colour,
            label=f"{label}, p99",
        )
    left.set_xlabel("round trip added to the database (ms)")
    left.set_ylabel("recalls/s (all readers)")
    left.set_ylim(bottom=0)
    left.legend()
    right.set_xlabel("round trip added to the database (ms)")
    right.set_ylabel("recall latency (µs)")
    right.set_yscale("log")
    right.legend(fontsize=8)
    fig.suptitle(
        f"{report['backend']}: {report['readers']} readers and {report['writers']} writers, "
        "Redis on loopback"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs, out/ only")
    parser.add_argument("--backend", default="mariadb", choices=["mariadb", "postgres"])
    parser.add_argument("--rtts", default="0,0.5,1,2", help="added round trips, ms")
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 4.0)
    repeats = args.repeats or (1 if args.quick else 3)
    out = args.out or (ROOT / "out" if args.quick else ROOT / "docs")
    out.mkdir(parents=True, exist_ok=True)

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from bench import raw
    from bench.run import machine

    base = settings.DATABASES[args.backend]
    raw.create_database(base)
    call_command("migrate", database=args.backend, verbosity=0)
    keys = [f"k{i}" for i in range(args.keys)]
    rows = []
    for rtt in [float(x) for x in args.rtts.split(",")]:
        upstream = (base["HOST"] or "127.0.0.1", int(base["PORT"] or 3306))
        with DelayProxy(upstream, rtt / 2) as proxy:
            alias = f"{args.backend}-delayed-{rtt}"  # a new alias: no connection of the last
            settings.DATABASES[alias] = {**base, "HOST": "127.0.0.1", "PORT": proxy.port}
            from django.db import connections

            connections.settings = connections.configure_settings(settings.DATABASES)
            runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
            for repeat in range(repeats):
                for side in ("off", "on"):  # interleaved: drift hits both alike
                    print(
                        f"tier: +{rtt} ms, tier {side}, run {repeat + 1}",
                        file=sys.stderr,
                        flush=True,
                    )
                    runs[side].append(
                        run_config(alias, side == "on", args.readers, args.writers, seconds, keys)
                    )
            connections[alias].close()
            del connections[alias]
            del settings.DATABASES[alias]
        rows.append(
            {
                "rtt_ms": rtt,
                **{
                    side: {k: statistics.median(r[k] for r in got) for k in got[0]}
                    for side, got in runs.items()
                },
            }
        )
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "backend": args.backend,
        "readers": args.readers,
        "writers": args.writers,
        "keys": args.keys,
        "seconds": seconds,
        "repeats": repeats,
        "machine": f"{machine()['cpus']} CPUs, {machine()['platform']}",
        "rows": rows,
    }
    (out / "tier-benchmarks.json").write_text(json.dumps(report, indent=2))
    (out / "tier-benchmarks.md").write_text(markdown(report))
    chart(report, out / "tier-benchmarks.png")
    print(markdown(report))


if __name__ == "__main__":
    main()
