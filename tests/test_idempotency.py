"""Semantic 10: a write repeated with the same idempotency key returns the first version."""

import pytest

from agentmemory import IdempotencyKeyReused, InvalidMemory
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


# Keys are opaque: compared byte for byte on every backend, never by a collation (MariaDB's
# default one is case-, accent- and trailing-space-insensitive).
KEYS_A_COLLATION_WOULD_MERGE = [("Req-A", "req-a"), ("cafe", "café"), ("req-a", "req-a ")]


@pytest.mark.parametrize(("first", "second"), KEYS_A_COLLATION_WOULD_MERGE)
def test_idempotency_keys_that_differ_only_by_case_accent_or_space_are_distinct(
    store, first, second
):
    store.remember("s", "k", "one", idempotency_key=first)
    record = store.remember("s", "k", "two", idempotency_key=second)
    assert (record.version, record.value) == (2, "two")
    assert store.recall("s", "k").value == "two"


@pytest.mark.parametrize(("first", "second"), KEYS_A_COLLATION_WOULD_MERGE)
def test_log_idempotency_keys_that_differ_only_by_case_accent_or_space_are_distinct(
    store, first, second
):
    store.append("s", "log", ["one"], idempotency_key=first)
    store.append("s", "log", ["two"], idempotency_key=second)
    assert [item.value for item in store.read_log("s", "log")] == ["one", "two"]


# A key identifies one request: the same key with another request is refused, never answered
# as if the new request had happened.


def test_the_same_key_with_another_value_is_refused_and_writes_nothing(store):
    store.remember("s", "k", {"n": 1}, idempotency_key="req-1")
    with pytest.raises(IdempotencyKeyReused, match="'req-1'") as caught:
        store.remember("s", "k", {"n": 2}, idempotency_key="req-1")
    assert caught.value.field == "idempotency_key"
    assert isinstance(caught.value, InvalidMemory)
    assert [v.value for v in store.history("s", "k")] == [{"n": 1}]


@pytest.mark.parametrize(
    ("stored", "again"),
    [(1, True), (0, False), (1, "1"), ([1], (1,)), ({"a": 1}, {"a": 1, "b": None}), (None, 0)],
)
def test_values_equal_in_python_but_not_in_json_are_another_request(store, stored, again):
    store.remember("s", "k", stored, idempotency_key="req-1")
    if again == (1,):  # a tuple is encoded as a list: the same JSON, the same request
        assert store.remember("s", "k", again, idempotency_key="req-1").version == 1
        return
    with pytest.raises(IdempotencyKeyReused):
        store.remember("s", "k", again, idempotency_key="req-1")


@pytest.mark.parametrize("value", [1.5, 10**20, 1e300, {"b": [1, {"c": "é"}], "a": 0.1}])
def test_a_retry_of_the_same_value_is_recognised_whatever_the_database_did_to_it(store, value):
    """jsonb reorders keys and writes 1e300 without an exponent: still the same request."""
    first = store.remember("s", "k", value, idempotency_key="req-1")
    assert store.remember("s", "k", value, idempotency_key="req-1").version == first.version


def test_a_log_key_used_by_a_pop_is_refused_for_an_append(store):
    """The issue's reproduction: the append answered with the pop's result, "zzz" never stored."""
    store.append("s", "log", ["a", "b"])
    store.pop("s", "log", idempotency_key="K")
    with pytest.raises(IdempotencyKeyReused, match=r"'K'.*pop"):
        store.append("s", "log", ["zzz"], idempotency_key="K")
    with pytest.raises(IdempotencyKeyReused):
        store.clear_log("s", "log", idempotency_key="K")
    assert [item.value for item in store.read_log("s", "log")] == ["a"]


def test_a_log_append_retried_with_other_items_is_refused(store):
    store.append("s", "log", ["a", "b"], idempotency_key="K")
    assert [i.seq for i in store.append("s", "log", ["a", "b"], idempotency_key="K")] == [1, 2]
    with pytest.raises(IdempotencyKeyReused, match="'K'"):
        store.append("s", "log", ["a", "c"], idempotency_key="K")
    with pytest.raises(IdempotencyKeyReused):
        store.append("s", "log", ["a"], idempotency_key="K")
    assert [item.value for item in store.read_log("s", "log")] == ["a", "b"]


def test_a_pop_retried_with_its_key_returns_what_it_popped(store):
    store.append("s", "log", ["a", "b"])
    first = store.pop("s", "log", idempotency_key="K")
    assert store.pop("s", "log", idempotency_key="K") == first
    assert [item.value for item in store.read_log("s", "log")] == ["a"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("idempotency_key", [None, "req-1"])
def test_a_remember_whose_commit_answer_was_lost_is_written_once(store, idempotency_key):
    """Every write path -- PostgreSQL's one autocommitted statement included -- commits, loses
    the answer, and is retried: the retry finds the version by its request id."""
    store.remember("s", "k", "a")
    with lose_commit_answer():
        record = store.remember("s", "k", "b", idempotency_key=idempotency_key)
    assert (record.version, record.value) == (2, "b")
    assert [(v.version, v.value) for v in store.history("s", "k")] == [(1, "a"), (2, "b")]
    assert store.recall("s", "k").value == "b"
    assert store.retries["disconnect"] == 1


def test_a_replayed_write_says_so_and_a_new_one_does_not(store):
    first = store.remember("s", "k", {"n": 1}, idempotency_key="req-1")
    again = store.remember("s", "k", {"n": 1}, idempotency_key="req-1")
    assert (first.replayed, again.replayed) == (False, True)
    assert again == first  # not compared: a replay is the same record
    assert store.remember("s", "k", {"n": 2}).replayed is False


@pytest.mark.django_db(transaction=True)
def test_a_write_retried_after_its_lost_answer_is_not_a_replay(store):
    with lose_commit_answer():
        record = store.remember("s", "k", "a", idempotency_key="req-1")
    assert record.version == 1 and record.replayed is False
