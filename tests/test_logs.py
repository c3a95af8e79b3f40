"""Semantics 14: logs -- per (session_id, stream) an append-only sequence 1, 2, 3, ... with no gap
or reuse; an acknowledged append is present exactly once and in order; a retried append writes
nothing more; two pops never return the same item; every read is a prefix of what the log later
holds. On every database, threads and processes."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection

from agentmemory import InvalidMemory, LogOp, MemoryStore, ReentrantWrite, clock
from agentmemory.defects import lose_commit_answer
from agentmemory.models import Log, LogEvent, LogItem

from .conftest import redis_alias, run_threads
from .helpers import analyze, inject_errors, rows_examined, run_processes
from .test_retries import conflict_error

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store() -> MemoryStore:
    """Logs are read from the database whatever the tier (the Redis tier serves memories only):
    one store per test; test_the_redis_tier_changes_nothing_of_a_log runs with the tier."""
    return MemoryStore(cache=None)


def test_the_redis_tier_changes_nothing_of_a_log():
    store = MemoryStore(cache=redis_alias())
    store.remember("s", "k", 1)
    store.append("s", "chat", ["a", "b"])
    assert store.pop("s", "chat").value == "b"
    assert [i.value for i in store.read_log("s", "chat")] == ["a"]
    assert store.log_length("s", "chat") == 1
    assert store.erase_session("s") == 2
    assert store.recall("s", "k") is None and store.read_log("s", "chat") == []


def values(items):
    return [item.value for item in items]


def seqs(items):
    return [item.seq for item in items]


# ---------------------------------------------------------------------- the sequence


def test_appends_are_numbered_from_one_with_no_gap(store):
    first = store.append("s", "chat", [{"role": "user", "content": "hi"}])
    more = store.append("s", "chat", ["a", "b", "c"])
    assert seqs(first) == [1] and seqs(more) == [2, 3, 4]
    assert values(store.read_log("s", "chat")) == [{"role": "user", "content": "hi"}, "a", "b", "c"]
    assert store.log_length("s", "chat") == 4


def test_a_popped_number_is_never_given_again(store):
    store.append("s", "chat", ["a", "b"])
    assert store.pop("s", "chat").seq == 2
    assert seqs(store.append("s", "chat", ["c"])) == [3]
    assert [(i.seq, i.value) for i in store.read_log("s", "chat")] == [(1, "a"), (3, "c")]


def test_a_cleared_log_goes_on_counting(store):
    store.append("s", "chat", ["a", "b"])
    assert store.clear_log("s", "chat") == 2
    assert store.read_log("s", "chat") == [] and store.log_length("s", "chat") == 0
    assert seqs(store.append("s", "chat", ["c"])) == [3]
    assert values(store.read_log("s", "chat")) == ["c"]


def test_pop_returns_the_last_item_and_removes_only_it(store):
    store.append("s", "chat", ["a", "b", "c"])
    popped = store.pop("s", "chat")
    assert (popped.seq, popped.value) == (3, "c")
    assert values(store.read_log("s", "chat")) == ["a", "b"]
    assert store.log_length("s", "chat") == 2


def test_pop_and_clear_of_an_empty_or_missing_log(store):
    assert store.pop("s", "nothing") is None
    assert store.clear_log("s", "nothing") == 0
    store.append("s", "one", ["a"])
    store.pop("s", "one")
    assert store.pop("s", "one") is None
    assert not Log.objects.filter(stream="nothing").exists()


def test_an_empty_append_writes_nothing(store):
    assert store.append("s", "chat", []) == []
    assert not Log.objects.exists()


def test_items_keep_their_order_whatever_their_timestamps(store):
    """Order is the sequence number's, never a timestamp's: items appended together share one
    instant, and with the clock stepped back (NTP) later items carry earlier times."""
    for i in range(20):
        store.append("s", "chat", [f"{i}a", f"{i}b"])
        clock.advance(timedelta(seconds=-1))
    items = store.read_log("s", "chat")
    assert values(items) == [f"{i}{x}" for i in range(20) for x in "ab"]
    assert items[0].created_at == items[1].created_at > items[2].created_at


def test_values_come_back_as_fresh_copies(store):
    item = {"content": ["x"]}
    (appended,) = store.append("s", "chat", [item])
    item["content"].append("changed by the caller")
    appended.value["content"].append("changed too")
    assert store.read_log("s", "chat")[0].value == {"content": ["x"]}


# ---------------------------------------------------------------------- reads


def test_read_latest_n_and_keyset_pages(store):
    store.append("s", "chat", list(range(1, 11)))  # items 1..10 hold their own numbers
    assert values(store.read_log("s", "chat", limit=3)) == [8, 9, 10]
    assert values(store.read_log("s", "chat", limit=3, before=8)) == [5, 6, 7]
    assert values(store.read_log("s", "chat", after=7)) == [8, 9, 10]
    assert values(store.read_log("s", "chat", after=2, limit=3)) == [3, 4, 5]
    assert values(store.read_log("s", "chat", after=2, before=6)) == [3, 4, 5]
    assert store.read_log("s", "chat", limit=0) == []
    assert values(store.read_log("s", "chat", limit=100)) == list(range(1, 11))


def test_pages_walk_the_whole_log_backwards(store):
    store.append("s", "chat", list(range(1, 101)))
    store.pop("s", "chat")
    seen, before = [], None
    while page := store.read_log("s", "chat", limit=7, before=before):
        seen = values(page) + seen
        before = page[0].seq
    assert seen == list(range(1, 100))


def test_logs_of_other_streams_and_sessions_are_apart(store):
    store.append("s", "chat", ["mine"])
    store.append("s", "chat_", ["other stream"])
    store.append("s%", "chat", ["other session"])
    store.append("t", "chat", ["t's"])
    assert values(store.read_log("s", "chat")) == ["mine"]
    store.clear_log("s", "chat")
    assert values(store.read_log("s", "chat_")) == ["other stream"]
    assert values(store.read_log("s%", "chat")) == ["other session"]
    assert store.log_length("t", "chat") == 1
    assert store.erase_session("s") == 2
    assert values(store.read_log("s%", "chat")) == ["other session"]
    assert values(store.read_log("t", "chat")) == ["t's"]


# ---------------------------------------------------------------------- history


def test_every_mutation_is_an_event(store):
    store.append("s", "chat", ["a", "b"])
    store.pop("s", "chat")
    store.append("s", "chat", ["c"])
    store.clear_log("s", "chat")
    events = store.log_history("s", "chat")
    assert [(e.version, e.op, e.first_seq, e.last_seq, e.count) for e in events] == [
        (1, LogOp.APPEND, 1, 2, 2),
        (2, LogOp.POP, 2, 2, 1),
        (3, LogOp.APPEND, 3, 3, 1),
        (4, LogOp.CLEAR, 1, 3, 2),
    ]
    page = store.log_history("s", "chat", limit=2)
    assert [e.version for e in page] == [4, 3]
    assert [e.version for e in store.log_history("s", "chat", limit=2, before_version=3)] == [2, 1]


def test_erase_session_deletes_logs_items_and_events(store):
    store.append("s", "chat", ["a"])
    store.remember("s", "k", 1)
    assert store.erase_session("s") == 2
    assert not (Log.objects.exists() or LogItem.objects.exists() or LogEvent.objects.exists())
    assert store.log_history("s", "chat") == []


# ---------------------------------------------------------------------- TTL


def test_a_log_expires_as_a_whole_and_each_append_sets_the_expiry_anew(store):
    store.append("s", "chat", ["a"], ttl=60)
    clock.advance(timedelta(seconds=50))
    store.append("s", "chat", ["b"], ttl=60)
    clock.advance(timedelta(seconds=50))  # 100 s after "a", 50 after "b"
    assert values(store.read_log("s", "chat")) == ["a", "b"]
    store.append("s", "other", ["x"], ttl=1)  # another log's TTL: not this one's
    clock.advance(timedelta(seconds=2))
    assert values(store.read_log("s", "chat")) == ["a", "b"]
    assert store.read_log("s", "other") == [] and store.log_length("s", "other") == 0
    assert store.pop("s", "other") is None


def test_an_expired_log_is_an_event_before_the_next_append(store):
    store.append("s", "chat", ["a", "b"], ttl=1)
    clock.advance(timedelta(seconds=2))
    assert seqs(store.append("s", "chat", ["c"])) == [3]
    assert values(store.read_log("s", "chat")) == ["c"]
    ops = [(e.op, e.count) for e in store.log_history("s", "chat")]
    assert ops == [(LogOp.APPEND, 2), (LogOp.EXPIRE, 2), (LogOp.APPEND, 1)]


def test_purge_expired_records_the_expiry_of_logs(store):
    store.append("s", "gone", ["a"], ttl=1)
    store.append("s", "kept", ["b"])
    store.remember("s", "k", 1, ttl=1)
    clock.advance(timedelta(seconds=2))
    assert store.purge_expired() == 2  # the memory and the log
    assert [e.op for e in store.log_history("s", "gone")] == [LogOp.APPEND, LogOp.EXPIRE]
    assert values(store.read_log("s", "kept")) == ["b"]
    assert store.purge_expired() == 0


# ---------------------------------------------------------------------- idempotency, retries


def test_a_retried_append_returns_the_first_and_appends_nothing(store):
    first = store.append("s", "chat", ["a", "b"], idempotency_key="turn-1")
    store.append("s", "chat", ["c"])
    again = store.append("s", "chat", ["a", "b"], idempotency_key="turn-1")
    assert seqs(again) == seqs(first) == [1, 2] and values(again) == ["a", "b"]
    assert store.log_length("s", "chat") == 3


def test_a_retried_pop_returns_what_the_first_popped(store):
    store.append("s", "chat", ["a", "b"])
    first = store.pop("s", "chat", idempotency_key="undo-1")
    again = store.pop("s", "chat", idempotency_key="undo-1")
    assert first.seq == again.seq == 2
    assert values(store.read_log("s", "chat")) == ["a"]


def test_an_append_whose_commit_answer_was_lost_is_stored_once(store):
    """The commit lands but its answer is lost (a node dies during COMMIT): the retry finds the
    append's event by its request id and returns those items, appending nothing more."""
    with lose_commit_answer():
        appended = store.append("s", "chat", ["a", "b"])
    assert seqs(appended) == [1, 2]
    assert values(store.read_log("s", "chat")) == ["a", "b"]
    assert len(store.log_history("s", "chat")) == 1
    assert store.retries["disconnect"] == 1


