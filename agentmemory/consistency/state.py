"""What a run left behind, read from the database and Redis (read-only): the input of the pure
checks in :mod:`agentmemory.consistency.checker`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count

from ..cache import entry_version, stamp
from ..models import Memory, MemoryVersion


@dataclass
class StoredVersion:
    version: int
    op: str
    value: Any
    created_at: float
    expires_at: float | None


@dataclass
class StoredKey:
    rows: int = 0
    live_version: int = 0
    live_state: str = ""
    live_expires_at: float | None = None
    versions: list[StoredVersion] = field(default_factory=list)
    # The lowest version kept (versions below it were pruned by the retention policy).
    kept_from: int = 1


def load_state(using: str, session_ids: Iterable[str]) -> dict[tuple[str, str], StoredKey]:
    """What the database holds for these sessions (read-only)."""
    sessions = list(session_ids)
    state: dict[tuple[str, str], StoredKey] = defaultdict(StoredKey)
    for session_id, key, version, live_state, kept_from, expires in (
        Memory.objects.using(using)
        .filter(session_id__in=sessions)
        .values_list("session_id", "key", "version", "state", "history_from", "expires_at")
    ):
        stored = state[(session_id, key)]
        stored.rows += 1
        stored.live_version, stored.live_state = version, live_state
        stored.live_expires_at = expires.timestamp() if expires else None
        stored.kept_from = kept_from
    versions = (
        MemoryVersion.objects.using(using)
        .filter(memory__session_id__in=sessions)
        .order_by("memory_id", "version")
        .values_list(
            "memory__session_id",
            "memory__key",
            "version",
            "op",
            "value",
            "created_at",
            "expires_at",
        )
    )
    for session_id, key, version, op, value, created, expires in versions:
        state[(session_id, key)].versions.append(
            StoredVersion(
                version, op, value, created.timestamp(), expires.timestamp() if expires else None
            )
        )
    return dict(state)


def duplicate_keys(using: str, session_ids: Iterable[str]) -> dict[tuple[str, str], int]:
    """Each (session_id, key) that has more than one row, with its count."""
    dupes = (
        Memory.objects.using(using)
        .filter(session_id__in=list(session_ids))
        .values("session_id", "key")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    return {(d["session_id"], d["key"]): d["n"] for d in dupes}


def cached_versions(
    cache: Any, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], int | None]:
    """The version each key's Redis entry serves (None: no entry, a tombstone, or an entry of
    another server process, none of which is served); {} without a cache tier."""
    if cache is None:
        return {}
    keys = sorted(keys)
    client = cache.client
    raw = client.mget([cache.entry_key(s, k) for s, k in keys]) if keys else []
    fenced = client.get(cache.fence_key)
    trusted = stamp(
        client.info("server")["run_id"],
        fenced.decode() if fenced is not None else cache.database_epoch(),
    )
    return {
        pair: None if entry is None else entry_version(entry, trusted)
        for pair, entry in zip(keys, raw, strict=True)
    }
