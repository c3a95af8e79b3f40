"""The log checks on hand-made histories: a coherent history passes (indeterminate appends,
windows and clears included), and each anomaly planted once is flagged by its check. No database:
the checks compare a history with a StoredLog snapshot."""

from collections import Counter
from types import SimpleNamespace

import pytest

from agentmemory.consistency.history import Operation
from agentmemory.consistency.logs import StoredLog, check_logs

S, L = "s", "log-0"


def item(token):
    return {"op": token, "s": S, "k": L}


def op(id_, kind, t0, t1, *, status="ok", result=None, value=None, client=None, **extra):
    o = Operation(id_, client or f"c-{id_}", kind, S, L, t0, completed_at=t1, status=status)
    o.result, o.value = result, value
    if kind != "log-read":
        o.idempotency_key = id_
    for name, v in extra.items():
        setattr(o, name, v)
    return o


def append(id_, t0, t1, seqs, *, n=None, status="ok", **kw):
    count = n or len(seqs)
    items = [item(f"{id_}.{i}") for i in range(count)]
    return op(id_, "log-append", t0, t1, status=status, value=items, result=seqs, **kw)


def pop(id_, t0, t1, seq, token, **kw):
    return op(id_, "log-pop", t0, t1, result=[seq, token], **kw)


def read(id_, t0, t1, *items, window=None, **kw):
    return op(
        id_, "log-read", t0, t1, result=[list(i) for i in items], expected_version=window, **kw
    )


def log(*tokens, popped=None, cleared=(), events=None):
    """A stream holding ``tokens`` at 1, 2, ...; ``popped``: {seq: (event version, pop id)};
    ``cleared``: (first, last, event version, clear id); events: the append events first."""
    popped = popped or {}
    stored = StoredLog(heads=1, last_seq=len(tokens))
    stored.items = {
        i + 1: (t, popped[i + 1][0] if i + 1 in popped else None) for i, t in enumerate(tokens)
    }
    stored.events = dict(events or {})
    for seq, (version, by) in popped.items():
        stored.events[version] = ("pop", seq, seq, 1, f"k:{by}")
    for first, last, version, by in cleared:
        stored.events[version] = ("clear", first, last, last - first + 1, f"k:{by}")
        stored.cleared_through = last
    for version in range(1, max(stored.events, default=0) + 1):
        stored.events.setdefault(version, ("append", 1, 1, 1, f"k:a{version}"))
    stored.version = len(stored.events)
    stored.length = sum(
        1
        for seq, (_t, removed) in stored.items.items()
        if seq > stored.cleared_through and removed is None
    )
    return stored


def found(ops, stored, failovers=()):
    return Counter(a.check for a in check_logs(ops, {(S, L): stored}, failovers))


def coherent():
    """a1 appends #1, a2 a batch #2-#3, p1 pops #3, a read between, a window read, a clear."""
    ops = [
        append("a1", 0, 1, [1]),
        append("a2", 2, 3, [2, 3]),
        read("r1", 4, 5, (1, "a1.0"), (2, "a2.0"), (3, "a2.1")),
        pop("p1", 6, 7, 3, "a2.1"),
        read("r2", 8, 9, (1, "a1.0"), (2, "a2.0"), client="c-r1"),
        read("r3", 8, 9, (1, "a1.0"), (2, "a2.0"), window=3),
        op("c1", "log-clear", 10, 11, result=2),
        read("r4", 12, 13, client="c-r1"),
    ]
    stored = log("a1.0", "a2.0", "a2.1", popped={3: (3, "p1")}, cleared=[(1, 2, 4, "c1")])
    return ops, stored


def test_a_coherent_history_passes():
    assert found(*coherent()) == Counter()


def test_an_indeterminate_append_may_apply_or_not_but_all_or_nothing():
    ops = [append("a1", 0, 1, None, n=2, status="info", error="MemoryUnavailable: gone")]
    assert found(ops, log()) == Counter()
    assert found(ops, log("a1.0", "a1.1")) == Counter()
    assert found(ops, log("a1.0")) == Counter({"log-append": 1})