def test_a_pop_whose_commit_answer_was_lost_pops_once(store):
    store.append("s", "chat", ["a", "b"])
    with lose_commit_answer():
        popped = store.pop("s", "chat")
    assert popped.value == "b"
    assert values(store.read_log("s", "chat")) == ["a"]


def test_a_conflict_mid_append_is_retried_as_a_whole(store):
    """The second statement that inserts items fails with this database's conflict error:
    the whole append runs again, and the log holds its items once."""
    store.append("s", "chat", ["before"])
    inserts = [0]

    def on_the_item_insert(_number, sql):
        if "logitem" in sql.lower() and sql.lstrip().upper().startswith("INSERT"):
            inserts[0] += 1
            return inserts[0] == 1
        return False

    with inject_errors(conflict_error, when=on_the_item_insert) as hit:
        appended = store.append("s", "chat", ["a", "b"])
    assert hit and seqs(appended) == [2, 3]
    assert values(store.read_log("s", "chat")) == ["before", "a", "b"]


def test_a_write_from_inside_an_update_is_refused(store):
    def fn(old):
        store.append("s", "chat", ["inner"])
        return 1

    with pytest.raises(ReentrantWrite):
        store.update("s", "k", fn)
    assert store.read_log("s", "chat") == []


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.append("", "chat", ["a"]), "session_id"),
        (lambda s: s.append("s", "", ["a"]), "stream"),
        (lambda s: s.append("s", "x" * 256, ["a"]), "stream"),
        (lambda s: s.append("s", "chat\x00", ["a"]), "stream"),
        (lambda s: s.append("s", "chat", "abc"), "items"),
        (lambda s: s.append("s", "chat", {"a": 1}), "items"),
        (lambda s: s.append("s", "chat", ["ok", float("nan")]), "items[1]"),
        (lambda s: s.append("s", "chat", ["ok", {1: "x"}]), "items[1]"),
        (lambda s: s.append("s", "chat", ["a"], ttl=0), "ttl"),
        (lambda s: s.append("s", "chat", ["a"], idempotency_key=""), "idempotency_key"),
        (lambda s: s.read_log("s", "chat", limit=-1), "limit"),
        (lambda s: s.read_log("s", "chat", before=0), "before"),
        (lambda s: s.read_log("s", "chat", after="1"), "after"),
        (lambda s: s.log_history("s", "chat", limit=0), "limit"),
        (lambda s: s.pop("s", "\u202echat"), "stream"),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(store, call, field):
    store.append("s", "chat", ["kept"])
    with pytest.raises(InvalidMemory) as raised:
        call(store)
    assert raised.value.field == field
    assert values(store.read_log("s", "chat")) == ["kept"]
    assert LogEvent.objects.count() == 1


