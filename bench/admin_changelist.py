"""Admin page loads on a big table: N memories (default 1,000,000, each with one history version)
are bulk-loaded into the configured database, then the changelist and a change page are loaded
through Django's test client, logged in as a superuser -- agentmemory's MemoryAdmin beside a
plain ``ModelAdmin`` of the same model (full ``COUNT(*)``, whole values), same run, same rows.

    DATABASE_URL=mysql://root@127.0.0.1:3306/agentmemory .venv/bin/python bench/admin_changelist.py
    ... --rows 100000 --repeat 5 --keep

Prints a Markdown table (median / max milliseconds and queries per page); removes its rows unless
``--keep`` (a later run reuses kept rows).
"""

from __future__ import annotations

import argparse
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
from django.contrib import admin  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import clear_url_caches, path  # noqa: E402

from agentmemory.models import Memory  # noqa: E402

PREFIX = "bench-admin-"
MEMORY, VERSION = Memory._meta.db_table, "agentmemory_memoryversion"


def fill(rows: int) -> None:
    """Bulk-load in the server: one INSERT ... SELECT per table, sessions of 10 keys."""
    vendor = connection.vendor
    with connection.cursor() as cursor:
        if vendor == "mysql":
            series = f"SELECT seq AS n FROM seq_1_to_{rows}"  # MariaDB's Sequence engine
            concat = lambda *parts: f"CONCAT({', '.join(parts)})"
            json_of = "JSON_OBJECT('note', CONCAT('memory ', n), 'n', n)"
            now = "NOW(6)"
        elif vendor == "postgresql":
            series = f"SELECT generate_series(1, {rows}) AS n"
            concat = lambda *parts: "(" + " || ".join(f"({p})::text" for p in parts) + ")"
            json_of = "jsonb_build_object('note', 'memory ' || n, 'n', n)"
            now = "now()"
        else:
            series = (
                f"WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {rows}) "
                "SELECT n FROM s"
            )
            concat = lambda *parts: "(" + " || ".join(f"({p})" for p in parts) + ")"
            json_of = "json_object('note', 'memory ' || n, 'n', n)"
            now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
        session = concat(f"'{PREFIX}'", "n / 10" if vendor != "mysql" else "n DIV 10")
        key = concat("'key-'", "n % 10")
        cursor.execute(
            f"INSERT INTO {MEMORY} (session_id, {connection.ops.quote_name('key')}, value, "
            f"version, state, created_at, updated_at, expires_at) "
            f"SELECT {session}, {key}, {json_of}, 1, 'live', {now}, {now}, NULL "
            f"FROM ({series}) AS numbers"
        )
        request_id = concat("'r'", "id")
        cursor.execute(
            f"INSERT INTO {VERSION} (memory_id, version, op, value, created_at, expires_at, "
            f"request_id) SELECT id, 1, 'write', value, created_at, NULL, {request_id} "
            f"FROM {MEMORY} WHERE session_id LIKE '{PREFIX}%'"
        )
        if vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {MEMORY}, {VERSION}")
        elif vendor == "postgresql":
            cursor.execute(f"ANALYZE {MEMORY}")
            cursor.execute(f"ANALYZE {VERSION}")


def remove() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {VERSION} WHERE memory_id IN "
            f"(SELECT id FROM {MEMORY} WHERE session_id LIKE '{PREFIX}%')"
        )
        cursor.execute(f"DELETE FROM {MEMORY} WHERE session_id LIKE '{PREFIX}%'")


class PlainMemoryAdmin(admin.ModelAdmin):
    """What a first admin for the model looks like: every column, Django's paginator."""

    list_display = ["session_id", "key", "version", "value", "state", "updated_at", "expires_at"]
    list_filter = ["state", "updated_at"]
    search_fields = ["session_id", "key"]


def timed(client: Client, url: str, repeat: int) -> tuple[float, float, int]:
    times, queries = [], 0
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        queries = len(captured)
    return statistics.median(times), max(times), queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    settings.ALLOWED_HOSTS = ["testserver"]

    present = Memory.objects.filter(session_id__startswith=PREFIX).count()
    if present != args.rows:
        if present:
            remove()
        print(f"loading {args.rows:,} memories into {connection.display_name} ...", file=sys.stderr)
        started = time.perf_counter()
        fill(args.rows)
        print(f"  loaded in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    total = Memory.objects.count()

    plain_site = admin.AdminSite(name="plain")
    plain_site.register(Memory, PlainMemoryAdmin)
    from project import urls

    urls.urlpatterns.append(path("plain-admin/", plain_site.urls))
    clear_url_caches()

    user, _ = User.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    one = Memory.objects.filter(session_id=f"{PREFIX}{args.rows // 20}").first()
    pages = [
        (
            "changelist, first page",
            "/admin/agentmemory/memory/",
            "/plain-admin/agentmemory/memory/",
        ),
        (
            "changelist, page 100",
            "/admin/agentmemory/memory/?p=100",
            "/plain-admin/agentmemory/memory/?p=100",
        ),
        (
            "filter: live",
            "/admin/agentmemory/memory/?status=live",
            "/plain-admin/agentmemory/memory/?state__exact=live",
        ),
        (
            "search: one session",
            f"/admin/agentmemory/memory/?q={one.session_id}",
            f"/plain-admin/agentmemory/memory/?q={one.session_id}",
        ),
        (
            "change page",
            f"/admin/agentmemory/memory/{one.pk}/change/",
            f"/plain-admin/agentmemory/memory/{one.pk}/change/",
        ),
    ]
    print(f"\n{total:,} memories on {connection.display_name}; median of {args.repeat} loads\n")
    print("| page | MemoryAdmin ms (max) | queries | plain ModelAdmin ms (max) | queries |")
    print("|---|---|---|---|---|")
    for name, ours, plain in pages:
        o_med, o_max, o_q = timed(client, ours, args.repeat)
        p_med, p_max, p_q = timed(client, plain, args.repeat)
        print(f"| {name} | {o_med:.0f} ({o_max:.0f}) | {o_q} | {p_med:.0f} ({p_max:.0f}) | {p_q} |")
    user.delete()
    if not args.keep:
        remove()


if __name__ == "__main__":
    main()