def test_a_read_may_miss_what_is_removed_while_it_runs():
    ops = [
        append("a1", 0, 1, [1]),
        pop("p1", 2, 4, 1, "a1.0"),
        read("r1", 3, 5),  # the pop was invoked before the read ended: either answer is right
    ]
    assert found(ops, log("a1.0", popped={1: (2, "p1")})) == Counter()


CASES = {
    "log-append": [
        # acknowledged, not stored
        ([append("a1", 0, 1, [1])], log()),
        # stored twice
        ([append("a1", 0, 1, [1])], log("a1.0", "a1.0")),
        # a failed batch left its first item
        ([append("a1", 0, 1, None, n=2, status="fail", error="InjectedFailure")], log("a1.0")),
        # acknowledged at other numbers than stored
        ([append("a0", 0, 1, [1]), append("a1", 0, 1, [1])], log("a0.0", "a1.0")),
        # an item no call appended
        ([], log("nobody.0")),
    ],
    "log-sequence": [
        # a gap: the head says 3, items 1 and 3
        ([], SimpleNamespace(gap=True)),
        # the head's count is off
        ([], SimpleNamespace(length=5)),
    ],
    "log-pop": [
        # two pops returned the same item
        (
            [append("a1", 0, 1, [1]), pop("p1", 2, 3, 1, "a1.0"), pop("p2", 2, 3, 1, "a1.0")],
            log("a1.0", popped={1: (2, "p2")}),
        ),
        # a pop returned an item that is still live
        ([append("a1", 0, 1, [1]), pop("p1", 2, 3, 1, "a1.0")], log("a1.0")),
    ],
    "log-read": [
        # out of order
        (
            [append("a1", 0, 1, [1, 2]), read("r", 2, 3, (2, "a1.1"), (1, "a1.0"))],
            log("a1.0", "a1.1"),
        ),
        # an item popped by a pop acknowledged before the read began
        (
            [append("a1", 0, 1, [1]), pop("p1", 2, 3, 1, "a1.0"), read("r", 4, 5, (1, "a1.0"))],
            log("a1.0", popped={1: (2, "p1")}),
        ),
        # an acknowledged item left out, never removed
        ([append("a1", 0, 1, [1]), read("r", 2, 3)], log("a1.0")),
        # a window that leaves out the newest item
        (
            [
                append("a1", 0, 1, [1, 2, 3, 4]),
                read("r", 2, 3, (1, "a1.0"), (2, "a1.1"), (3, "a1.2"), window=3),
            ],
            log("a1.0", "a1.1", "a1.2", "a1.3"),
        ),
        # garbage: #1 as it is not stored
        ([append("a1", 0, 1, [1]), read("r", 2, 3, (1, "other"))], log("a1.0")),
        # the same client reads #1, then a read without it, nothing having removed it (its
        # append was acknowledged only after the second read began)
        (
            [
                append("a1", 0, 4, [1]),
                read("r1", 1, 2, (1, "a1.0"), client="c"),
                read("r2", 3, 5, client="c"),
            ],
            log("a1.0"),
        ),
    ],
}


@pytest.mark.parametrize(
    ("check", "case"),
    [(check, i) for check, cases in CASES.items() for i in range(len(cases))],
)
def test_each_planted_anomaly_is_flagged(check, case):
    ops, stored = CASES[check][case]
    if isinstance(stored, SimpleNamespace):  # a broken head over a coherent history
        ops, good = coherent()
        good.length = getattr(stored, "length", good.length)
        if getattr(stored, "gap", False):
            del good.items[2]
        stored = good
    flagged = found(ops, stored)
    assert flagged[check] >= 1, flagged


