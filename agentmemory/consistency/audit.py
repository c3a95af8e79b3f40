"""Read-only audit of the data already stored: the invariants any history must satisfy.

It never writes -- not to the database, not to Redis (entries are read with a plain ``MGET``, no
fill lease is taken) -- so it can run against production."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.db.models import Count

from .. import clock
from ..models import Memory, MemoryState, PendingInvalidation
from .checker import Anomaly, audit_key, cache_divergence, cache_orphans, duplicate_rows
from .state import StoredKey, cached_entries, duplicate_keys, load_state, served_entries

BATCH = 500
#: Live rows whose TTL passed longer ago than this are reported: ``purge_expired`` is not running.
DEFAULT_GRACE_SECONDS = 3600
#: A cache entry that differs from the database is read again after this long before it is
#: reported: a write committing between the two reads is not a divergence.
RECHECK_SECONDS = 0.2


def audit(
    using: str,
    session_id: str | None = None,
    *,
    cache: Any = None,
    grace_seconds: float | None = DEFAULT_GRACE_SECONDS,
) -> tuple[int, list[Anomaly]]:
    """Check every memory (or one session's): contiguous versions, live row == newest version,
    one row per key, no live row expired longer than ``grace_seconds`` ago (None: not checked),
    and -- with ``cache`` (a :class:`~agentmemory.cache.MemoryCache`) -- no entry Redis serves at
    another version than the database's, with another value than that version's, or for a
    memory the database does not have. Returns (memories audited, anomalies)."""
    rows = Memory.objects.using(using)
    if session_id is not None:
        rows = rows.filter(session_id=session_id)
    sessions = list(
        rows.values_list("session_id", flat=True).annotate(n=Count("id")).order_by("session_id")
    )
    anomalies: list[Anomaly] = []
    audited = 0
    for start in range(0, len(sessions), BATCH):
        chunk = sessions[start : start + BATCH]
        anomalies += duplicate_rows(duplicate_keys(using, chunk))
        state = load_state(using, chunk)
        for (sid, key), stored in sorted(state.items()):
            audited += 1
            anomalies += audit_key(sid, key, stored)
        if cache is not None:
            anomalies += _cache_audit(using, cache, chunk, state)
    if cache is not None:
        anomalies += _cache_orphans(using, cache, session_id)
    if grace_seconds is not None:
        anomalies += _expired_live_rows(rows, grace_seconds)
    return audited, anomalies


def _expired_live_rows(rows: Any, grace_seconds: float) -> list[Anomaly]:
    cutoff = clock.now() - timedelta(seconds=grace_seconds)
    overdue = rows.filter(state=MemoryState.LIVE, expires_at__lt=cutoff).order_by("expires_at")
    return [
        Anomaly(
            "expired-live-row",
            sid,
            key,
            f"v{version} expired at {expires.isoformat()} and is still a live row "
            f"(more than {grace_seconds:g}s ago): is purge_expired running?",
        )
        for sid, key, version, expires in overdue.values_list(
            "session_id", "key", "version", "expires_at"
        )[:1000]
    ]


def _cache_audit(
    using: str, cache: Any, sessions: list[str], state: dict[tuple[str, str], StoredKey]
) -> list[Anomaly]:
    """Entries at another version than the database's, confirmed by a second look (database and
    Redis read again) so that a write landing between the two reads is not reported. Keys with a
    pending invalidation are known to be behind and are never served: they are skipped."""
    suspects = cache_divergence(cached_entries(cache, state), state)
    if not suspects:
        return []
    time.sleep(RECHECK_SECONDS)
    pending = set(
        PendingInvalidation.objects.using(using)
        .filter(session_id__in=sessions)
        .values_list("session_id", "key")
    )
    again = load_state(using, sorted({a.session_id for a in suspects}))
    suspected = {(a.session_id, a.key) for a in suspects}
    recheck = {pair: stored for pair, stored in again.items() if pair in suspected}
    confirmed = cache_divergence(cached_entries(cache, recheck), recheck)
    return [a for a in confirmed if (a.session_id, a.key) not in pending]


def _cache_orphans(using: str, cache: Any, session_id: str | None) -> list[Anomaly]:
    """Entries Redis serves with a value for a memory the database has no row of (found by a
    ``SCAN`` of the tier's names), confirmed by a second look as above."""

    def orphans() -> dict[tuple[str, str], Any]:
        found = dict(served_entries(cache, session_id))
        rows = Memory.objects.using(using)
        for start in range(0, len(found), BATCH):
            pairs = list(found)[start : start + BATCH]
            for sid in {s for s, _ in pairs}:
                keys = [k for s, k in pairs if s == sid]
                for key in rows.filter(session_id=sid, key__in=keys).values_list("key", flat=True):
                    found.pop((sid, key), None)
        return found

    if not orphans():
        return []
    time.sleep(RECHECK_SECONDS)
    pending = set(PendingInvalidation.objects.using(using).values_list("session_id", "key"))
    return [a for a in cache_orphans(orphans()) if (a.session_id, a.key) not in pending]
