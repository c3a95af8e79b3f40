"""Costs as history grows: one key's history grown to 1,000,000 versions (and one session to
100,000 keys), bulk-loaded in the server between measurements; at each size, the median of 7
calls of each operation, in milliseconds:

    DATABASE_URL=mysql://root@127.0.0.1:3306/agentmemory .venv/bin/python bench/history_scale.py
    .venv/bin/python bench/history_scale.py --sizes 1000,10000      # SQLite, quick

remember and recall of the big key, history(limit=50) (the newest page) and a page half-way down
(before_version=N/2), the admin's memory page, recall_many(prefix=...) of 10 keys in a session of
N/10 keys, and prune_history(keep_last=1000) of another key of N versions. Each figure should stay
flat (or grow no faster than what it returns). Prints a Markdown table; writes
docs/history-scale-<vendor>.{json,png} with --write.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("DJANGO_DEBUG", "0")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from agentmemory import MemoryStore  # noqa: E402
from agentmemory.models import Memory, MemoryVersion  # noqa: E402

MEMORY, VERSION = Memory._meta.db_table, MemoryVersion._meta.db_table
SESSION, KEYS_SESSION, PRUNE_SESSION = "bench-history", "bench-history-keys", "bench-history-prune"
REPEAT = 7


def series(first: int, last: int) -> str:
    """The integers first..last as rows of column n, generated in the server."""
    if connection.vendor == "mysql":
        return f"SELECT seq AS n FROM seq_{first}_to_{last}"  # MariaDB's Sequence engine
    if connection.vendor == "postgresql":
        return f"SELECT generate_series({first}, {last}) AS n"
    return (
        f"WITH RECURSIVE s(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM s WHERE n < {last}) "
        "SELECT n FROM s"
    )


def text(expression: str) -> str:
    return (
        f"CAST({expression} AS CHAR)"
        if connection.vendor == "mysql"
        else f"({expression})::text"
        if connection.vendor == "postgresql"
        else f"CAST({expression} AS TEXT)"
    )


def concat(*parts: str) -> str:
    if connection.vendor == "mysql":
        return f"CONCAT({', '.join(parts)})"
    return "(" + " || ".join(parts) + ")"


def now() -> str:
    return {"mysql": "NOW(6)", "postgresql": "now()"}.get(
        connection.vendor, "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    )


def grow(store: MemoryStore, key: str, size: int, session_id: str = SESSION) -> int:
    """Versions current+1..size of ``key``, inserted in the server; the live row moves along."""
    record = store.recall(session_id, key) or store.remember(session_id, key, {"v": 1})
    current = record.version
    if size <= current:
        return current
    memory_id = Memory.objects.get(session_id=session_id, key=key).id
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {VERSION} (memory_id, version, op, value, created_at, expires_at, "
            f"request_id) SELECT {memory_id}, n, 'write', NULL, {now()}, NULL, "
            f"{concat(chr(39) + 'bulk-' + chr(39), text('n'))} FROM ({series(current + 1, size)}) AS numbers"
        )
    Memory.objects.filter(id=memory_id).update(version=size)
    return size


def grow_keys(count: int) -> None:
    """A session of ``count`` keys k-000001..., one version each."""
    present = Memory.objects.filter(session_id=KEYS_SESSION).count()
    if count <= present:
        return
    padded = (
        f"LPAD({text('n')}, 7, '0')"
        if connection.vendor != "sqlite"
        else "substr('0000000' || n, -7, 7)"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {MEMORY} (session_id, {connection.ops.quote_name('key')}, value, "
            f"version, history_from, state, created_at, updated_at, expires_at) "
            f"SELECT '{KEYS_SESSION}', {concat(chr(39) + 'k-' + chr(39), padded)}, NULL, 1, 1, "
            f"'live', {now()}, {now()}, NULL FROM ({series(present + 1, count)}) AS numbers"
        )


def median_ms(call, repeat: int = REPEAT) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def analyze() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {MEMORY}, {VERSION}")
        elif connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {MEMORY}")
            cursor.execute(f"ANALYZE {VERSION}")
        else:
            cursor.execute("ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--write", action="store_true", help="write docs/history-scale-*")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    settings.ALLOWED_HOSTS = ["testserver"]
    call_command("migrate", verbosity=0)
    store = MemoryStore(cache=None)
    for session_id in (SESSION, KEYS_SESSION, PRUNE_SESSION):
        store.erase_session(session_id)
    user, _ = User.objects.get_or_create(
        username="bench-history", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    rows = []
    for size in sizes:
        print(f"{connection.display_name}: growing to {size:,} versions ...", file=sys.stderr)
        grow(store, "big", size)
        grow_keys(max(10, size // 10))
        grow(store, f"prune-{size}", size, PRUNE_SESSION)
        analyze()
        big = Memory.objects.get(session_id=SESSION, key="big")
        page = f"/admin/agentmemory/memory/{big.pk}/change/"
        row = {
            "versions": size,
            "remember": median_ms(lambda: store.remember(SESSION, "big", {"v": "new"})),
            "recall": median_ms(lambda: store.recall(SESSION, "big")),
            "history(limit=50)": median_ms(lambda: store.history(SESSION, "big", limit=50)),
            "history page half-way": median_ms(
                lambda half=size // 2: store.history(SESSION, "big", limit=50, before_version=half)
            ),
            "admin memory page": median_ms(lambda url=page: client.get(url), repeat=5),
            "recall_many(prefix) of 10 keys": median_ms(
                lambda: store.recall_many(KEYS_SESSION, prefix="k-000001")
            ),
        }
        started = time.perf_counter()
        store.prune_history(keep_last=1000, session_id=PRUNE_SESSION)  # one key of N versions
        row["prune_history(keep_last=1000)"] = (time.perf_counter() - started) * 1000
        store.erase_session(PRUNE_SESSION)
        rows.append(row)
        print(json.dumps({k: round(v, 2) for k, v in row.items()}), file=sys.stderr)
    user.delete()
    columns = list(rows[0])[1:]
    print(f"\n{connection.display_name}, milliseconds (median of {REPEAT}):\n")
    print("| versions | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in rows:
        print(f"| {row['versions']:,} | " + " | ".join(f"{row[c]:.2f}" for c in columns) + " |")
    if args.write:
        write(rows, columns)


def write(rows: list[dict], columns: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = Path(__file__).resolve().parent.parent / "docs"
    vendor = connection.display_name.lower()  # sqlite, mariadb, postgresql, ...
    (docs / f"history-scale-{vendor}.json").write_text(json.dumps(rows, indent=2))
    figure, axis = plt.subplots(figsize=(8, 5))
    sizes = [row["versions"] for row in rows]
    for column in columns:
        axis.plot(sizes, [row[column] for row in rows], marker="o", label=column)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("versions of the key (keys in the session: a tenth)")
    axis.set_ylabel("milliseconds, median")
    axis.set_title(f"Costs as history grows ({connection.display_name})")
    axis.legend(fontsize=7)
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(docs / f"history-scale-{vendor}.png", dpi=110)
    summary(docs)


def summary(docs: Path) -> None:
    """docs/history-scale.md: the table of every backend measured so far (bench/run.py puts it
    into docs/benchmarks.md)."""
    parts = [
        "`bench/history_scale.py`: one key's history bulk-loaded to each size (a session of a "
        "tenth as many keys), then the median of 7 calls of each operation, milliseconds. "
        "Each figure should stay flat as the history grows, except prune_history, which "
        "removes N - 1,000 versions: it grows with what it removes, and nothing else.\n"
    ]
    for path in sorted(docs.glob("history-scale-*.json")):
        rows = json.loads(path.read_text())
        vendor = path.stem.removeprefix("history-scale-")
        columns = list(rows[0])[1:]
        parts += [
            f"\n### {vendor}\n",
            "| versions | " + " | ".join(columns) + " |",
            "|---|" + "---|" * len(columns),
            *(
                f"| {row['versions']:,} | " + " | ".join(f"{row[c]:.2f}" for c in columns) + " |"
                for row in rows
            ),
            f"\n![{vendor}](history-scale-{vendor}.png)",
        ]
    (docs / "history-scale.md").write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
