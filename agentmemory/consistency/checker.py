"""Checks a recorded history against what the database holds, key by key.

Versions give the order of writes, so no search over interleavings is needed: each key is checked
in one pass over its history, near-linear in the number of operations.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from ..records import VALUE_OPS
from . import semantic
from .history import (
    ADK_KINDS,
    CHECKPOINT_KINDS,
    DATABASE_LOST,
    LOG_KINDS,
    History,
    Operation,
    allowed_without_answer,
    token_of,
)
from .state import CachedEntry, StoredKey, StoredVersion

#: Every check, in report order, with what it proves.
CHECKS = {
    "lost-update": "every acknowledged write is exactly one version holding its value",
    "version-gap": "versions are 1, 2, 3, ... (from the retention watermark) with no gap or duplicate",
    "live-row": "the live row's version and expiry equal the newest history version's",
    "duplicate-row": "one row per (session_id, key)",
    "phantom-write": "every stored version was written by an acknowledged or indeterminate call",
    "cas-violation": "a compare-and-set write landed right after the version it expected",
    "spurious-conflict": "a compare-and-set conflicts only when the version is not the one expected",
    "all-or-nothing": "a remember_many is stored on all of its keys or on none of them",
    "list-order": "every list read is a prefix of the final list, holding each acknowledged append once",
    "idempotent-retry": "a write sent again with its idempotency key answers as the first call did",
    "aborted-read": "no read returns the value of a write that failed",
    "garbage-read": "every read returns a value some write stored as that version",
    "stale-read": "no read returns older than a version acknowledged before the read began",
    "non-monotonic-read": "a client's reads of a key never go back to an older version",
    "cross-session-read": "no read returns another session's or key's value",
    "expired-read": "no read returns a version whose stored expiry had passed when the read began",
    "history-page": "a history read page after page (history(limit=, before_version=)) holds "
    "each version once, newest first with no gap, each as the history holds it",
    "past-version-read": "a read of a past version (recall(version=N)) returns version N with "
    "the value it was written with, never one whose expiry had passed when the read began",
    "ttl-stored": "every version's expiry is its write's time plus the TTL asked for (none if none)",
    "expiry-mismatch": "every read and write reports the expiry its version was stored with",
    "prefix-read": "recall_many(prefix=) returns only keys that start with the prefix, exactly",
    "fractured-read": "a recall_many that sees one key of a remember_many sees all of its keys",
    "search-score": "every search result's score is computed from the value of the version returned",
    "read-own-write": "inside the caller's transaction, a read returns the write just made",
    "erased-read": "after erase_session, no read returns a memory of the erased session",
    "bad-input": "every call with bad input raises InvalidMemory and changes nothing",
    "caller-error": "no error other than VersionConflict/MemoryUnavailable reaches a caller",
    "log-append": "every acknowledged append is stored once, at the numbers it was given, in its "
    "order; a failed one not at all; every stored item was appended by a call that did not fail",
    "log-sequence": "a log's items and events are numbered 1, 2, 3, ... with no gap or reuse, "
    "and its head counts them",
    "log-pop": "no log item is popped twice, and a pop removes exactly the item it returned",
    "log-read": "a log read returns items in order, as stored, none removed before it began, every "
    "one acknowledged before it began and not removed before it ended, never going back",
    "checkpoint-fork": "no checkpoint has two children made by steps that each loaded it as the "
    "latest (a silent fork); a fork asked for is a child of the checkpoint it asked for",
    "checkpoint-write": "every acknowledged checkpoint and pending write is stored once, as given; "
    "a failed one not at all; every stored one was made by a call that did not fail",
    "checkpoint-read": "a read of a thread's latest checkpoint returns a stored one with its own "
    "value, none older than one acknowledged before the read began, with its acknowledged writes",
    "checkpoint-list": "a listing of checkpoints is newest first and leaves out none acknowledged "
    "before it began that is newer than the oldest it shows",
    "checkpoint-delete": "after delete_thread, the thread holds no checkpoint",
    "adk-event": "every acknowledged ADK append_event is stored once, a refused one not at all, "
    "each stored event was appended by a call, in the order the appends were acknowledged",
    "adk-state": "an ADK session's state is the fold of its stored events: each event's change of "
    "a key is one version of it, in the events' order, no increment lost, no temp: key stored",
    "adk-read": "get_session returns a prefix of the stored events holding every one acknowledged "
    "before it began, and a state that is the fold of a prefix of them",
    "cache-divergence": "at quiescence, every Redis entry holds the database's version",
    "orm-bulk": "after an ORM write of memories commits (a queryset delete() or update() of a "
    "served column), no read returns what it deleted or changed",
    "writer-crash": "after a writer crashed between its COMMIT and its Redis update, while a "
    "reader filled the version before it, a read returns the committed version",
    "cache-evict": "after a write's entry was evicted before a slow reader's fill of the version "
    "before it, a read returns the written version",
    "fence-race": "after a writer that could not reach Redis recorded its key as pending and "
    "waited out the fence, while a fence renewal stalled, a read returns the written version",
    "refusal": "with --strict: no call is refused (MemoryUnavailable, 'database is locked') "
    "unless an injected fault explains it",
    "lost-by-database": "no acknowledged write is lost by the database itself (a failover to an "
    "asynchronous standby): such losses are reported apart, naming the failover, and the other "
    "checks judge the history the database kept",
}


#: The checks that report the database's own failures, not the store's (the self-test counts
#: them neither against the real store nor as a planted bug caught).
DATABASE_OWN = frozenset({"lost-by-database"})


@dataclass
class Anomaly:
    check: str
    session_id: str
    key: str
    message: str
    operations: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cache_divergence(
    cached: dict[tuple[str, str], CachedEntry | None],
    state: dict[tuple[str, str], StoredKey],
    now: float | None = None,
) -> list[Anomaly]:
    """At quiescence (``now``, POSIX seconds: the time of the look), an entry Redis serves
    (``cached``: None where it serves none) must be the database's current version, holding that
    version's value -- or absent, if the version is no value or its TTL has passed; a missing
    entry is only a future miss. A key the database has no row of is :func:`cache_orphans`'."""
    now = time.time() if now is None else now
    anomalies = []
    for (session_id, key), entry in sorted(cached.items()):
        if entry is None or (session_id, key) not in state:
            continue
        stored = state[(session_id, key)]
        version = next((v for v in stored.versions if v.version == entry.version), None)
        message = None
        if entry.version != stored.live_version:
            message = f"Redis holds v{entry.version}, the database v{stored.live_version}"
        elif version is None:
            pass  # pruned from the history: the version number is all there is to compare
        elif entry.absent:
            expired = version.expires_at is not None and version.expires_at <= now
            if version.op in VALUE_OPS and not expired:
                message = f"Redis holds v{entry.version} as absent, the database's holds a value"
        elif version.op not in VALUE_OPS:
            message = f"Redis holds a value as v{entry.version}, the database's is a {version.op}"
        elif entry.value != version.value:
            message = (
                f"Redis holds v{entry.version} = {_short(entry.value)}, the database's "
                f"v{entry.version} = {_short(version.value)}"
            )
        if message is not None:
            anomalies.append(Anomaly("cache-divergence", session_id, key, message))
    return anomalies


