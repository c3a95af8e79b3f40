"""The checker on hand-made histories: each anomaly planted once must be flagged (and only where it
is), and coherent histories -- indeterminate writes included -- must pass. No database needed:
the checker compares a History with a StoredKey snapshot."""

from collections import Counter

import pytest

from agentmemory.consistency.checker import CHECKS, StoredKey, StoredVersion, check_history
from agentmemory.consistency.history import History, Operation
from agentmemory.consistency.pg_failover import Failover

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


def write(id_, t0, t1, version, kind="remember", **kw):
    return op(id_, kind, t0, t1, version=version, value=w(id_), result=w(id_), **kw)


def read(id_, t0, t1, version, token, **kw):
    return op(id_, "recall", t0, t1, version=version, result=w(token) if token else None, **kw)


def stored(*tokens, live=None, key=K, created=None, expires=None):
    """A key whose versions hold ``tokens``; version i+1 created at ``created[i]`` (default i)
    and expiring at ``expires[i]`` (default never)."""
    versions = [
        StoredVersion(
            i + 1,
            "write",
            w(t, k=key),
            created[i] if created else float(i),
            expires[i] if expires else None,
        )
        for i, t in enumerate(tokens)
    ]
    return StoredKey(
        rows=1,
        live_version=live or len(tokens),
        live_state="live",
        live_expires_at=versions[-1].expires_at if versions else None,
        versions=versions,
    )


def found(ops, state):
    history = History("r", list(ops))
    return Counter(a.check for a in check_history(history, state))


def _forgotten_at(when, then=None):
    """v1 = w1 (created at 0), v2 = a forget created at ``when``, then v3 = ``then`` if given."""
    key = stored("w1")
    key.versions.append(StoredVersion(2, "forget", None, when, None))
    if then:
        key.versions.append(StoredVersion(3, "write", w(then), when + 1, None))
    key.live_version = len(key.versions)
    key.live_state = "live" if then else "forgotten"
    return key


CLEAN = [write("w1", 0, 1, 1), read("r1", 2, 3, 1, "w1"), write("w2", 4, 5, 2)]


def texted(token, text="cat dog fish"):
    """A value of the search workload: indexed by its text."""
    return {**w(token), "text": text}


