"""What a run left behind, read from the database and Redis (read-only): the input of the pure
checks in :mod:`agentmemory.consistency.checker`."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count

from ..cache import decode_entry, entry_version
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


@dataclass(frozen=True)
class CachedEntry:
    """What a Redis entry serves: a version, and its value or that the memory is absent."""

    version: int
    absent: bool
    value: Any = None


def cached_entries(
    cache: Any, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], CachedEntry | None]:
    """What each key's Redis entry serves (None: no entry, a tombstone, or an entry of another
    server process or database epoch, none of which is served); {} without a cache tier."""
    if cache is None:
        return {}
    client = cache.client
    by_group: dict[str, list[tuple[str, str]]] = {}
    for pair in sorted(keys):
        by_group.setdefault(cache.group(pair[0]).prefix, []).append(pair)
    found: dict[tuple[str, str], CachedEntry | None] = {}
    for pairs in by_group.values():  # one group: one slot, one server (on a cluster too)
        trusted = served_stamp(cache, cache.group(pairs[0][0]))
        raw = client.mget([cache.entry_key(s, k) for s, k in pairs])
        for pair, entry in zip(pairs, raw, strict=True):
            found[pair] = None if entry is None else _served(entry, trusted)
    return dict(sorted(found.items()))


def cached_versions(
    cache: Any, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], int | None]:
    """The version each key's Redis entry serves (see :func:`cached_entries`)."""
    return {
        pair: None if entry is None else entry.version
        for pair, entry in cached_entries(cache, keys).items()
    }


def served_stamp(cache: Any, group: Any = None) -> str:
    """The stamp of the entries a reader trusts now in ``group`` (default: the first; on one
    Redis the only one) (:meth:`MemoryCache.trusted_stamp`)."""
    return cache.trusted_stamp(group)


def served_entries(
    cache: Any, session_id: str | None = None, batch: int = 1000
) -> Iterator[tuple[tuple[str, str], CachedEntry]]:
    """Every served entry of the tier that holds a value (not an absence), with its (session,
    key) -- of one session, or all: by ``SCAN`` over the tier's names, read-only."""
    client = cache.client
    groups = [cache.group(session_id)] if session_id is not None else cache.groups
    for group in groups:  # a group's names are in one slot: one MGET per batch
        trusted = served_stamp(cache, group)
        names = client.scan_iter(match=f"{_glob_escape(group.prefix)}m:*", count=batch)
        yield from _served_batches(client, names, trusted, session_id, batch)


def _served_batches(
    client: Any, names: Iterator[Any], trusted: str, session_id: str | None, batch: int
) -> Iterator[tuple[tuple[str, str], CachedEntry]]:
    while chunk := list(itertools.islice(names, batch)):
        for raw in client.mget(chunk):
            if raw is None:
                continue
            entry = _served(raw, trusted)
            if entry is None or entry.absent:
                continue
            try:
                _, _, payload = decode_entry(raw)
            except ValueError:
                continue  # no ids to name it by (a key the audit reads by name reports it)
            if payload is not None and session_id in (None, payload["s"]):
                yield (payload["s"], payload["k"]), entry


def _served(raw: bytes | str, trusted: str) -> CachedEntry | None:
    version = entry_version(raw, trusted)
    if version is None:
        return None
    try:
        _, _, payload = decode_entry(raw)
    except ValueError:  # not JSON: whatever it holds is not the database's value
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        return CachedEntry(version, False, text.split("|", 2)[-1])
    assert payload is not None
    return CachedEntry(version, bool(payload.get("absent")), payload.get("v"))


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
