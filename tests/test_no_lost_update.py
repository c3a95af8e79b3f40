"""Semantics 2 and 4: concurrent writers never lose an update and never make two rows.

Real threads (and processes), each with its own connection, on a file-backed or server database.
"""

import itertools

import pytest
from django.db import DatabaseError

from agentmemory import MemoryStore, VersionConflict
from agentmemory.models import Memory

from .conftest import run_threads
from .helpers import inject_errors, inserts_a_version, run_processes

pytestmark = pytest.mark.django_db(transaction=True)


def assert_linear(store, session_id, key, count):
    history = store.history(session_id, key)
    assert [h.version for h in history] == list(range(1, count + 1))
    assert store.recall(session_id, key).version == count
    assert Memory.objects.filter(session_id=session_id, key=key).count() == 1


def test_concurrent_writers_on_one_key_never_lose_an_update(store):
    def writer(worker):
        return [store.remember("s", "hot", {"w": worker, "i": i}).version for i in range(200)]

    acknowledged = [v for versions in run_threads(writer, 8) for v in versions]
    assert len(acknowledged) == 1600
    assert sorted(acknowledged) == list(range(1, 1601))
    assert_linear(store, "s", "hot", 1600)
    stored = {(h.value["w"], h.value["i"]) for h in store.history("s", "hot")}
    assert stored == {(w, i) for w in range(8) for i in range(200)}


def append_concurrently(store, workers, appends):
    """`workers` threads each append `appends` items to ("s", "list") through update(fn);
    returns the final list."""

    def appender(worker):
        for i in range(appends):
            store.update(
                "s", "list", lambda items, item=f"{worker}-{i}": [*items, item], default=[]
            )

    run_threads(appender, workers)
    return store.recall("s", "list").value


def test_concurrent_updates_keep_every_append_exactly_once(store):
    items = append_concurrently(store, 8, 25)
    assert sorted(items) == sorted(f"{w}-{i}" for w in range(8) for i in range(25))
    assert_linear(store, "s", "list", 200)


def test_unlocked_read_then_write_loses_updates():
    """The same appends through an unlocked read-then-write lose elements: the check above can fail."""
    unlocked = MemoryStore(cache=None, row_lock=False)
    items = append_concurrently(unlocked, 8, 10)
    assert len(items) < 80, "without the row lock some appends must be lost"
    assert len(unlocked.history("s", "list")) == 80  # the versions alone look perfect


def test_exactly_one_of_n_cas_writers_with_the_same_expected_version_wins(store):
    for round_number in range(10):
        base = store.remember("s", "cas", round_number).version

        def contender(worker, base=base):
            try:
                return store.remember("s", "cas", worker, expected_version=base).version
            except VersionConflict as conflict:
                assert conflict.actual == base + 1
                return None

        winners = [v for v in run_threads(contender, 6) if v is not None]
        assert winners == [base + 1]


def test_racing_first_writes_make_one_row_and_raise_nothing(store):
    for n in range(10):
        key = f"new-{n}"
        versions = run_threads(lambda worker, key=key: store.remember("s", key, worker).version, 8)
        assert sorted(versions) == list(range(1, 9))
        assert_linear(store, "s", key, 8)


def test_racing_cas_creates_make_exactly_one_memory(store):
    def create(worker):
        try:
            return store.remember("s", "once", worker, expected_version=0).version
        except VersionConflict:
            return None

    assert [v for v in run_threads(create, 8) if v is not None] == [1]


def test_overlapping_remember_many_never_deadlocks_to_the_caller(store):
    keys = [f"k{i}" for i in range(6)]

    def writer(worker):
        for i in range(15):
            chosen = [keys[(worker + j * (i + 1)) % 6] for j in range(3)]
            store.remember_many("s", {k: [worker, i] for k in reversed(chosen)})

    run_threads(writer, 6)
    for key in keys:
        history = store.history("s", key)
        assert [h.version for h in history] == list(range(1, len(history) + 1))


def test_remember_many_is_all_or_nothing(store):
    """The history insert of the second key fails (an error the store does not retry): the
    first key's row and version, written in the same transaction, are gone too."""
    from .test_retries import fatal_error

    store.remember("s", "b", 1)
    history_inserts = itertools.count(1)

    def on_the_second_history_insert(_n, sql):
        # A plain INSERT, or (PostgreSQL's one-statement write) a CTE that inserts the version.
        return inserts_a_version(sql) and (next(history_inserts) == 2)

    with (
        inject_errors(fatal_error, when=on_the_second_history_insert) as hit,
        pytest.raises(DatabaseError),
    ):
        store.remember_many("s", {"a": 1, "b": 2})
    assert len(hit) == 1
    assert store.recall("s", "a") is None and store.recall("s", "b").version == 1
    assert store.history("s", "a") == [] and len(store.history("s", "b")) == 1
    assert MemoryStore(cache=None).recall_many("s").keys() == {"b"}


def _write_many(session_id, key, worker, count):
    store = MemoryStore(cache=None)
    return [store.remember(session_id, key, {"p": worker, "i": i}).version for i in range(count)]


@pytest.mark.slow
def test_concurrent_processes_never_lose_an_update(store):
    results = run_processes(_write_many, [("s", "proc", p, 50) for p in range(4)])
    acknowledged = sorted(v for versions in results for v in versions)
    assert acknowledged == list(range(1, 201))
    assert_linear(store, "s", "proc", 200)