def searched(score, query="cat"):
    """v1 holds a text; a search for ``query`` returned it with ``score``."""
    value = texted("w1")
    ops = [
        op("w1", "remember", 0, 1, version=1, value=value, result=value),
        op("r", "recall", 2, 3, version=1, result=value, query=query, score=score),
    ]
    state = StoredKey(
        rows=1,
        live_version=1,
        live_state="live",
        versions=[StoredVersion(1, "write", value, 0.0, None)],
    )
    return ops, state


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
        # The read reports no expiry; the version was stored expiring at 4.
        [write("w1", 0, 1, 1, ttl=4.0, expires_at=4.0), read("r", 5, 6, 1, "w1")],
        stored("w1", created=[0.0], expires=[4.0]),
    ),
    "history-page": (
        # Pages of two: v3, v2, then v2 again (a page that repeats its bound), v1.
        [
            write("w1", 0, 1, 1),
            write("w2", 1, 2, 2),
            write("w3", 2, 3, 3),
            op(
                "h",
                "history-read",
                4,
                5,
                result=[[3, "w3"], [2, "w2"], [2, "w2"], [1, "w1"]],
            ),
        ],
        stored("w1", "w2", "w3"),
    ),
    "past-version-read": (
        # v1 expired at 4; a read of v1 by number began at 5 and returned it.
        [
            write("w1", 0, 1, 1, ttl=4.0, expires_at=4.0),
            write("w2", 1, 2, 2),
            op("r", "version-read", 5, 6, version=1, expected_version=1, result=w("w1")),
        ],
        stored("w1", "w2", created=[0.0, 1.5], expires=[4.0, None]),
    ),
    "ttl-stored": (
        # Written without a TTL, stored with one (kept from the version before, say).
        [write("w1", 0, 1, 1, expires_at=9.0)],
        stored("w1", created=[0.5], expires=[9.0]),
    ),
    "expiry-mismatch": (
        # A read reports a later expiry than its version was stored with (a sliding TTL).
        [write("w1", 0, 1, 1, ttl=4.0, expires_at=4.5), read("r", 2, 3, 1, "w1", expires_at=6.0)],
        stored("w1", created=[0.5], expires=[4.5]),
    ),
    "spurious-conflict": (
        [
            write("w1", 0, 1, 1),
            op(
                "c",
                "cas",
                2,
                3,
                status="fail",
                value=w("c"),
                expected_version=1,
                version=1,
                error="VersionConflict",
            ),
        ],
        stored("w1"),
    ),
    "prefix-read": (
        [write("w1", 0, 1, 1), read("r", 2, 3, 1, "w1", prefix="REG-")],
        stored("w1"),
    ),
    "read-own-write": (
        [
            op(
                "t",
                "txn-write",
                0,
                1,
                status="fail",
                value=w("t"),
                error="OwnWriteMissed: inside the transaction, a read returned nothing",
            )
        ],
        StoredKey(),
    ),
    "erased-read": (
        [op("e", "erase", 0, 1, status="fail", error="ErasedRead: reads still returned ['e-0']")],
        StoredKey(),
    ),
    "bad-input": (
        [op("b", "bad-input", 0, 1, status="ok", value=w("b"), error="accepted: ttl=0")],
        StoredKey(),
    ),
    "caller-error": (
        [op("w1", "remember", 0, 1, status="info", value=w("w1"), error="OperationalError: boom")],
        StoredKey(),
    ),
    # A search scored the value by another text's vector (an older version's, say).
    "search-score": searched(0.9),
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
    # all-or-nothing spans keys: its own test below.
    elsewhere = {
        "duplicate-row",
        "cache-divergence",
        "list-order",
        "all-or-nothing",
        "fractured-read",
        "lost-by-database",  # needs a failover: its own tests below
        # the log checks: tests/test_log_checker.py
        "log-append",
        "log-sequence",
        "log-pop",
        "log-read",
        # the checkpoint checks: tests/test_checkpoint_checker.py
        "checkpoint-fork",
        "checkpoint-write",
        "checkpoint-read",
        "checkpoint-list",
        "checkpoint-delete",
        # the ADK checks: tests/test_adk_checker.py
        "adk-event",
        "adk-state",
        "adk-read",
        # found by memcheck's orm-bulk fault itself: tests/test_orm_writes.py
        "orm-bulk",
        # found by the writer-crash, cache-evict and fence-race faults:
        # tests/test_fill_safeguards.py
        "writer-crash",
        "cache-evict",
        "fence-race",
        # judged with --strict only: tests/test_memcheck.py
        "refusal",
    }
    assert set(CHECKS) == set(CASES) | elsewhere


def many(id_, key, status, **kw):
    return op(id_, "many", 0, 1, status=status, value=w(id_, k=key), key=key, **kw)


@pytest.mark.parametrize(
    ("status", "landed", "anomalies"),
    [
        ("fail", [], Counter()),  # failed, nothing stored: as promised
        ("info", ["many-0", "many-1"], Counter()),  # unknown outcome, stored on both: fine
        ("info", [], Counter()),  # ...or on neither
        ("fail", ["many-0"], Counter({"all-or-nothing": 1, "phantom-write": 1})),
        ("info", ["many-1"], Counter({"all-or-nothing": 1})),
    ],
)
def test_remember_many_is_stored_on_all_of_its_keys_or_none(status, landed, anomalies):
    error = "MemoryUnavailable: x" if status == "info" else "InjectedFailure: x"
    ops = [many("m", "many-0", status, error=error), many("m", "many-1", status, error=error)]
    state = {(S, key): stored("m", key=key) for key in landed}
    assert found(ops, state) == anomalies


def many_read(call, key, version, token, t0=10, t1=11):
    """One key's share of a recall_many ``call`` (recorded as ``<call>-<key>``)."""
    result = w(token, k=key) if token else None
    return op(
        f"{call}-{key}", "recall", t0, t1, version=version, result=result, key=key, client="reader"
    )


def two_writes_of_two_keys():
    """remember_many m1 wrote v1 of many-0 and many-1, then m2 wrote v2 of both."""
    ops = [many("m1", "many-0", "ok"), many("m1", "many-1", "ok")]
    ops += [many("m2", "many-0", "ok"), many("m2", "many-1", "ok")]
    state = {(S, key): stored("m1", "m2", key=key) for key in ("many-0", "many-1")}
    return ops, state


