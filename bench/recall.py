"""Warm-Redis recall against database recall, same run, same keys (single thread):

    DATABASE_URL=mysql://root@127.0.0.1:3306/agentmemory REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/recall.py

The full harness with raw-driver baselines comes with bench/ proper; this is the figure the cache
tier's closing note quotes.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from agentmemory import MemoryStore  # noqa: E402

KEYS, ROUNDS = 100, int(os.environ.get("ROUNDS", 20))


def throughput(store: MemoryStore, session: str) -> tuple[float, float, float]:
    latencies = []
    for _ in range(ROUNDS):
        for i in range(KEYS):
            started = time.perf_counter()
            record = store.recall(session, f"k{i}")
            latencies.append(time.perf_counter() - started)
            assert record is not None and record.value["i"] == i
    latencies.sort()
    return (
        len(latencies) / sum(latencies),
        statistics.median(latencies) * 1e6,
        latencies[int(len(latencies) * 0.99)] * 1e6,
    )


def main() -> None:
    if "agentmemory" not in settings.CACHES:
        sys.exit("set REDIS_URL")
    call_command("migrate", verbosity=0)
    session = f"bench-recall-{uuid.uuid4().hex[:8]}"
    database_only = MemoryStore(cache=None)
    cached = MemoryStore(cache="agentmemory")
    cached.remember_many(session, {f"k{i}": {"i": i, "text": "x" * 200} for i in range(KEYS)})
    for i in range(KEYS):  # warm: fence renewed, entries present
        cached.recall(session, f"k{i}")
    db = throughput(database_only, session)
    warm = throughput(cached, session)
    print(f"{connection.display_name}, {KEYS} keys x {ROUNDS} rounds, one thread:")
    print(f"  database recall: {db[0]:8.0f}/s  p50 {db[1]:6.0f} us  p99 {db[2]:6.0f} us")
    print(
        f"  warm Redis:      {warm[0]:8.0f}/s  p50 {warm[1]:6.0f} us  p99 {warm[2]:6.0f} us  ({warm[0] / db[0]:.2f}x)"
    )
    print(f"  cache counters:  {dict(cached.cache.stats)}")
    database_only.erase_session(session)


if __name__ == "__main__":
    main()