def cache_orphans(entries: dict[tuple[str, str], CachedEntry]) -> list[Anomaly]:
    """Entries Redis serves with a value for memories the database has no row of (``entries``:
    only those)."""
    return [
        Anomaly(
            "cache-divergence",
            session_id,
            key,
            f"Redis holds v{entry.version} = {_short(entry.value)} of a memory the database "
            "does not have",
        )
        for (session_id, key), entry in sorted(entries.items())
    ]


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def duplicate_rows(duplicates: dict[tuple[str, str], int]) -> list[Anomaly]:
    """One anomaly per (session_id, key) with more than one row (``duplicates``: the counts)."""
    return [
        Anomaly("duplicate-row", session_id, key, f"{n} rows for one (session_id, key)")
        for (session_id, key), n in sorted(duplicates.items())
    ]


def audit_key(session_id: str, key: str, stored: StoredKey) -> list[Anomaly]:
    """The invariants that hold for any stored data, whatever wrote it."""
    anomalies = []
    numbers = [v.version for v in stored.versions]
    # No gap above the retention watermark: versions below kept_from were pruned, not lost.
    first = stored.kept_from
    if numbers != list(range(first, first + len(numbers))):
        kept = f" (kept from v{first})" if first > 1 else ""
        anomalies.append(
            Anomaly("version-gap", session_id, key, f"history versions are {_span(numbers)}{kept}")
        )
    newest = numbers[-1] if numbers else 0
    if stored.rows and stored.live_version != newest:
        anomalies.append(
            Anomaly(
                "live-row",
                session_id,
                key,
                f"live row is v{stored.live_version}, newest history version is v{newest}",
            )
        )
    elif stored.rows and stored.versions and stored.live_state == "live":
        kept = stored.versions[-1].expires_at
        if not _same_time(stored.live_expires_at, kept):
            anomalies.append(
                Anomaly(
                    "live-row",
                    session_id,
                    key,
                    f"live row v{newest} expires at {_at(stored.live_expires_at)}, its version "
                    f"was stored expiring at {_at(kept)}",
                )
            )
    return anomalies