@pytest.mark.parametrize(
    ("seen", "fractured"),
    [
        ({"many-0": (2, "m2"), "many-1": (2, "m2")}, False),
        ({"many-0": (1, "m1"), "many-1": (1, "m1")}, False),
        ({"many-0": (2, "m2"), "many-1": (1, "m1")}, True),  # m2 seen on one key only
        ({"many-0": (1, "m1"), "many-1": (2, "m2")}, True),
        ({"many-0": (2, "m2"), "many-1": (None, None)}, True),  # absent while m2's value lived
    ],
)
def test_a_recall_many_that_sees_one_key_of_a_remember_many_sees_all(seen, fractured):
    ops, state = two_writes_of_two_keys()
    ops += [many_read("rm", key, *got) for key, got in seen.items()]
    assert (found(ops, state)["fractured-read"] > 0) is fractured


def test_a_key_forgotten_before_the_read_completed_may_be_absent_beside_the_other():
    ops, state = two_writes_of_two_keys()
    state[(S, "many-1")].versions.append(StoredVersion(3, "forget", None, 10.5, None))
    ops += [many_read("rm", "many-0", 2, "m2"), many_read("rm", "many-1", None, None)]
    assert found(ops, state)["fractured-read"] == 0
    # Reads of two different calls are never judged together.
    ops, state = two_writes_of_two_keys()
    ops += [many_read("r1", "many-0", 2, "m2"), many_read("r2", "many-1", 1, "m1")]
    assert found(ops, state)["fractured-read"] == 0


