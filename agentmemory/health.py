"""Whether the memory can serve: the database reachable and migrated, the Redis tier reachable,
its fence, pending invalidations -- for ``manage.py agentmemory_status`` and the readiness view
(:func:`agentmemory.views.status`)."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from . import clock
from .conf import get_config

#: Exit codes (and the view's answer): ready; serving, but from the database alone or with
#: invalidations to replay; not serving.
OK, DEGRADED, DOWN = 0, 1, 2


def status(using: str) -> dict[str, Any]:
    """Each check (``check``, ``state``: ok / degraded / down / off, ``detail``), the overall
    ``state`` and its exit ``code``."""
    checks: list[dict[str, str]] = []

    def add(name: str, state: str, detail: str) -> None:
        checks.append({"check": name, "state": state, "detail": detail})

    database_up = _database(using, add)
    if database_up:
        _moves(using, add)
        _cache(using, add)
    states = {check["state"] for check in checks}
    code = DOWN if "down" in states else DEGRADED if "degraded" in states else OK
    return {
        "database": using,
        "state": {OK: "ready", DEGRADED: "degraded", DOWN: "down"}[code],
        "code": code,
        "checks": checks,
    }


def _database(using: str, add: Any) -> bool:
    connection = connections[using]
    try:
        connection.close()  # a fresh one: a connection left from before may be dead
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        add("database", "down", f"{connection.vendor} unreachable: {exc}")
        return False
    add("database", "ok", f"{connection.display_name} reachable")
    try:
        executor = MigrationExecutor(connection)
        unapplied = [
            migration.name
            for migration, _backwards in executor.migration_plan(
                executor.loader.graph.leaf_nodes("agentmemory")
            )
        ]
    except DatabaseError as exc:
        add("migrations", "down", f"could not be read: {exc}")
        return False
    if unapplied:
        add("migrations", "down", f"not applied: {', '.join(unapplied)} (manage.py migrate)")
        return False
    add("migrations", "ok", "every agentmemory migration applied")
    return True


def _moves(using: str, add: Any) -> None:
    """Sessions being moved to or from this database (a shard's: agentmemory.moves), if any:
    degraded when one has been for longer than a write waits for it (a mover that died)."""
    from .models import GateState, SessionGate
    from .moves import GATE_WAIT

    closed = SessionGate.objects.using(using).filter(
        state__in=[GateState.MOVING, GateState.INCOMING]
    )
    count = closed.count()
    if not count:
        return
    oldest = closed.order_by("changed_at").values_list("changed_at", flat=True).first()
    assert oldest is not None
    age = (clock.now() - oldest).total_seconds()
    if age > GATE_WAIT:
        add(
            "moves",
            "degraded",
            f"{count} session(s) moving for up to {age:.0f} s, longer than a write waits: a "
            "mover that died -- `manage.py move_sessions --resume` finishes its moves",
        )
    else:
        add("moves", "ok", f"{count} session(s) being moved between shards")


def pending(using: str) -> tuple[int, float]:
    """The invalidations writers recorded for the Redis tier to replay: how many keys (a write
    that could reach Redis neither before nor after its commit records its key twice), and the
    oldest one's age in seconds (0 when none)."""
    from .models import PendingInvalidation

    rows = PendingInvalidation.objects.using(using)
    count = rows.values("session_id", "key").distinct().count()
    oldest = rows.order_by("id").values_list("created_at", flat=True).first() if count else None
    return count, (clock.now() - oldest).total_seconds() if oldest is not None else 0.0


def _cache(using: str, add: Any) -> None:
    alias = get_config()["CACHE"]
    count, age = pending(using)
    if alias is None:
        add("cache tier", "off", "AGENTMEMORY['CACHE'] is None: recalls read the database")
        return
    from .cache import MemoryCache

    cache = MemoryCache(alias, using)
    try:
        client = cache.client
        client.ping()
        if cache.clustered:
            fences = [client.pttl(group.fence) for group in cache.groups]
            server = f"{len(client.get_primaries())} primaries"
            kind = "Redis Cluster cache"
        else:
            fences = [client.pttl(cache.fence_key)]
            server = f"server {str(client.info('server').get('run_id', '?'))[:12]}"
            kind = "Redis cache"
    except Exception as exc:  # the client's own errors: the tier is down, the store serves on
        add("cache tier", "degraded", f"Redis cache {alias!r} unreachable: {exc}")
    else:
        add("cache tier", "ok", f"{kind} {alias!r} reachable ({server})")
        up = [left for left in fences if left is not None and left > 0]
        if len(fences) > 1:  # a cluster: a fence per group of sessions
            add(
                "cache fence",
                "ok",
                f"up in {len(up)} of {len(fences)} groups of sessions (a group's is renewed by "
                "its next recall: nothing to do)",
            )
        elif up:
            add("cache fence", "ok", f"up ({up[0]} ms left): Redis is trusted")
        else:
            add(
                "cache fence",
                "ok",
                "down: the next recall checks the tier and renews it (nothing to do)",
            )
    if count:
        add(
            "pending invalidations",
            "degraded",
            f"{count} key(s) a writer could not update in Redis, the oldest {age:.0f} s ago: "
            "the tier is distrusted until a reader reaches Redis and replays them",
        )
    else:
        add("pending invalidations", "ok", "none")