#: Seconds two stored times may differ by (the databases keep microseconds; JSON round trips
#: and float seconds lose less than this).
TIME_TOLERANCE = 0.002


def _same_time(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= TIME_TOLERANCE


def _at(t: float | None) -> str:
    return "never" if t is None else f"{t:.3f}"


def _span(numbers: list[int]) -> str:
    if len(numbers) <= 12:
        return str(numbers)
    return f"{numbers[:6]} ... {numbers[-6:]} ({len(numbers)} versions)"


def brief(op: Operation) -> dict[str, Any]:
    return {
        "id": op.id,
        "client": op.client,
        "kind": op.kind,
        "status": op.status,
        "invoked_at": op.invoked_at,
        "completed_at": op.completed_at,
        "expected_version": op.expected_version,
        "version": op.version,
        "value": token_of(op.value) if op.is_write else token_of(op.result),
        "error": op.error,
        "source": op.source,
    }


def check_history(
    history: History, state: dict[tuple[str, str], StoredKey], failovers: Any = ()
) -> list[Anomaly]:
    """Every check of :data:`CHECKS` over the history and the final stored state. ``failovers``:
    the database failovers injected during the run (each with ``crashed_at``, ``promoted_at``
    and ``timelines``), whose losses are the database's own (:func:`database_losses`)."""
    anomalies, history = database_losses(history, state, list(failovers))
    keyed = {
        pair: ops
        for pair, ops in history.by_key().items()
        if ops[0].kind not in LOG_KINDS | CHECKPOINT_KINDS | ADK_KINDS
    }
    for (session_id, key), stored in sorted(state.items()):
        anomalies += audit_key(session_id, key, stored)
        anomalies += _check_key(session_id, key, keyed.get((session_id, key), []), stored)
    for (session_id, key), ops in keyed.items():
        if (session_id, key) not in state:
            anomalies += _check_key(session_id, key, ops, StoredKey())
    anomalies += _check_all_or_nothing(history, state)
    anomalies += _check_fractured_reads(history, state)
    return anomalies


#: The reads that may return what a failover or a restore took back, until its promotion.
READS_OF_LOST = frozenset({"recall", "version-read", "history-read"})


def database_losses(
    history: History, state: dict[tuple[str, str], StoredKey], failovers: list[Any]
) -> tuple[list[Anomaly], History]:
    """The acknowledged writes and forgets a database failover took back, each a
    ``lost-by-database`` anomaly, and the history the other checks then judge: without them,
    without the reads of their keys made before the promotion and after they were invoked
    (judged against a state the database no longer shows: right or wrong, the final state cannot
    tell), and without the idempotent retries of them (which had nothing to find). A write
    acknowledged after the last promotion and missing is the store's fault (``lost-update``); a
    read after the promotion that returns a lost write is the cache's (``garbage-read``)."""
    if not failovers:
        return [], history
    promoted = max(f.promoted_at for f in failovers)
    held = {
        pair: {(v.version, token_of(v.value)) for v in stored.versions if v.op in VALUE_OPS}
        for pair, stored in state.items()
    }
    anomalies: list[Anomaly] = []
    lost: set[str] = set()
    lost_since: dict[tuple[str, str], float] = {}  # key -> when its first lost op was invoked
    for op in history.operations:
        pair = (op.session_id, op.key)
        if op.status == "info" and op.is_write and _may_lose(op, failovers):
            # Unanswered (the crash took its answer): it may have committed on the old primary
            # and been read there, and then been lost -- no anomaly (nothing acknowledged), but
            # the reads after it judged a state the database no longer shows.
            if token_of(op.value) not in {token for _, token in held.get(pair, ())}:
                lost_since[pair] = min(lost_since.get(pair, op.invoked_at), op.invoked_at)
            continue
        if op.status != "ok" or not _may_lose(op, failovers):
            continue
        if op.is_write and (op.version, op.token) not in held.get(pair, ()):
            what = f"v{op.version} of {op.token}"
        elif op.kind == "forget" and op.result and not _forget_stored(state.get(pair), op):
            what = "forget"
        else:
            continue
        failover = min(
            (f for f in failovers if f.crashed_at >= (op.completed_at or 0) and _may_lose(op, [f])),
            key=lambda f: f.crashed_at,
            default=failovers[-1],
        )
        if failover.kind == "promotion":
            old, new = failover.timelines
            how = (
                f"the replica was promoted {failover.crashed_at - (op.completed_at or 0):.3f}s "
                f"later (GTID {old} on the crashed primary, {new} on the replica) without having "
                "received it -- asynchronous replication"
            )
        elif failover.kind == "restore":
            how = (
                f"the database was restored {failover.crashed_at - (op.completed_at or 0):.3f}s "
                f"later from a dump taken {(op.completed_at or 0) - failover.lost_after:.3f}s "
                "before it was acknowledged (memcheck's db-restore)"
            )
        else:
            old, new = failover.timelines
            how = (
                f"the primary crashed {failover.crashed_at - (op.completed_at or 0):.3f}s later "
                f"and the standby promoted (timeline {int(old, 16)} -> {int(new, 16)}) had not "
                "received it -- asynchronous replication"
            )
        anomalies.append(
            Anomaly(
                "lost-by-database",
                op.session_id,
                op.key,
                f"acknowledged {what} was lost by the database: {how}",
                [brief(op)],
            )
        )
        lost.add(op.id)
        lost_since[pair] = min(lost_since.get(pair, op.invoked_at), op.invoked_at)
    crashed = [f.crashed_at for f in failovers]

    def consequence(op: Operation) -> bool:
        pair = (op.session_id, op.key)
        if op.id in lost:
            return True
        if op.kind in READS_OF_LOST and (op.completed_at or op.invoked_at) <= promoted:
            return pair in lost_since and (op.completed_at or op.invoked_at) >= lost_since[pair]
        error = op.error or ""
        if error.startswith("IdempotencyBroken"):
            return pair in lost_since
        # An erase whose own reads ran across the crash: what it erased may be lost with it.
        return error.startswith("ErasedRead") and any(
            op.invoked_at <= t <= (op.completed_at or t) for t in crashed
        )

    kept: list[Operation] = []
    for op in history.operations:
        if not consequence(op):
            kept.append(op)
        elif (op.error or "").startswith("IdempotencyBroken"):
            # A retry whose first call the database lost wrote again, as a new request: what it
            # stored is the database's consequence too -- an indeterminate write, no phantom.
            kept.append(
                dataclasses.replace(op, status="info", error=f"{DATABASE_LOST}: {op.error}")
            )
    return anomalies, History(history.run_id, kept)


#: The faults that explain a refused call (``MemoryUnavailable``): a connection killed past the
#: retries, a failover, a restore, a node stopped. A held lock (``db-lock``) and the Redis
#: faults do not: the store waits for a lock and serves from the database without Redis.
EXCUSING_FAULTS = frozenset({"db-kill", "db-failover", "db-restore", "node-kill", "node-pause"})
#: SQLite's writers queue behind BEGIN IMMEDIATE within their busy timeout: at most this share
#: of a strict run's calls may be refused "database is locked" (a lock held by a fault longer
#: than the timeout), whatever the faults.
LOCKED_RATE = 0.001


def refusals(history: History, vendor: str, injected: dict[str, int]) -> list[Anomaly]:
    """``--strict``: the calls refused without an answer that a correct deployment under the
    run's faults would have answered -- each a ``refusal`` anomaly naming the cause. SQLite's
    "database is locked" beyond :data:`LOCKED_RATE` of the calls (writers that fail instead of
    waiting: system check W001); ``MemoryUnavailable`` when no fault of
    :data:`EXCUSING_FAULTS` was injected."""
    calls = [op for op in history.operations if op.client != "final"]
    refused = [
        op
        for op in calls
        if op.status == "info" and (op.error or "").startswith("MemoryUnavailable")
    ]
    locked = [op for op in refused if "database is locked" in (op.error or "")]
    locked_ids = {op.id for op in locked}
    found = []
    if vendor.lower() == "sqlite" and len(locked) > LOCKED_RATE * max(len(calls), 1):
        share = f"{len(locked)} of {len(calls)} calls ({100 * len(locked) / len(calls):.2f} %)"
        found += [
            Anomaly(
                "refusal",
                op.session_id,
                op.key,
                f"refused 'database is locked': {share} -- SQLite writers failed instead of "
                "queueing (system check agentmemory.W001: OPTIONS transaction_mode IMMEDIATE "
                "and a timeout)",
                [brief(op)],
            )
            for op in locked
        ]
    if not EXCUSING_FAULTS & {kind for kind, n in injected.items() if n}:
        found += [
            Anomaly(
                "refusal",
                op.session_id,
                op.key,
                f"refused with no injected fault that explains it: {op.error}",
                [brief(op)],
            )
            for op in refused
            if op.id not in locked_ids
        ]
    return found


def _may_lose(op: Operation, failovers: list[Any]) -> bool:
    """Whether one of ``failovers`` may have taken ``op`` back: a failover, any write
    acknowledged before its promotion; a restore (memcheck's ``db-restore``), a write that ran
    after the dump began and was invoked before the restore ended."""
    for f in failovers:
        if f.kind in ("restore", "promotion"):
            if (op.completed_at or f.crashed_at) >= f.lost_after and op.invoked_at <= f.crashed_at:
                return True
        elif (op.completed_at or op.invoked_at) <= f.promoted_at or (
            op.status == "info" and (op.invoked_at <= f.promoted_at)
        ):
            return True
    return False


def _forget_stored(stored: StoredKey | None, op: Operation) -> bool:
    """Whether the final history holds a forget made while ``op`` ran."""
    return stored is not None and any(
        v.op not in VALUE_OPS and op.invoked_at - 0.001 <= v.created_at <= (op.completed_at or 0)
        for v in stored.versions
    )


def _check_fractured_reads(
    history: History, state: dict[tuple[str, str], StoredKey]
) -> list[Anomaly]:
    """Read atomicity of ``recall_many`` (RAMP's fractured read): a call that returns the value a
    remember_many wrote on one key returns, on each other key of that write it read, that write's
    version or a newer one -- never an older version, nor absent while the write's value was
    live. A search is not a snapshot (it reads in chunks) and is not judged here."""
    # token -> {(session, key): version} of every stored value
    written: dict[str, dict[tuple[str, str], int]] = defaultdict(dict)
    for pair, stored in state.items():
        for v in stored.versions:
            if v.op in VALUE_OPS and (token := token_of(v.value)) is not None:
                written[token][pair] = v.version
    calls: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for op in history.operations:
        if op.kind == "recall" and op.query is None and op.id.endswith(f"-{op.key}"):
            calls[(op.client, op.id[: -len(op.key) - 1])].append(op)
    anomalies = []
    for (_, call_id), reads in sorted(calls.items()):
        ok = [r for r in reads if r.status == "ok"]
        if len(ok) < 2:
            continue
        by_key = {(r.session_id, r.key): r for r in ok}
        for read in ok:
            token = token_of(read.result) if read.version is not None else None
            together = written.get(token or "", {})
            if len(together) < 2:
                continue  # not a multi-key write's value
            for pair, version in sorted(together.items()):
                other = by_key.get(pair)
                if other is None or other is read:
                    continue
                if other.version is not None and other.version >= version:
                    continue
                if other.version is None and _was_missing(state.get(pair), version, other):
                    continue
                seen = "absent" if other.version is None else f"v{other.version}"
                anomalies.append(
                    Anomaly(
                        "fractured-read",
                        read.session_id,
                        f"{read.key},{pair[1]}",
                        f"recall_many {call_id} returned {read.key!r} v{read.version} of write "
                        f"{token} but {pair[1]!r} {seen}, older than that write's v{version}",
                        [brief(read), brief(other)],
                    )
                )
    return anomalies


def _was_missing(stored: StoredKey | None, version: int, read: Operation) -> bool:
    """Whether key's memory may rightly have been absent for ``read``: a version from ``version``
    on, created before the read completed, forgot or expired it, or expired by then."""
    if stored is None:
        return False
    end = read.completed_at if read.completed_at is not None else read.invoked_at
    for v in stored.versions:
        if v.version < version or v.created_at > end:
            continue
        if v.op not in VALUE_OPS or (v.expires_at is not None and v.expires_at <= end):
            return True
    return False


def _check_all_or_nothing(
    history: History, state: dict[tuple[str, str], StoredKey]
) -> list[Anomaly]:
    """Each remember_many that was not acknowledged (it failed, or its outcome is unknown) left
    its value on all of its keys or on none."""
    stored_tokens = {
        pair: {token_of(v.value) for v in stored.versions if v.op in VALUE_OPS}
        for pair, stored in state.items()
    }
    calls: dict[str, list[Operation]] = defaultdict(list)
    for op in history.operations:
        if op.kind == "many" and op.status != "ok":
            calls[op.id].append(op)
    anomalies = []
    for op_id, ops in sorted(calls.items()):
        landed = [
            op.key for op in ops if op.token in stored_tokens.get((op.session_id, op.key), ())
        ]
        if landed and len(landed) < len(ops):
            anomalies.append(
                Anomaly(
                    "all-or-nothing",
                    ops[0].session_id,
                    ",".join(op.key for op in ops),
                    f"remember_many {op_id} ({ops[0].status}: {ops[0].error}) is stored on "
                    f"{landed} only",
                    [brief(op) for op in ops],
                )
            )
    return anomalies


def _check_key(session_id: str, key: str, ops: list[Operation], stored: StoredKey) -> list[Anomaly]:
    found: list[Anomaly] = []

    def report(check: str, message: str, *involved: Operation) -> None:
        found.append(Anomaly(check, session_id, key, message, [brief(op) for op in involved]))

    by_version = {v.version: v for v in stored.versions}
    writers: dict[str, Operation] = {}
    for op in ops:
        if op.is_write and op.token:
            writers[op.token] = op
        error = op.error or ""
        if op.status == "info" and not allowed_without_answer(error):
            report("caller-error", f"{op.kind} raised {op.error}", op)
        if op.status == "fail" and error.startswith("IdempotencyBroken"):
            report("idempotent-retry", error, op)
        if op.status == "fail" and error.startswith("OwnWriteMissed"):
            report("read-own-write", error.partition(": ")[2], op)
        if op.status == "fail" and error.startswith("ErasedRead"):
            report("erased-read", error.partition(": ")[2], op)
        if op.kind == "bad-input" and op.status == "ok":
            report("bad-input", f"a call with bad input was {op.error}", op)
        if op.kind == "cas" and op.error == "VersionConflict" and op.version == op.expected_version:
            report(
                "spurious-conflict",
                f"CAS expecting v{op.expected_version} conflicted, reporting v{op.version}",
                op,
            )
        if op.prefix is not None and not op.key.startswith(op.prefix):
            report("prefix-read", f"recall_many(prefix={op.prefix!r}) returned {op.key!r}", op)
        if op.query is not None and op.status == "ok" and op.version is not None:
            _check_score(op, report)
        if op.kind == "version-read" and op.status == "ok" and op.version is not None:
            _check_version_read(op, by_version, stored.kept_from, report)
        if op.kind == "history-read" and op.status == "ok" and op.result:
            _check_history_pages(op, by_version, stored.kept_from, report)

    # Writes: each acknowledged one is exactly one version, holding its value.
    acked_at: dict[int, list[Operation]] = defaultdict(list)
    for op in ops:
        if not (op.is_write and op.status == "ok"):
            continue
        acked_at[op.version].append(op)
        stored_version = by_version.get(op.version)
        if stored_version is None or token_of(stored_version.value) != op.token:
            holder = token_of(stored_version.value) if stored_version else None
            report(
                "lost-update",
                f"acknowledged v{op.version} of {op.token} is not in the history (v{op.version} holds {holder})",
                op,
            )
        elif stored_version is not None:
            _check_expiry(op, stored_version, report)
        if op.kind == "cas":
            _check_cas(op, by_version, report)
    for version, acked in sorted(acked_at.items()):
        if len(acked) > 1:
            report("lost-update", f"{len(acked)} acknowledged writes all claim v{version}", *acked)

    # Stored versions: each written by a call that did not fail outright.
    seen_tokens: dict[str, int] = {}
    for stored_version in stored.versions:
        if stored_version.op not in VALUE_OPS:
            continue
        token = token_of(stored_version.value)
        writer = writers.get(token or "")
        if writer is None or writer.status == "fail":
            report(
                "phantom-write",
                f"v{stored_version.version} holds {token}, which no successful call wrote",
                *([writer] if writer else []),
            )
        if token in seen_tokens:
            report(
                "phantom-write",
                f"{token} was stored twice: v{seen_tokens[token]} and v{stored_version.version}",
                *([writer] if writer else []),
            )
        seen_tokens[token or ""] = stored_version.version

    _check_lists(key, ops, stored, report)
    _check_reads(session_id, key, ops, by_version, writers, report)
    _check_monotonic(ops, report)
    return found


def _check_score(op: Operation, report: Any) -> None:
    """A search result: its score is the one its value gets (recomputed here, independently of
    the store's vectors) -- a vector of another version gives another score."""
    expected = semantic.expected_score(op.query or "", op.result)
    if expected is None or op.score is None:
        report("search-score", f"search returned v{op.version}, which has no text to index", op)
    elif abs(op.score - expected) > semantic.SCORE_TOLERANCE:
        report(
            "search-score",
            f"search for {op.query!r} scored v{op.version} {op.score:.5f}; its value scores "
            f"{expected:.5f}",
            op,
        )


def _check_expiry(op: Operation, stored: StoredVersion, report: Any) -> None:
    """An acknowledged write: its version's stored expiry is the write's time plus the TTL it
    asked for (none if it asked none), and the write reported that expiry."""
    asked = None if op.ttl is None else stored.created_at + op.ttl
    if not _same_time(stored.expires_at, asked):
        ttl = "no TTL" if op.ttl is None else f"ttl={op.ttl:g}s"
        report(
            "ttl-stored",
            f"v{stored.version} was written with {ttl} at {stored.created_at:.3f}, and stored "
            f"expiring at {_at(stored.expires_at)} (not {_at(asked)})",
            op,
        )
    elif not _same_time(op.expires_at, stored.expires_at):
        report(
            "expiry-mismatch",
            f"the write of v{stored.version} reported expiry {_at(op.expires_at)}, the version "
            f"was stored expiring at {_at(stored.expires_at)}",
            op,
        )


def _check_cas(op: Operation, by_version: dict[int, StoredVersion], report: Any) -> None:
    expected, version = op.expected_version or 0, op.version or 0
    before = by_version.get(version - 1)
    if expected > 0 and version != expected + 1:
        report("cas-violation", f"CAS expecting v{expected} was acknowledged as v{version}", op)
    elif expected == 0 and before is not None and before.op in VALUE_OPS:
        report(
            "cas-violation",
            f"CAS expecting no memory landed as v{version} over live v{before.version}",
            op,
        )


def _check_lists(key: str, ops: list[Operation], stored: StoredKey, report: Any) -> None:
    # A list is a key written by appends (whatever its name): every read reveals the order.
    if not stored.versions or not any(op.kind == "append" for op in ops):
        return
    final = [token_of(item) for item in (stored.versions[-1].value or [])]
    position = {token: i for i, token in enumerate(final)}
    for op in ops:
        if op.kind == "append" and op.status == "ok":
            count = final.count(op.token)
            if count != 1:
                report(
                    "lost-update",
                    f"acknowledged append {op.token} appears {count} times in the final list of {len(final)}",
                    op,
                )
        if op.kind == "recall" and op.status == "ok" and isinstance(op.result, list):
            read = [token_of(item) for item in op.result]
            if read != final[: len(read)]:
                first = next((i for i, t in enumerate(read) if position.get(t) != i), len(read))
                report(
                    "list-order",
                    f"read of {len(read)} items is not a prefix of the final list (differs at {first})",
                    op,
                )


def _check_reads(
    session_id: str,
    key: str,
    ops: list[Operation],
    by_version: dict[int, StoredVersion],
    writers: dict[str, Operation],
    report: Any,
) -> None:
    # Acknowledged versions in completion order, with the newest version acknowledged by each
    # point: a read must see at least the newest one acknowledged before it began (a bisection
    # per read, not a scan of every acknowledgement).
    acks = sorted(
        (
            (op.completed_at or 0.0, op.version or 0)
            for op in ops
            if op.status == "ok" and op.is_write and op.version
        ),
    )
    done_at = [done for done, _ in acks]
    newest = list(itertools.accumulate((version for _, version in acks), max))
    for op in ops:
        if op.kind != "recall" or op.status != "ok":
            continue
        acked_before = bisect.bisect_left(done_at, op.invoked_at)
        floor = newest[acked_before - 1] if acked_before else 0
        if op.result is None and op.version is None:
            if floor and not _absent_during(by_version, floor, op):
                report(
                    "stale-read",
                    f"read returned nothing though v{floor} was acknowledged before it began and stayed live",
                    op,
                )
            continue
        value = op.result
        if isinstance(value, dict) and (value.get("s"), value.get("k")) != (session_id, key):
            report(
                "cross-session-read",
                f"read of ({session_id!r}, {key!r}) returned a value of ({value.get('s')!r}, {value.get('k')!r})",
                op,
            )
        writer = writers.get(token_of(value) or "")
        if writer is not None and writer.status == "fail":
            report(
                "aborted-read",
                f"read returned v{op.version} = {token_of(value)}, written by a call that failed",
                op,
                writer,
            )
        stored_version = by_version.get(op.version or 0)
        if stored_version is None or stored_version.value != value:
            report(
                "garbage-read",
                f"read returned v{op.version} = {token_of(value)}, which the history does not hold",
                op,
            )
        if (op.version or 0) < floor:
            report(
                "stale-read",
                f"read returned v{op.version} though v{floor} was acknowledged before it began",
                op,
            )
        # Judged by the expiry the version was stored with, not the one the read reports.
        expiries = [op.expires_at]
        if stored_version is not None:
            expiries.append(stored_version.expires_at)
            if not _same_time(op.expires_at, stored_version.expires_at):
                report(
                    "expiry-mismatch",
                    f"read of v{op.version} reported expiry {_at(op.expires_at)}, the version "
                    f"was stored expiring at {_at(stored_version.expires_at)}",
                    op,
                )
        expired = [e for e in expiries if e is not None and e <= op.invoked_at]
        if expired:
            report(
                "expired-read",
                f"read returned v{op.version}, expired {op.invoked_at - min(expired):.3f}s before the read began",
                op,
            )


def _check_version_read(
    op: Operation, by_version: dict[int, StoredVersion], kept_from: int, report: Any
) -> None:
    """A read of version N (``recall(version=N)``) that returned something: version N, as the
    history holds it, not expired when the read began."""
    asked = op.expected_version
    if op.version != asked:
        report("past-version-read", f"asked for v{asked}, returned v{op.version}", op)
        return
    stored = by_version.get(op.version)
    if stored is None:
        if op.version >= kept_from:  # below it: pruned since, nothing to compare with
            report("past-version-read", f"returned v{op.version}, which the history lacks", op)
        return
    if stored.op not in VALUE_OPS or token_of(stored.value) != token_of(op.result):
        report(
            "past-version-read",
            f"returned v{op.version} holding {token_of(op.result)}; the history's "
            f"v{op.version} is a {stored.op} of {token_of(stored.value)}",
            op,
        )
    elif stored.expires_at is not None and stored.expires_at <= op.invoked_at:
        report(
            "past-version-read",
            f"returned v{op.version}, expired {op.invoked_at - stored.expires_at:.3f}s before "
            "the read began",
            op,
        )


def _check_history_pages(
    op: Operation, by_version: dict[int, StoredVersion], kept_from: int, report: Any
) -> None:
    """The versions a paged history read returned: each one below the one before it by exactly
    one (no repeat: a page that repeats its bound; no gap), each as the history holds it."""
    read = [(int(version), what) for version, what in op.result]
    for (newer, _), (older, _) in itertools.pairwise(read):
        if older != newer - 1:
            why = "again" if older == newer else "after" if older > newer else "with a gap after"
            report("history-page", f"v{older} came {why} v{newer}: {[v for v, _ in read]}", op)
            return
    for version, what in read:
        stored = by_version.get(version)
        if stored is None:
            if version >= kept_from:
                report("history-page", f"returned v{version}, which the history lacks", op)
            continue
        held = token_of(stored.value) if stored.op in VALUE_OPS else stored.op
        if held != what:
            report("history-page", f"returned v{version} as {what}; the history holds {held}", op)


def _check_monotonic(ops: list[Operation], report: Any) -> None:
    """Per client: the versions its successful reads return never decrease (ops are sorted by
    invocation, and one client runs one operation at a time)."""
    newest: dict[str, Operation] = {}
    for op in ops:
        if op.kind != "recall" or op.status != "ok" or op.version is None:
            continue
        before = newest.get(op.client)
        if before is not None and op.version < (before.version or 0):
            report(
                "non-monotonic-read",
                f"client {op.client} read v{before.version}, then v{op.version}",
                before,
                op,
            )
        if before is None or op.version > (before.version or 0):
            newest[op.client] = op


def _absent_during(by_version: dict[int, StoredVersion], floor: int, read: Operation) -> bool:
    """Whether the memory was missing at some instant of the read: forgotten, expired, or its
    last write's TTL passed before the read completed."""
    end = read.completed_at or read.invoked_at
    for version in sorted(v for v in by_version if v >= floor):
        stored = by_version[version]
        if stored.created_at > end:
            break
        if stored.op not in VALUE_OPS:
            return True
        if stored.expires_at is not None and stored.expires_at <= end:
            return True
    return False


__all__ = [
    "CHECKS",
    "DATABASE_OWN",
    "Anomaly",
    "StoredKey",
    "audit_key",
    "brief",
    "cache_divergence",
    "cache_orphans",
    "check_history",
    "database_losses",
    "duplicate_rows",
    "refusals",
]
