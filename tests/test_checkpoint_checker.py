"""The checkpoint checks on hand-made histories: a coherent history passes (conflicts, forks
asked for, writes saved twice), and each anomaly planted once is flagged by its check. No
database: the checks compare a history with a StoredChain snapshot."""

from collections import Counter
from types import SimpleNamespace

from agentmemory.consistency.checkpoints import StoredChain, check_checkpoints, thread_of
from agentmemory.consistency.history import Operation

S, K = "s", "cp-0"
THREAD = thread_of(S, K)


def op(id_, kind, t0, t1, *, status="ok", result=None, value=None, error=None, key=K):
    o = Operation(id_, f"c-{id_}", kind, S, key, t0, completed_at=t1, status=status)
    o.result, o.value, o.error = result, value, error
    return o


def step(id_, t0, t1, cid, parent, *, kind="cp-put", status="ok"):
    result = cid if status == "ok" else None
    return op(
        id_,
        kind,
        t0,
        t1,
        status=status,
        result=result,
        value={"id": cid, "parent": parent, "op": id_},
    )


def writes(id_, t0, t1, cid, count):
    return op(
        id_, "cp-writes", t0, t1, result=cid, value={"checkpoint": cid, "count": count, "op": id_}
    )


def chain(*steps, writes=()):
    """Stored checkpoints of ``steps`` (ops), and the pending writes ``(checkpoint, task, n)``."""
    stored = StoredChain()
    for o in steps:
        stored.checkpoints[o.value["id"]] = (o.value["parent"], o.id, o.id)
    for cid, task, count in writes:
        for i in range(count):
            stored.writes[f"{cid}|{task}|{i}"] = f"{task}.{i}"
    return stored


def checks(history, stored):
    return Counter(a.check for a in check_checkpoints(history, {THREAD: stored}))


A = step("a", 0, 1, "01", None)
B = step("b", 2, 3, "02", "01")


def test_a_coherent_history_passes():
    conflict = step("c", 2, 3.5, "03", "01", status="fail")
    conflict.error = "CheckpointConflict: ..."
    fork = step("f", 4, 5, "04", "01", kind="cp-fork")
    w = writes("w", 6, 7, "04", 2)
    read = op("r", "cp-read", 8, 9, result=["04", "01", "f", [["w", 0], ["w", 1]]])
    listing = op("l", "cp-list", 8, 9, result=["04", "02", "01"])
    stored = chain(A, B, fork, writes=[("04", "w", 2)])
    assert checks([A, B, conflict, fork, w, read, listing], stored) == Counter()


def test_two_steps_from_one_latest_checkpoint_are_a_silent_fork():
    twin = step("t", 2, 3, "03", "01")
    assert checks([A, B, twin], chain(A, B, twin)) == {"checkpoint-fork": 1}


def test_a_fork_asked_for_is_no_silent_fork():
    fork = step("f", 2, 3, "03", "01", kind="cp-fork")
    assert checks([A, B, fork], chain(A, B, fork)) == Counter()


def test_an_acknowledged_step_missing_or_a_failed_one_stored_is_flagged():
    failed = step("x", 4, 5, "05", "02", status="fail")
    failed.value = {"id": "05", "parent": "02", "op": "x"}
    assert checks([A, B], chain(A)) == {"checkpoint-write": 1}
    assert checks([A, B, failed], chain(A, B, failed)) == {"checkpoint-write": 1}


def test_a_lost_pending_write_is_flagged():
    w = writes("w", 4, 5, "02", 3)
    assert checks([A, B, w], chain(A, B, writes=[("02", "w", 2)])) == {"checkpoint-write": 1}


def test_writes_of_a_call_that_lost_its_answer_may_be_stored():
    # CI, PostgreSQL HA: put_writes committed, then the failover took the answer away.
    w = writes("w", 4, 5, "02", 2)
    w.status, w.result, w.error = "info", None, "MemoryUnavailable: ..."
    assert checks([A, B, w], chain(A, B, writes=[("02", "w", 2)])) == Counter()
    assert checks([A, B, w], chain(A, B)) == Counter()  # or not
    assert checks([A, B, w], chain(A, B, writes=[("01", "w", 2)])) == {"checkpoint-write": 2}


def test_a_read_older_than_an_acknowledged_step_or_missing_writes_is_flagged():
    stale = op("r", "cp-read", 4, 5, result=["01", None, "a", []])
    assert checks([A, B, stale], chain(A, B)) == {"checkpoint-read": 1}
    w = writes("w", 4, 5, "02", 1)
    without = op("r2", "cp-read", 6, 7, result=["02", "01", "b", []])
    assert checks([A, B, w, without], chain(A, B, writes=[("02", "w", 1)])) == {
        "checkpoint-read": 1
    }


def test_a_listing_that_skips_an_acknowledged_checkpoint_is_flagged():
    listing = op("l", "cp-list", 4, 5, result=["01"])
    assert checks([A, B, listing], chain(A, B)) == {"checkpoint-list": 1}
    unordered = op("l2", "cp-list", 4, 5, result=["01", "02"])
    assert checks([A, B, unordered], chain(A, B)) == {"checkpoint-list": 1}


def test_a_thread_deleted_that_still_holds_checkpoints_is_flagged():
    delete = op("d", "cp-delete", 0, 1)
    left = {thread_of(S, "cp-del-c-d"): StoredChain(checkpoints={"09": (None, "d", "d")})}
    found = check_checkpoints([delete], left)
    assert [a.check for a in found] == ["checkpoint-delete"]
    assert check_checkpoints([delete], {}) == []


def test_after_a_failover_a_delete_that_met_its_own_lost_checkpoint_is_the_databases():
    # CI, MariaDB pair: the delete's first checkpoint was acknowledged by the old primary and
    # lost with it, so its second put -- on a thread no other client writes -- conflicted.
    failed = op("d", "cp-delete", 0, 6, status="fail", error="CheckpointConflict: ...")
    left = {thread_of(S, "cp-del-c-d"): StoredChain(checkpoints={"09": (None, "d", "d")})}
    failover = SimpleNamespace(promoted_at=5.0, crashed_at=4.0)
    assert [a.check for a in check_checkpoints([failed], {}, [failover])] == ["lost-by-database"]
    kept = op("d", "cp-delete", 0, 1)
    assert [a.check for a in check_checkpoints([kept], left, [failover])] == ["lost-by-database"]
    # After the promotion, the same outcomes are the store's.
    late = SimpleNamespace(promoted_at=-1.0, crashed_at=-2.0)
    assert [a.check for a in check_checkpoints([failed], {}, [late])] == ["checkpoint-delete"]
    assert [a.check for a in check_checkpoints([kept], left, [late])] == ["checkpoint-delete"]