def test_an_item_over_the_size_limit_is_refused_whole(store, settings):
    settings.AGENTMEMORY = {"MAX_VALUE_BYTES": 100}
    with pytest.raises(InvalidMemory, match=r"items\[1\]: is \d+ bytes as JSON"):
        store.append("s", "chat", ["small", "x" * 200])
    assert store.read_log("s", "chat") == []


# ---------------------------------------------------------------------- concurrency


def test_concurrent_appenders_lose_nothing_and_keep_each_writers_order(store):
    """8 writers x 50 appends to one log: 400 items exactly once, numbered 1..400, each
    writer's in the order it appended them."""

    def writer(worker):
        return [store.append("s", "chat", [[worker, i]])[0].seq for i in range(50)]

    acknowledged = run_threads(writer, 8)
    assert sorted(s for mine in acknowledged for s in mine) == list(range(1, 401))
    items = store.read_log("s", "chat")
    assert seqs(items) == list(range(1, 401))
    for worker in range(8):
        assert [i for w, i in values(items) if w == worker] == list(range(50))
        assert acknowledged[worker] == sorted(acknowledged[worker])


def test_concurrent_batch_appends_are_contiguous(store):
    def writer(worker):
        return [seqs(store.append("s", "chat", [worker] * 5)) for _ in range(10)]

    for batches in run_threads(writer, 6):
        for batch in batches:
            assert batch == list(range(batch[0], batch[0] + 5))
    assert store.log_length("s", "chat") == 300