def test_after_a_failover_a_lost_append_is_the_databases():
    ops = [append("a1", 0, 1, [1]), read("r", 2, 3, (1, "a1.0"))]
    failover = SimpleNamespace(promoted_at=5.0, crashed_at=4.0)
    assert found(ops, log(), [failover]) == Counter({"lost-by-database": 1})
    assert found(ops, log()) == Counter({"log-append": 1, "log-read": 1})


def test_after_a_failover_a_retry_that_wrote_again_is_the_databases():
    """CI, MariaDB pair: a log-retry's first call was stored at #3 by the old primary and lost
    with it; its retry, after the promotion, found no earlier write and appended again at #2 --
    the workload's RetryAnsweredDifferently, a new request the database's loss made."""
    retry = append("t", 0, 6, [2], status="fail")
    retry.kind, retry.result = "log-retry", None
    retry.error = "RetryAnsweredDifferently: the retry returned [2], the first call [3]"
    ops = [append("a1", 0, 1, [1]), retry]
    stored = log("a1.0", "t.0")
    failover = SimpleNamespace(promoted_at=5.0, crashed_at=4.0)
    assert found(ops, stored, [failover]) == Counter()
    assert found(ops, stored)["log-append"] >= 1  # without the failover: the store's


def test_after_a_failover_a_lost_pop_is_the_databases_and_its_item_may_be_popped_again():
    """A pop acknowledged before the crash, lost with the primary: the item is live again on the
    promoted standby, and a pop after the promotion returns it again -- the database's loss, not
    two pops of one item."""
    ops = [
        append("a1", 0, 1, [1]),
        pop("p1", 2, 3, 1, "a1.0"),  # lost in the failover at 4
        pop("p2", 6, 7, 1, "a1.0"),
    ]
    failover = SimpleNamespace(promoted_at=5.0, crashed_at=4.0)
    stored = log("a1.0", popped={1: (2, "p2")})
    assert found(ops, stored, [failover]) == Counter({"lost-by-database": 1})
    assert found(ops, stored) == Counter({"log-pop": 2})  # without the failover: a double pop


# The SDK session's calls (memcheck's sdk-session workload): no idempotency key, no item numbers
# in what they return -- the checks find the numbers by token and tie a pop to its event.


def sdk(id_, kind, t0, t1, *, result=None, value=None, **kw):
    o = op(id_, kind, t0, t1, result=result, value=value, **kw)
    o.idempotency_key = None
    return o


def sdk_add(id_, t0, t1, n=1, **kw):
    return sdk(id_, "sdk-add", t0, t1, value=[item(f"{id_}.{i}") for i in range(n)], **kw)


def sdk_log(*tokens, popped=None, cleared=()):
    """As ``log``, the events made by calls without a key of the workload's (request ids
    ``r:…``, as the store gives them)."""
    stored = log(*tokens, popped=popped, cleared=cleared)
    stored.events = {
        version: (kind, first, last, count, "r:" + request[2:])
        for version, (kind, first, last, count, request) in stored.events.items()
    }
    return stored


def sdk_coherent():
    ops = [
        sdk_add("a1", 0, 1),
        sdk_add("a2", 2, 3, n=2),
        sdk("g1", "sdk-get", 4, 5, result=[[0, "a1.0"], [0, "a2.0"], [0, "a2.1"]]),
        sdk("p1", "sdk-pop", 6, 7, result=[0, "a2.1"]),
        sdk("g2", "sdk-get", 8, 9, result=[[0, "a1.0"], [0, "a2.0"]], client="c-g1"),
        sdk("g3", "sdk-get", 8, 9, result=[[0, "a2.0"]], expected_version=1),
        sdk("c1", "sdk-clear", 10, 11),
        sdk("g4", "sdk-get", 12, 13, result=[], client="c-g1"),
        sdk("p2", "sdk-pop", 14, 15, result=None),
    ]
    stored = sdk_log("a1.0", "a2.0", "a2.1", popped={3: (3, "p1")}, cleared=[(1, 2, 4, "c1")])
    return ops, stored


def test_a_coherent_sdk_session_history_passes():
    assert found(*sdk_coherent()) == Counter()


