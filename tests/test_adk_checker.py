"""The ADK checks on hand-made histories: a coherent history passes (refused appends, appends sent
twice, reads that raced an append), and each anomaly planted once is flagged by its check. No
database: the checks compare a history with a StoredApp snapshot."""

from collections import Counter
from types import SimpleNamespace

from agentmemory.consistency.adk import StoredApp, check_adk, slot
from agentmemory.consistency.history import Operation

APP, SID = "app", "adk-0"


def append(id_, t0, t1, delta, *, status="ok", sid=SID):
    o = Operation(id_, f"c-{id_}", "adk-append", APP, sid, t0, completed_at=t1, status=status)
    o.value = {"op": id_, "delta": {name: {"op": id_} for name in delta}}
    if status == "fail":
        o.error = "StaleAppend: ..."
    return o


def get(id_, t0, t1, events, state, *, sid=SID):
    o = Operation(id_, f"c-{id_}", "adk-get", APP, sid, t0, completed_at=t1, status="ok")
    o.result = None if events is None else {"events": events, "state": state}
    return o


def stored(*appends, versions=None, counts=None):
    """The database after ``appends`` (ops, in log order, each session's own): every change of
    each, folded -- ``versions`` overrides slots."""
    app = StoredApp()
    for a in appends:
        app.events.setdefault(a.key, []).append(a.id)
        for name in a.value["delta"]:
            app.versions.setdefault(slot(a.key, name), []).append(a.id)
    app.versions.update(versions or {})
    app.live = {where: tokens[-1] for where, tokens in app.versions.items() if tokens}
    app.counts = {
        where: list(range(1, len(tokens) + 1))
        for where, tokens in app.versions.items()
        if where.endswith(" n")
    }
    app.counts.update(counts or {})
    return app


def found(ops, app, failovers=()):
    return Counter(a.check for a in check_adk(ops, {APP: app}, failovers))


A = append("a", 0, 1, ["n", "s0", "app:a0"])
B = append("b", 2, 3, ["n", "s1", "user:u0"])
C = append("c", 4, 5, ["n", "s0"], sid="adk-1")


def test_a_coherent_history_passes():
    refused = append("r", 2, 3.5, ["n", "s0"], status="fail")
    racing = get("g", 2.5, 3.2, ["a", "b"], {"n": "b", "s0": "a", "s1": "b", "app:a0": "a"})
    before = get("g0", 0.5, 0.9, None, {})  # no session yet: the append had not been answered
    ops = [A, B, C, refused, racing, before]
    assert found(ops, stored(A, B, C)) == Counter()
    # A read that began before B's answer may miss it; its state is the fold of its events'
    # prefix it read first.
    early = get("e", 2.5, 3.2, ["a"], {"n": "a", "s0": "a", "app:a0": "a"})
    assert found([A, B, early], stored(A, B)) == Counter()


def test_an_event_whose_state_change_is_not_stored_is_flagged():
    dropped = stored(A, B, versions={f"{SID} s1": []})
    assert found([A, B], dropped) == {"adk-state": 1}


def test_a_refused_append_that_wrote_is_flagged():
    refused = append("r", 2, 3.5, ["n"], status="fail")
    assert found([A, refused], stored(A, refused)) == {"adk-event": 1}
    # Its state change alone.
    half = stored(A, versions={f"{SID} n": ["a", "r"]}, counts={f"{SID} n": [1, 2]})
    assert found([A, refused], half) == {"adk-state": 1}


def test_an_acknowledged_append_not_stored_is_flagged_or_the_databases_after_a_failover():
    assert found([A, B], stored(A)) == {"adk-event": 1}
    failover = SimpleNamespace(promoted_at=2.5, crashed_at=2.2)
    assert found([A, B], stored(A), [failover]) == {"lost-by-database": 1}


def test_an_event_stored_twice_or_out_of_order_is_flagged():
    twice = stored(A, B)
    twice.events[SID].append("b")
    assert found([A, B], twice)["adk-event"] == 1
    swapped = stored(A, B)
    swapped.events[SID] = ["b", "a"]
    assert found([A, B], swapped)["adk-event"] == 1


def test_a_lost_increment_is_flagged():
    lost = stored(A, B, counts={f"{SID} n": [1, 1]})
    assert found([A, B], lost) == {"adk-state": 1}


def test_state_versions_out_of_the_events_order_are_flagged():
    both = append("b2", 2, 3, ["s0"])
    shuffled = stored(A, both, versions={f"{SID} s0": ["b2", "a"]})
    assert found([A, both], shuffled) == {"adk-state": 1}


def test_a_stored_temp_key_is_flagged():
    leaked = stored(A, versions={f"{SID} temp:t": ["a"]})
    assert found([A], leaked) == {"adk-state": 1}


def test_a_read_that_misses_an_acknowledged_event_or_folds_wrong_is_flagged():
    stale = get("g", 4, 5, ["a"], {"n": "a", "s0": "a", "app:a0": "a"})
    assert found([A, B, stale], stored(A, B)) == {"adk-read": 1}
    wrong = get(
        "g", 4, 5, ["a", "b"], {"n": "a", "s0": "a", "s1": "b", "app:a0": "a", "user:u0": "b"}
    )
    assert found([A, B, wrong], stored(A, B)) == {"adk-read": 1}
    gone = get("g", 4, 5, None, {})
    assert found([A, gone], stored(A)) == {"adk-read": 1}
    old_app = append("a2", 2, 3, ["app:a0"], sid="adk-1")
    shared = get("g", 4, 5, ["a"], {"n": "a", "s0": "a", "app:a0": "a"})
    assert found([A, old_app, shared], stored(A, old_app)) == {"adk-read": 1}


def test_reads_before_a_failovers_promotion_are_not_judged():
    stale = get("g", 4, 5, ["a"], {"n": "a", "s0": "a", "app:a0": "a"})
    failover = SimpleNamespace(promoted_at=6.0, crashed_at=5.5)
    assert found([A, B, stale], stored(A, B), [failover]) == Counter()