def pop_until_empty(store: MemoryStore, workers: int) -> tuple[list[Any], list[str]]:
    """``workers`` threads popping ``s``/``chat`` until it is empty: every value popped, and
    every error a pop raised (recorded, not raised: a duplicated pop is reported as the
    duplicate it is, whatever a constraint says after it)."""

    def popper(_worker):
        popped, errors = [], []
        while True:
            try:
                item = store.pop("s", "chat")
            except Exception as error:  # handed to the test
                errors.append(f"{type(error).__name__}: {error}")
                break
            if item is None:
                return popped, errors
            popped.append(item.value)
        return popped, errors

    results = run_threads(popper, workers)
    return [v for mine, _ in results for v in mine], [e for _, errs in results for e in errs]


def popped_twice(popped: list[Any]) -> list[Any]:
    return sorted(v for v, n in Counter(popped).items() if n > 1)


def test_concurrent_poppers_never_return_the_same_item(store):
    """4 poppers on 100 items: each item popped exactly once, nothing lost."""
    store.append("s", "chat", list(range(100)))
    popped, errors = pop_until_empty(store, 4)
    assert popped_twice(popped) == [], "items popped by two pops"
    assert errors == []
    assert sorted(popped) == list(range(100))
    assert store.log_length("s", "chat") == 0
    assert len([e for e in store.log_history("s", "chat") if e.op == LogOp.POP]) == 100


def test_unlocked_pops_return_the_same_item_twice():
    """The pops above through the unsafe seam: the check above sees the duplicated items
    themselves (before, only the log's CHECK (length >= 0) failed, by chance)."""
    unlocked = MemoryStore(cache=None, row_lock=False)
    unlocked.append("s", "chat", list(range(100)))
    popped, _errors = pop_until_empty(unlocked, 4)
    assert popped_twice(popped), "without the lock some items must be popped twice"