# Every excuse the checker makes, with a planted case on each side of it: (ops, state, check,
# whether it must be flagged). A checker that widened an excuse fails the "flagged" side; one
# that dropped it fails the other.
EXCUSES = {
    # A read must see what was acknowledged before it *began*; a write that completed while it
    # ran is not owed to it.
    "stale: ack completed after the read began": (
        [write("w1", 0, 1, 1), write("w2", 2, 4.5, 2), read("r", 4, 5, 1, "w1")],
        stored("w1", "w2"),
        "stale-read",
        False,
    ),
    "stale: ack completed before the read began": (
        [write("w1", 0, 1, 1), write("w2", 2, 3.9, 2), read("r", 4, 5, 1, "w1")],
        stored("w1", "w2"),
        "stale-read",
        True,
    ),
    # Nothing read though v1 was acknowledged: excused only if the memory was absent at some
    # instant of the read -- its expiry passed before the read *completed*...
    "nothing read: expired before the read completed": (
        [write("w1", 0, 1, 1, ttl=4.5), read("r", 4, 5, None, None)],
        stored("w1", created=[0.0], expires=[4.5]),
        "stale-read",
        False,
    ),
    "nothing read: expired only after the read completed": (
        [write("w1", 0, 1, 1, ttl=5.5), read("r", 4, 5, None, None)],
        stored("w1", created=[0.0], expires=[5.5]),
        "stale-read",
        True,
    ),
    # ...or a forget was stored before the read completed.
    "nothing read: forgotten before the read completed": (
        [write("w1", 0, 1, 1), op("f", "forget", 3, 4.5, result=True), read("r", 4, 5, None, None)],
        _forgotten_at(4.5),
        "stale-read",
        False,
    ),
    "nothing read: forgotten only after the read completed": (
        [write("w1", 0, 1, 1), op("f", "forget", 5, 6, result=True), read("r", 4, 5, None, None)],
        _forgotten_at(5.5),
        "stale-read",
        True,
    ),
    # A version whose stored expiry passed during the read may be returned; before it began, not.
    "expired during the read": (
        [write("w1", 0, 1, 1, ttl=4.5, expires_at=4.5), read("r", 4, 5, 1, "w1", expires_at=4.5)],
        stored("w1", created=[0.0], expires=[4.5]),
        "expired-read",
        False,
    ),
    "expired before the read began": (
        [write("w1", 0, 1, 1, ttl=3.5, expires_at=3.5), read("r", 4, 5, 1, "w1", expires_at=3.5)],
        stored("w1", created=[0.0], expires=[3.5]),
        "expired-read",
        True,
    ),
    # Stored expiries are compared with a tolerance of TIME_TOLERANCE, no more.
    "ttl stored within the tolerance": (
        [write("w1", 0, 1, 1, ttl=4.0, expires_at=4.0015)],
        stored("w1", created=[0.0], expires=[4.0015]),
        "ttl-stored",
        False,
    ),
    "ttl stored past the tolerance": (
        [write("w1", 0, 1, 1, ttl=4.0, expires_at=4.01)],
        stored("w1", created=[0.0], expires=[4.01]),
        "ttl-stored",
        True,
    ),
    # A version no acknowledged call wrote: fine if its call's outcome was unknown, not if failed.
    "stored by an indeterminate call": (
        [write("w1", 0, 1, 1, status="info", error="MemoryUnavailable: x")],
        stored("w1"),
        "phantom-write",
        False,
    ),
    "stored by a failed call": (
        [write("w1", 0, 1, 1, status="fail", error="InjectedFailure: x")],
        stored("w1"),
        "phantom-write",
        True,
    ),
    # A read may return what an indeterminate call wrote, never what a failed one did.
    "read of an indeterminate write": (
        [
            write("w1", 0, 1, 1, status="info", error="MemoryUnavailable: x"),
            read("r", 2, 3, 1, "w1"),
        ],
        stored("w1"),
        "aborted-read",
        False,
    ),
    "read of a failed write": (
        [write("w1", 0, 1, 1, status="fail", error="RolledBack: x"), read("r", 2, 3, 1, "w1")],
        stored("w1"),
        "aborted-read",
        True,
    ),
    # Monotonic reads are per client: two clients may see different versions in any order.
    "another client reads older": (
        [
            write("w1", 0, 1, 1),
            write("w2", 2, 9, 2),
            read("r1", 3, 4, 2, "w2", client="a"),
            read("r2", 5, 6, 1, "w1", client="b"),
        ],
        stored("w1", "w2"),
        "non-monotonic-read",
        False,
    ),
    "the same client reads older": (
        [
            write("w1", 0, 1, 1),
            write("w2", 2, 9, 2),
            read("r1", 3, 4, 2, "w2", client="a"),
            read("r2", 5, 6, 1, "w1", client="a"),
        ],
        stored("w1", "w2"),
        "non-monotonic-read",
        True,
    ),
    # A CAS expecting "no memory" may land over a forgotten version, not over a live one.
    "cas expecting 0 after a forget": (
        [write("w1", 0, 1, 1), op("c", "cas", 3, 4, version=3, value=w("c"), expected_version=0)],
        _forgotten_at(2.0, then="c"),
        "cas-violation",
        False,
    ),
    "cas expecting 0 over a live version": (
        [write("w1", 0, 1, 1), op("c", "cas", 3, 4, version=2, value=w("c"), expected_version=0)],
        stored("w1", "c"),
        "cas-violation",
        True,
    ),
    # A conflict reporting another version than the one expected is a real conflict.
    "a conflict with another version": (
        [
            write("w1", 0, 1, 1),
            op(
                "c",
                "cas",
                2,
                3,
                status="fail",
                value=w("c"),
                expected_version=1,
                version=2,
                error="VersionConflict",
            ),
        ],
        stored("w1"),
        "spurious-conflict",
        False,
    ),
    # Errors: MemoryUnavailable and a transient error inside the caller's own transaction are
    # expected; anything else reaching a caller is not.
    "MemoryUnavailable": (
        [write("w1", 0, 1, 1, status="info", error="MemoryUnavailable: down")],
        StoredKey(),
        "caller-error",
        False,
    ),
    "a deadlock inside the caller's transaction": (
        [
            write(
                "t",
                0,
                1,
                None,
                kind="txn-write",
                status="fail",
                error="Transient in the caller's transaction: (1213, 'Deadlock')",
            )
        ],
        StoredKey(),
        "caller-error",
        False,
    ),
    "a deadlock outside any transaction": (
        [write("w1", 0, 1, None, status="info", error="OperationalError: (1213, 'Deadlock')")],
        StoredKey(),
        "caller-error",
        True,
    ),
    # A prefix read may return keys that start with the prefix exactly.
    "prefix read of a matching key": (
        [write("w1", 0, 1, 1), read("r", 2, 3, 1, "w1", prefix="reg-")],
        stored("w1"),
        "prefix-read",
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(EXCUSES))
def test_each_excuse_on_both_sides(case):
    ops, state, check, flagged = EXCUSES[case]
    anomalies = found(ops, {(S, K): state} if state.rows else {})
    assert (anomalies[check] > 0) is flagged, anomalies


def test_a_search_score_is_recomputed_from_the_value_returned():
    from agentmemory.consistency.semantic import SCORE_TOLERANCE, expected_score

    right = expected_score("cat", texted("w1"))
    assert 0 < right < 1
    for score, flagged in [(right, 0), (right + SCORE_TOLERANCE / 2, 0), (right + 0.01, 1)]:
        ops, state = searched(score)
        assert found(ops, {(S, K): state})["search-score"] == flagged, score
    # A result whose value has no text to index cannot have been scored by it.
    ops, state = searched(right)
    ops[1].result = w("w1")
    assert found(ops, {(S, K): state})["search-score"] == 1


@pytest.mark.parametrize(
    ("status", "error", "anomalies"),
    [
        # A lost connection inside the caller's transaction (a node killed during the COMMIT, as
        # a Galera CI run showed): the write may have landed, and did -- no anomaly.
        ("info", "Transient in the caller's transaction: (2013, 'Lost connection')", Counter()),
        # A conflict there rolled the transaction back: a stored value of it is a phantom.
        (
            "fail",
            "Transient in the caller's transaction: (1213, 'Deadlock')",
            Counter({"phantom-write": 1}),
        ),
    ],
)
def test_a_transient_error_in_the_callers_transaction_is_judged_by_its_kind(
    status, error, anomalies
):
    ops = [
        write("w1", 0, 1, 1),
        op("t", "txn-write", 2, 3, status=status, value=w("t"), error=error),
    ]
    assert found(ops, {(S, K): stored("w1", "t")}) == anomalies


# A failover injected by the run: the primary crashed at 10, the standby answered from 20.
FAILOVER = Failover(crashed_at=10.0, promoted_at=20.0, timelines=("00000001", "00000002"))


def checks_across(ops, state, failovers=(FAILOVER,)):
    return Counter(a.check for a in check_history(History("r", list(ops)), state, failovers))


def test_a_write_the_failover_took_back_is_the_databases_loss_and_nothing_else():
    ops = [
        write("w1", 0, 1, 1),
        write("w2", 8, 9, 2),  # acknowledged 1 s before the crash; the standby never had it
        read("r1", 9, 9.5, 2, "w2"),  # right then
        write("w3", 21, 22, 2),  # the promoted database's own v2
        read("r2", 23, 24, 2, "w3"),
    ]
    state = {(S, K): stored("w1", "w3")}
    (anomaly,) = check_history(History("r", ops), state, [FAILOVER])
    assert anomaly.check == "lost-by-database"
    assert "v2 of w2" in anomaly.message and "timeline 1 -> 2" in anomaly.message
    assert "asynchronous replication" in anomaly.message
    # Without knowing of the failover, the same history is the store's fault.
    assert checks_across(ops, state, ())["lost-update"] >= 1


def test_a_read_after_the_failover_that_returns_a_lost_write_is_the_stores_fault():
    ops = [
        write("w1", 0, 1, 1),
        write("w2", 8, 9, 2),
        read("r3", 21, 21.5, 2, "w2"),  # served after the promotion: a cache that kept it
    ]
    found_checks = checks_across(ops, {(S, K): stored("w1")})
    assert found_checks["lost-by-database"] == 1 and found_checks["garbage-read"] == 1


def test_a_write_acknowledged_after_the_promotion_and_missing_is_a_lost_update():
    ops = [write("w1", 0, 1, 1), write("w4", 21, 22, 2)]
    assert checks_across(ops, {(S, K): stored("w1")}) == Counter({"lost-update": 1})


def test_a_write_the_crash_left_unanswered_and_the_failover_took_back_excuses_its_reads():
    """A write committed on the primary, its answer lost with the crash (``info``): another
    client read it before the crash, the standby never had it, and a read after the promotion
    returns the older version. Nothing was acknowledged, so nothing is the database's loss, but
    the read before the crash was judged against a state the database no longer shows: no
    anomaly either (a CI run on the HA cluster blamed the store's reads for such a one)."""
    ops = [
        write("w1", 0, 1, 1),
        op("w2", "remember", 9.8, None, status="info", value=w("w2"), error="MemoryUnavailable"),
        read("r1", 9.85, 9.9, 2, "w2", client="reader"),
        read("r2", 21, 21.5, 1, "w1", client="reader"),
    ]
    state = {(S, K): stored("w1")}
    assert checks_across(ops, state) == Counter()
    # Without knowing of the failover, the reader went back in time.
    assert checks_across(ops, state, ())["non-monotonic-read"] == 1


# A restore (memcheck's db-restore): a dump taken at 5, put back at 10; reads may show what it
# lost until 12 (the tier's bound).
RESTORE = Failover(10.0, 12.0, ("", ""), kind="restore", lost_after=5.0)


def test_a_write_a_restore_took_back_is_the_databases_loss_and_only_after_the_dump():
    ops = [
        write("w1", 0, 1, 1),
        write("w2", 6, 7, 2),  # after the dump: lost with the restore
        read("r1", 11, 11.5, 2, "w2"),  # within the bound: may still show it
        write("w3", 13, 14, 2),  # the restored database's own v2
        read("r2", 15, 16, 2, "w3"),
    ]
    (anomaly,) = check_history(History("r", ops), {(S, K): stored("w1", "w3")}, [RESTORE])
    assert anomaly.check == "lost-by-database" and "restored" in anomaly.message
    # A write acknowledged before the dump began is in the dump: missing, it is the store's.
    assert checks_across([write("w0", 3, 4, 1)], {}, [RESTORE])["lost-update"] == 1
    # A read after the bound that shows the lost write is the store's (its cache's).
    late = [write("w1", 0, 1, 1), write("w2", 6, 7, 2), read("r3", 12.5, 13, 2, "w2")]
    assert checks_across(late, {(S, K): stored("w1")}, [RESTORE])["garbage-read"] == 1


def test_a_retry_whose_first_call_the_restore_took_back_writes_again_and_is_no_phantom():
    """CI-like history on PostgreSQL: the first call of an idempotent write acknowledged v2 and
    was lost with the restore; its retry found no record of it and wrote v2 again, raising
    IdempotencyBroken. What it stored is the restore's consequence, not a phantom write."""
    ops = [
        write("w1", 0, 1, 1),
        write("t", 6, 7, 3, kind="retry"),  # acknowledged as v3, lost
        op(
            "t",
            "retry",
            10.5,
            10.6,
            status="fail",
            value=w("t"),
            error="IdempotencyBroken: the retry returned v2, the first call v3",
        ),
    ]
    state = {(S, K): stored("w1", "t")}
    assert set(checks_across(ops, state, [RESTORE])) == {"lost-by-database"}


def test_a_past_version_read_is_judged_against_that_version():
    """Asked for v1: v1 with its own value while it is live passes; another version, another
    value, or v1 once expired does not."""
    history = [
        write("w1", 0, 1, 1, ttl=4.0, expires_at=4.0),
        write("w2", 1, 2, 2),
    ]
    state = {(S, K): stored("w1", "w2", created=[0.0, 1.5], expires=[4.0, None])}

    def judged(read_op):
        return found([*history, read_op], state)["past-version-read"]

    assert judged(op("r", "version-read", 2, 3, version=1, expected_version=1, result=w("w1"))) == 0
    assert judged(op("r", "version-read", 5, 6, version=None, expected_version=1)) == 0  # None
    assert judged(op("r", "version-read", 2, 3, version=2, expected_version=1, result=w("w2"))) == 1
    assert judged(op("r", "version-read", 2, 3, version=1, expected_version=1, result=w("w2"))) == 1
    assert judged(op("r", "version-read", 5, 6, version=1, expected_version=1, result=w("w1"))) == 1


def test_a_paged_history_read_is_judged_against_the_history():
    history = [write("w1", 0, 1, 1), write("w2", 1, 2, 2), write("w3", 2, 3, 3)]
    state = {(S, K): stored("w1", "w2", "w3")}

    def judged(pages):
        return found([*history, op("h", "history-read", 4, 5, result=pages)], state)["history-page"]

    assert judged([[3, "w3"], [2, "w2"], [1, "w1"]]) == 0
    assert judged([[2, "w2"], [1, "w1"]]) == 0  # read before v3 was written
    assert judged([[3, "w3"], [1, "w1"]]) == 1  # a gap
    assert judged([[3, "w3"], [2, "w2"], [2, "w2"]]) == 1  # the bound repeated
    assert judged([[3, "w3"], [2, "w1"]]) == 1  # another version's value
