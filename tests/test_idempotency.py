"""Semantic 10: a write repeated with the same idempotency key returns the first version."""

import pytest

from agentmemory import InvalidMemory
from agentmemory.defects import lose_commit_answer

pytestmark = pytest.mark.django_db


def test_repeated_write_returns_the_first_version_and_writes_nothing(store):
    first = store.remember("s", "k", {"n": 1}, idempotency_key="req-1")
    again = store.remember("s", "k", {"n": 1}, idempotency_key="req-1")
    assert again.version == first.version == 1
    assert len(store.history("s", "k")) == 1


def test_repeat_after_other_writes_still_returns_the_original(store):
    store.remember("s", "k", "a", idempotency_key="req-1")
    store.remember("s", "k", "b")
    again = store.remember("s", "k", "a", idempotency_key="req-1")
    assert (again.version, again.value) == (1, "a")
    assert store.recall("s", "k").value == "b"


def test_same_idempotency_key_on_another_key_is_a_new_write(store):
    store.remember("s", "k1", 1, idempotency_key="req-1")
    assert store.remember("s", "k2", 1, idempotency_key="req-1").version == 1
    assert store.remember("t", "k1", 1, idempotency_key="req-1").version == 1


def test_bad_idempotency_key_is_rejected(store):
    with pytest.raises(InvalidMemory, match="idempotency_key"):
        store.remember("s", "k", 1, idempotency_key="x" * 65)


@pytest.mark.django_db(transaction=True)
def test_a_write_whose_commit_answer_was_lost_is_written_once(store):
    """The server committed, the client saw a dropped connection (defects.lose_commit_answer):
    the retry finds the committed version by its request id, and a reader gets it (the Redis
    update of the lost attempt never ran: the retry drops the entry)."""
    store.remember("s", "k", 1)
    assert store.recall("s", "k").value == 1  # Redis (when on) holds v1 now
    with lose_commit_answer():
        record = store.update("s", "k", lambda n: n + 1)
    assert (record.version, record.value) == (2, 2)
    assert [v.version for v in store.history("s", "k")] == [1, 2]
    assert store.recall("s", "k").value == 2
    assert store.retries["disconnect"] == 1


@pytest.mark.django_db(transaction=True)
def test_an_erasure_whose_commit_answer_was_lost_leaves_nothing_readable(store):
    """The retry of erase_session finds no rows (the lost attempt deleted them): it must still
    drop the Redis entries the lost attempt saw -- a retry that dropped only what it found left
    the erased memories in Redis (found by the Galera node-fault memcheck)."""
    store.remember("s", "k1", "secret")
    store.remember("s", "k2", "also secret")
    assert len(store.recall_many("s", ["k1", "k2"])) == 2  # Redis (when on) holds both
    with lose_commit_answer():
        assert store.erase_session("s") == 2
    assert store.retries["disconnect"] == 1
    assert store.recall("s", "k1") is None and store.recall_many("s", ["k1", "k2"]) == {}