def test_unlocked_appends_collide_on_a_number():
    """Unlocked appends number their items from a stale read: the (log, seq) constraint
    refuses the second copy of a number -- never two items of one number."""
    unlocked = MemoryStore(cache=None, row_lock=False)
    unlocked.append("s", "chat", ["first"])

    def writer(worker):
        try:
            unlocked.append("s", "chat", [worker])
            return "ok"
        except IntegrityError:
            return "refused"

    outcomes = run_threads(writer, 4)
    assert "refused" in outcomes
    numbers = seqs(MemoryStore(cache=None).read_log("s", "chat"))
    assert len(numbers) == len(set(numbers))


def _append_from_a_process(worker: int) -> list[int]:
    store = MemoryStore(cache=None)
    return [store.append("p", "chat", [[worker, i]])[0].seq for i in range(25)]


def _pop_from_a_process(_worker: int) -> list[int]:
    store = MemoryStore(cache=None)
    popped = []
    while (item := store.pop("p", "chat")) is not None:
        popped.append(item.value)
    return popped


@pytest.mark.server
def test_concurrent_appenders_and_poppers_in_processes():
    store = MemoryStore(cache=None)
    acknowledged = run_processes(_append_from_a_process, [(w,) for w in range(4)])
    assert sorted(s for mine in acknowledged for s in mine) == list(range(1, 101))
    items = values(store.read_log("p", "chat"))
    for worker in range(4):
        assert [i for w, i in items if w == worker] == list(range(25))
    popped = run_processes(_pop_from_a_process, [(w,) for w in range(3)])
    assert sorted(map(tuple, (v for mine in popped for v in mine))) == sorted(map(tuple, items))


def test_a_reader_sees_a_prefix_that_only_grows(store):
    """Reads while appenders run: each read is a prefix of the final log, and no read is
    shorter than the one before it on the same thread."""

    def worker(number):
        if number < 3:
            for i in range(30):
                store.append("s", "chat", [[number, i]])
            return None
        reads, before = [], 0
        for _ in range(40):
            now = store.read_log("s", "chat")
            assert len(now) >= before
            before = len(now)
            reads.append([(i.seq, tuple(i.value)) for i in now])
        return reads

    results = run_threads(worker, 5)
    final = [(i.seq, tuple(i.value)) for i in store.read_log("s", "chat")]
    for reads in results[3:]:
        for read in reads:
            assert read == final[: len(read)]


# ---------------------------------------------------------------------- async twins


def test_the_async_twins(store):
    async def main():
        appended = await store.aappend("s", "chat", ["a", "b", "c"])
        popped = await store.apop("s", "chat")
        read = await store.aread_log("s", "chat", limit=5)
        length = await store.alog_length("s", "chat")
        events = await store.alog_history("s", "chat")
        cleared = await store.aclear_log("s", "chat")
        erased = await store.aerase_session("s")
        return appended, popped, read, length, events, cleared, erased

    appended, popped, read, length, events, cleared, erased = asyncio.run(main())
    assert seqs(appended) == [1, 2, 3] and popped.value == "c"
    assert values(read) == ["a", "b"] and length == 2 and len(events) == 2
    assert cleared == 2 and erased == 1


def items_examined(statement: str, params: list) -> int | None:
    """How many item rows the database read to answer ``statement`` (:func:`rows_examined`)."""
    return rows_examined(statement, params, LogItem._meta.db_table, "i")


@pytest.mark.parametrize("where", ["latest", "before", "after"])
def test_a_page_reads_its_items_only_whatever_the_log_length(store, where):
    """O(1) in the log's length, by the plan: a page of 20 reads about 20 item rows, from the
    (log, seq) index, in a log of 3,000 -- never every item and a sort (what a join of the head
    and the items made PostgreSQL do)."""
    from agentmemory.logs import _read_statement, head_refs

    for start in range(0, 3000, 500):
        store.append("s", "chat", list(range(start, start + 500)))
    store.append("other", "chat", list(range(500)))  # another log's items in the same index
    with connection.cursor() as cursor:
        analyze(cursor, LogItem)
    bounds = {"latest": {}, "before": {"before": 1500}, "after": {"after": 1500}}[where]
    statement = _read_statement(
        connection.vendor, "after" in bounds, "before" in bounds, True, "after" not in bounds, False
    )
    params = [*("s", "chat") * head_refs(connection.vendor), *bounds.values(), 20]
    examined = items_examined(statement, params)
    assert examined is None or 20 <= examined <= 21, f"{examined} item rows read for a page of 20"
    page = store.read_log("s", "chat", limit=20, **bounds)
    assert len(page) == 20


