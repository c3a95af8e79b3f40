"""What causal reads cost on a MariaDB Galera cluster, same run, interleaved (single thread):

    bash scripts/cluster.sh start
    DATABASE_URL=$(bash scripts/cluster.sh url) .venv/bin/python bench/cluster.py

Rows: ``recall`` on node 2 of keys written on node 1, with the store's causal reads (the default)
and without (``CAUSAL_READS=False``, which breaks read-after-write across nodes); ``remember`` on
node 1; and the same two on the single MariaDB server of ``services.sh`` as the baseline. Medians
of 3 interleaved rounds; prints a Markdown table (the README's).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault(
    "DATABASE_URL", "mysql://root@127.0.0.1:3311,127.0.0.1:3312,127.0.0.1:3313/agentmemory"
)

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from agentmemory import MemoryStore  # noqa: E402

KEYS, OPS, ROUNDS = 50, int(os.environ.get("OPS", 1500)), 3
SESSION = "bench-cluster"
SINGLE = "mysql://root@127.0.0.1:3306/agentmemory"


def rate(fn) -> float:
    started = time.perf_counter()
    for i in range(OPS):
        fn(i)
    return OPS / (time.perf_counter() - started)


def recall_rate(alias: str, causal: bool) -> float:
    with override_settings(AGENTMEMORY={**settings.AGENTMEMORY, "CAUSAL_READS": causal}):
        connections[alias].close()  # the setting applies to connections opened after it
        store = MemoryStore(using=alias, cache=None)
        try:
            return rate(lambda i: store.recall(SESSION, f"k{i % KEYS}"))
        finally:
            connections[alias].close()


def remember_rate(alias: str) -> float:
    store = MemoryStore(using=alias, cache=None)
    return rate(lambda i: store.remember(SESSION, f"w{i % KEYS}", {"i": i}))


def main() -> None:
    import dj_database_url

    settings.DATABASES["single"] = {
        **settings.DATABASES["default"],
        **dj_database_url.parse(SINGLE),
        "OPTIONS": settings.DATABASES["default"]["OPTIONS"],
    }
    for alias in ("default", "single"):
        call_command("migrate", database=alias, verbosity=0)
    writer = MemoryStore(using="default", cache=None)
    single = MemoryStore(using="single", cache=None)
    for i in range(KEYS):
        writer.remember(SESSION, f"k{i}", {"i": i})
        single.remember(SESSION, f"k{i}", {"i": i})
    rows: dict[str, list[float]] = {}
    for round_ in range(ROUNDS):
        print(f"round {round_ + 1}/{ROUNDS}", file=sys.stderr)
        for name, fn in (
            ("recall on node 2, causal reads (default)", lambda: recall_rate("node2", True)),
            ("recall on node 2, CAUSAL_READS=False", lambda: recall_rate("node2", False)),
            ("recall, single MariaDB server", lambda: recall_rate("single", True)),
            ("remember on node 1", lambda: remember_rate("default")),
            ("remember, single MariaDB server", lambda: remember_rate("single")),
        ):
            rows.setdefault(name, []).append(fn())
    writer.erase_session(SESSION)
    single.erase_session(SESSION)
    base = statistics.median(rows["recall on node 2, CAUSAL_READS=False"])
    print("| operation (1 thread) | per second, median of 3 | vs recall without causal reads |")
    print("|---|---|---|")
    for name, values in rows.items():
        median = statistics.median(values)
        ratio = f"{median / base:.2f}x" if name.startswith("recall") else ""
        print(f"| {name} | {median:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
