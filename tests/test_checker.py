"""The checker on hand-made histories: each anomaly planted once must be flagged (and only where it
is), and coherent histories -- indeterminate writes included -- must pass. No database needed:
the checker compares a History with a StoredKey snapshot."""

from collections import Counter

import pytest

from agentmemory.consistency.checker import CHECKS, StoredKey, StoredVersion, check_history
from agentmemory.consistency.history import History, Operation

S, K = "s", "reg-0"


def w(token, s=S, k=K):
    return {"op": token, "s": s, "k": k}


def op(
    id_,
    kind,
    t0,
    t1,
    *,
    status="ok",
    version=None,
    value=None,
    result=None,
    client=None,
    key=K,
    **extra,
):
    o = Operation(id_, client or f"c-{id_}", kind, S, key, t0, completed_at=t1, status=status)
    o.version, o.value, o.result = version, value, result
    for name, v in extra.items():
        setattr(o, name, v)
    return o


def write(id_, t0, t1, version, **kw):
    return op(id_, "remember", t0, t1, version=version, value=w(id_), result=w(id_), **kw)


def read(id_, t0, t1, version, token, **kw):
    return op(id_, "recall", t0, t1, version=version, result=w(token) if token else None, **kw)


def stored(*tokens, live=None, key=K, created=None):
    versions = [
        StoredVersion(i + 1, "write", w(t, k=key), created[i] if created else float(i), None)
        for i, t in enumerate(tokens)
    ]
    return StoredKey(rows=1, live_version=live or len(tokens), live_state="live", versions=versions)


def found(ops, state):
    history = History("r", list(ops))
    return Counter(a.check for a in check_history(history, state))


CLEAN = [write("w1", 0, 1, 1), read("r1", 2, 3, 1, "w1"), write("w2", 4, 5, 2)]


def test_a_coherent_history_passes():
    assert found(CLEAN, {(S, K): stored("w1", "w2")}) == Counter()


def test_indeterminate_writes_may_apply_or_not():
    maybe = op("w2", "remember", 4, 5, status="info", value=w("w2"), error="MemoryUnavailable: x")
    assert found([*CLEAN[:2], maybe], {(S, K): stored("w1")}) == Counter()
    assert found([*CLEAN[:2], maybe], {(S, K): stored("w1", "w2")}) == Counter()
    # ...and a read may see one that did apply.
    seen = read("r2", 6, 7, 2, "w2")
    assert found([*CLEAN[:2], maybe, seen], {(S, K): stored("w1", "w2")}) == Counter()


CASES = {
    "lost-update": (
        [write("w1", 0, 1, 1), write("w2", 0, 1, 2)],
        stored("w1", "w3"),
    ),
    "version-gap": (
        [write("w1", 0, 1, 1)],
        StoredKey(
            rows=1,
            live_version=3,
            live_state="live",
            versions=[
                StoredVersion(1, "write", w("w1"), 0, None),
                StoredVersion(3, "write", w("w1"), 1, None),
            ],
        ),
    ),
    "live-row": ([write("w1", 0, 1, 1)], stored("w1", live=5)),
    "phantom-write": ([write("w1", 0, 1, 1)], stored("w1", "nobody")),
    "cas-violation": (
        [
            write("w1", 0, 1, 1),
            op("c", "cas", 2, 3, version=3, value=w("c"), expected_version=1),
            write("w2", 2, 3, 2),
        ],
        stored("w1", "w2", "c"),
    ),
    "idempotent-retry": (
        [
            op(
                "i",
                "retry",
                0,
                1,
                status="fail",
                value=w("i"),
                error="IdempotencyBroken: v2 then v1",
            )
        ],
        StoredKey(),
    ),
    "aborted-read": (
        [
            write("w1", 0, 1, 1),
            op(
                "c",
                "cas",
                2,
                3,
                status="fail",
                value=w("c"),
                expected_version=0,
                error="VersionConflict",
            ),
            read("r", 4, 5, 1, "c"),
        ],
        stored("w1"),
    ),
    "garbage-read": ([write("w1", 0, 1, 1), read("r", 2, 3, 1, "w1-but-changed")], stored("w1")),
    "stale-read": (
        [write("w1", 0, 1, 1), write("w2", 2, 3, 2), read("r", 4, 5, 1, "w1")],
        stored("w1", "w2"),
    ),
    "non-monotonic-read": (
        [
            write("w1", 0, 1, 1),
            write("w2", 2, 9, 2),  # still in flight while both reads run: neither read is stale
            read("r1", 3, 4, 2, "w2", client="reader"),
            read("r2", 5, 6, 1, "w1", client="reader"),
        ],
        stored("w1", "w2"),
    ),
    "cross-session-read": (
        [write("w1", 0, 1, 1), op("r", "recall", 2, 3, version=1, result=w("w1", s="s%"))],
        stored("w1"),
    ),
    "expired-read": (
        [write("w1", 0, 1, 1), read("r", 5, 6, 1, "w1", expires_at=4.0)],
        stored("w1"),
    ),
    "caller-error": (
        [op("w1", "remember", 0, 1, status="info", value=w("w1"), error="OperationalError: boom")],
        StoredKey(),
    ),
}


@pytest.mark.parametrize("check", sorted(CASES))
def test_each_planted_anomaly_is_flagged(check):
    ops, state = CASES[check]
    anomalies = found(ops, {(S, K): state} if state.rows else {})
    assert anomalies[check] >= 1, anomalies


def test_a_read_of_nothing_after_an_acknowledged_write_is_stale():
    ops = [write("w1", 0, 1, 1), read("r", 2, 3, None, None)]
    assert found(ops, {(S, K): stored("w1")})["stale-read"] == 1
    # ...unless the memory was forgotten meanwhile.
    forgotten = stored("w1")
    forgotten.versions.append(StoredVersion(2, "forget", None, 1.5, None))
    forget = op("f", "forget", 1.2, 1.8, result=True)
    assert found([*ops, forget], {(S, K): forgotten})["stale-read"] == 0


def test_lists_every_read_a_prefix_and_every_append_once():
    key = "list-0"

    def append(id_, t0, t1, version):
        return op(id_, "append", t0, t1, version=version, value=w(id_, k=key), key=key)

    final = StoredKey(
        rows=1,
        live_version=2,
        live_state="live",
        versions=[
            StoredVersion(1, "write", [w("a1", k=key)], 0, None),
            StoredVersion(2, "write", [w("a1", k=key), w("a2", k=key)], 1, None),
        ],
    )
    ops = [append("a1", 0, 1, 1), append("a2", 2, 3, 2)]
    assert found(ops, {(S, key): final}) == Counter()
    bad_read = op("r", "recall", 4, 5, version=2, result=[w("a2", k=key)], key=key)
    assert found([*ops, bad_read], {(S, key): final})["list-order"] == 1
    lost = [*ops, append("a3", 2, 3, 3)]
    assert found(lost, {(S, key): final})["lost-update"] >= 1


def test_every_check_has_a_planted_case_here_or_a_database_test():
    # duplicate-row needs two rows for one (session_id, key), which the unique constraint forbids
    # on every database, so it cannot be planted; cache-divergence needs Redis (test_memcheck);
    # list-order has its own test above.
    elsewhere = {"duplicate-row", "cache-divergence", "list-order"}
    assert set(CHECKS) == set(CASES) | elsewhere