def test_a_pop_reads_one_live_item_however_many_were_popped_before_it(store):
    """After 500 pops in a row, the next pop finds the last live item directly: the index of
    live items, not a walk back over the 500 popped rows."""
    from agentmemory.logs import _statements

    for start in range(0, 3000, 500):
        store.append("s", "chat", list(range(start, start + 500)))
    for _ in range(500):
        store.pop("s", "chat")
    with connection.cursor() as cursor:
        analyze(cursor, LogItem)
    head = Log.objects.get(session_id="s", stream="chat")
    statement = _statements(connection.vendor).last_live
    examined = items_examined(statement, [head.id, head.cleared_through])
    assert examined is None or 1 <= examined <= 2, f"{examined} item rows read for one pop"
    assert store.pop("s", "chat").seq == 2500


# ---------------------------------------------------------------------- read_log(since=)


@pytest.mark.django_db(transaction=True)
def test_read_log_since_keeps_items_whose_member_is_at_least_the_bound(store):
    """Judged by the database, in the log's order (not the member's), whatever else the items
    hold: a member missing, not a number, an item that is no object -- none is at least a
    bound."""
    store.append(
        "s",
        "events",
        [
            {"timestamp": 5, "n": 1},
            {"timestamp": 1.5, "n": 2},  # appended late: older than the one before it
            {"timestamp": "9", "n": 3},
            {"n": 4},
            [9],
            9,
            {"timestamp": True, "n": 5},
            {"timestamp": 7.25, "n": 6},
            {"timestamp": 10**12, "n": 7},
        ],
    )

    def since(bound, **page):
        items = store.read_log("s", "events", since=("timestamp", bound), **page)
        return [item.value["n"] for item in items]

    assert since(1.5) == [1, 2, 6, 7]
    assert since(5) == [1, 6, 7]
    assert since(5.5) == [6, 7]
    assert since(5, limit=2) == [6, 7]  # the latest two of those
    assert since(-1e300, limit=1) == [7]
    assert since(10**13) == []
    assert store.read_log("s", "events", since=("n", 4), limit=10)[-1].seq == 9


@pytest.mark.parametrize(
    "since",
    [("timestamp",), "timestamp", ("a.b", 1), ("x" * 65, 1), ("t", float("nan")), ("t", "1"),
     ("t", True), ("it's", 1), (1, 1)],
)  # fmt: skip
def test_read_log_since_refuses_what_is_not_a_member_and_a_number(store, since):
    with pytest.raises(InvalidMemory, match="since"):
        store.read_log("s", "events", since=since)


# ---------------------------------------------------------------------- rewrite_log


def test_rewrite_log_replaces_the_live_items_at_once_numbered_after_the_last(store):
    store.append("s", "chat", ["a", "b", "c"])
    store.pop("s", "chat")
    rewritten = store.rewrite_log("s", "chat", lambda items: [items[1], "x", items[0]])
    assert [(i.seq, i.value) for i in rewritten] == [(4, "b"), (5, "x"), (6, "a")]
    assert values(store.read_log("s", "chat")) == ["b", "x", "a"]
    assert store.log_length("s", "chat") == 3
    events = [(e.op, e.first_seq, e.last_seq, e.count) for e in store.log_history("s", "chat")]
    assert events[-2:] == [(LogOp.CLEAR, 1, 3, 2), (LogOp.APPEND, 4, 6, 3)]
    assert store.rewrite_log("s", "chat", lambda items: []) == []
    assert store.read_log("s", "chat") == [] and store.log_length("s", "chat") == 0
    assert store.rewrite_log("s", "new", lambda items: [*items, 1])[0].seq == 1