def test_an_sdk_pop_that_keeps_its_item_is_flagged():
    """The self-test's sdk-pop-keeps-item: pop_item returns the latest item, removes nothing."""
    ops = [sdk_add("a1", 0, 1), sdk("p1", "sdk-pop", 2, 3, result=[0, "a1.0"])]
    flagged = check_logs(ops, {(S, L): sdk_log("a1.0")})
    assert [(a.check, a.message) for a in flagged] == [
        ("log-pop", "pop returned #1, which is still live")
    ]


def test_two_sdk_pops_of_one_item_are_flagged():
    ops = [
        sdk_add("a1", 0, 1),
        sdk("p1", "sdk-pop", 2, 4, result=[0, "a1.0"]),
        sdk("p2", "sdk-pop", 3, 5, result=[0, "a1.0"]),
    ]
    assert found(ops, sdk_log("a1.0", popped={1: (2, "p1")}))["log-pop"] >= 1


@pytest.mark.parametrize(
    "ops, stored",
    [
        # an acknowledged add_items that is not stored
        ([sdk_add("a1", 0, 1, n=2)], sdk_log("a1.0")),
        # stored out of its order
        ([sdk_add("a1", 0, 1, n=2)], sdk_log("a1.1", "a1.0")),
    ],
)
def test_an_sdk_add_lost_or_reordered_is_flagged(ops, stored):
    assert found(ops, stored)["log-append"] >= 1


@pytest.mark.parametrize(
    "result",
    [
        [[0, "a1.0"]],  # leaves out a2.0, acknowledged before the read began
        [[0, "a2.0"], [0, "a1.0"]],  # out of order
        [[0, "nobody.0"], [0, "a1.0"], [0, "a2.0"]],  # an item nobody stored
    ],
)
def test_an_sdk_get_that_misses_reorders_or_invents_is_flagged(result):
    ops = [sdk_add("a1", 0, 1), sdk_add("a2", 2, 3), sdk("g", "sdk-get", 4, 5, result=result)]
    assert found(ops, sdk_log("a1.0", "a2.0"))["log-read"] >= 1


def test_after_a_failover_an_sdk_get_may_hold_what_the_database_lost():
    """An add acknowledged before the crash, read, then lost with the primary: its token is
    stored nowhere (no number), which is the database's loss -- not a read out of order."""
    ops = [
        sdk_add("a1", 0, 1),
        sdk_add("a2", 2, 3),
        sdk("g1", "sdk-get", 3.5, 3.8, result=[[0, "a1.0"], [0, "a2.0"]]),
        sdk("g2", "sdk-get", 6, 7, result=[[0, "a1.0"]]),
    ]
    failover = SimpleNamespace(promoted_at=5.0, crashed_at=4.0)
    assert found(ops, sdk_log("a1.0"), [failover]) == Counter({"lost-by-database": 1})
    # after the promotion, an item the database does not hold is the store's
    late = [*ops, sdk("g3", "sdk-get", 8, 9, result=[[0, "a1.0"], [0, "a2.0"]])]
    assert found(late, sdk_log("a1.0"), [failover])["log-read"] == 1


def test_after_a_failover_a_lost_sdk_pop_is_the_databases_and_its_item_may_be_popped_again():
    """As for the log's own pops, with the pop event tied by the item it removed: the pop after
    the promotion made the event that holds the item removed, the one before was lost."""
    ops = [
        sdk_add("a1", 0, 1),
        sdk("p1", "sdk-pop", 2, 3, result=[0, "a1.0"]),  # lost in the failover at 4
        sdk("p2", "sdk-pop", 6, 7, result=[0, "a1.0"]),
    ]
    failover = SimpleNamespace(promoted_at=5.0, crashed_at=4.0)
    stored = sdk_log("a1.0", popped={1: (2, "p2")})
    assert found(ops, stored, [failover]) == Counter({"lost-by-database": 1})
    assert found(ops, stored)["log-pop"] >= 1  # without the failover: a double pop