def test_rewrite_log_that_returns_bad_items_or_raises_changes_nothing(store):
    store.append("s", "chat", ["a"])
    for fn, error in (
        (lambda items: "abc", InvalidMemory),
        (lambda items: [float("nan")], InvalidMemory),
        (lambda items: 1 / 0, ZeroDivisionError),
    ):
        with pytest.raises(error):
            store.rewrite_log("s", "chat", fn)
    with pytest.raises(InvalidMemory, match="fn: must be callable"):
        store.rewrite_log("s", "chat", ["not", "a", "function"])
    assert values(store.read_log("s", "chat")) == ["a"]
    assert len(store.log_history("s", "chat")) == 1


def test_rewrite_log_inside_its_fn_is_a_reentrant_write(store):
    store.append("s", "chat", ["a"])
    with pytest.raises(ReentrantWrite):
        store.rewrite_log("s", "chat", lambda items: store.append("s", "chat", ["b"]) and items)
    assert values(store.read_log("s", "chat")) == ["a"]


def dropping_first_into(seen: list[Any]):
    def drop_first(items: list[Any]) -> list[Any]:
        seen[:] = items[:1]  # the last attempt's: the one that committed
        return items[1:]

    return drop_first


def test_rewrites_racing_with_appends_lose_and_repeat_nothing(store):
    """Writers append while others rewrite the log (each rewrite drops its first item and
    keeps the rest in order): every appended item is either dropped by exactly one rewrite or
    still there, once, and each writer's survivors keep their order."""
    rewrites_racing_with_appends(store)


def test_without_the_lock_rewrites_lose_what_was_appended_meanwhile():
    """The same race on the declared unsafe seam (a rewrite computed from a read made before
    the log's lock): the test above fails."""
    unlocked = MemoryStore(cache=None, row_lock=False)
    with pytest.raises(AssertionError):
        rewrites_racing_with_appends(MemoryStore(cache=None), rewriter=unlocked)


def rewrites_racing_with_appends(store: MemoryStore, rewriter: MemoryStore | None = None) -> None:
    rewriter = rewriter or store
    dropped: list[Any] = []

    def worker(n: int) -> None:
        for i in range(20):
            if n % 2:
                store.append("s", "chat", [[n, i]])
            else:
                seen: list[Any] = []
                rewriter.rewrite_log("s", "chat", dropping_first_into(seen))
                dropped.extend(seen)

    run_threads(worker, 6)
    left = values(store.read_log("s", "chat"))
    everything = [tuple(v) for v in left + dropped]
    assert sorted(everything) == sorted((n, i) for n in (1, 3, 5) for i in range(20))
    for writer in (1, 3, 5):
        mine = [i for w, i in left if w == writer]
        assert mine == sorted(mine)


def test_append_with_appends_what_fn_computes_from_the_items_under_the_lock(store):
    """Savers racing with one growing transcript, each appending what the log lacks of it:
    every entry lands once, in order -- fn sees the items as the lock leaves them."""
    transcript = savers_racing_with_one_transcript(store)
    missing = missing_of(transcript)
    assert store.append_with("s", "chat", missing(12)) == []
    assert store.append_with("s", "new", lambda items: []) == []
    assert not Log.objects.filter(stream="new").exists()  # no log made for nothing
    with pytest.raises(InvalidMemory, match=r"^items: "):
        store.append_with("s", "chat", lambda items: "abc")
    assert values(store.read_log("s", "chat")) == transcript


def test_without_the_lock_append_with_repeats_what_was_appended_meanwhile():
    """The same savers on the declared unsafe seam (fn computed from a read made before the
    log's lock): the test above fails."""
    with pytest.raises(AssertionError):
        savers_racing_with_one_transcript(MemoryStore(cache=None, row_lock=False))


def missing_of(transcript: list[str]) -> Callable[[int], Callable[[list[Any]], list[str]]]:
    def missing(upto: int) -> Callable[[list[Any]], list[str]]:
        return lambda items: [m for m in transcript[:upto] if m not in items]

    return missing


def savers_racing_with_one_transcript(store: MemoryStore) -> list[str]:
    transcript = [f"m{n}" for n in range(12)]
    missing = missing_of(transcript)

    def saver(_worker: int) -> None:
        for upto in range(2, 13, 2):
            store.append_with("s", "chat", missing(upto))

    run_threads(saver, 6)
    assert values(store.read_log("s", "chat")) == transcript
    return transcript
