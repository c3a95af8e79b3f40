"""Semantic 1: versions 1, 2, 3, ... with no gap and no reuse, across forget, expiry and revert."""

import pytest

from agentmemory import clock

pytestmark = pytest.mark.django_db


def ops_of(store, session_id="s", key="k"):
    return [(h.version, h.op) for h in store.history(session_id, key)]


def test_each_write_is_the_next_version(store):
    versions = [store.remember("s", "k", i).version for i in range(5)]
    assert versions == [1, 2, 3, 4, 5]
    assert ops_of(store) == [(v, "write") for v in versions]


def test_forget_is_a_version_and_the_next_write_continues_the_count(store):
    store.remember("s", "k", "a")
    assert store.forget("s", "k") is True
    assert store.recall("s", "k") is None
    assert store.remember("s", "k", "b").version == 3
    assert ops_of(store) == [(1, "write"), (2, "forget"), (3, "write")]


def test_expiry_is_a_version_and_the_next_write_continues_the_count(store):
    store.remember("s", "k", "a", ttl=10)
    clock.advance(11)
    assert store.remember("s", "k", "b").version == 3
    assert ops_of(store) == [(1, "write"), (2, "expire"), (3, "write")]


def test_revert_writes_a_new_version_holding_the_old_value(store):
    store.remember("s", "k", {"v": 1})
    store.remember("s", "k", {"v": 2})
    reverted = store.revert("s", "k", 1)
    assert (reverted.version, reverted.value) == (3, {"v": 1})
    assert store.recall("s", "k").value == {"v": 1}
    assert ops_of(store) == [(1, "write"), (2, "write"), (3, "revert")]


def test_revert_after_forget_brings_the_memory_back_as_the_next_version(store):
    store.remember("s", "k", "a")
    store.forget("s", "k")
    assert store.revert("s", "k", 1).version == 3
    assert store.recall("s", "k").value == "a"


def test_history_is_oldest_first_with_values(store):
    store.remember("s", "k", "a")
    store.remember("s", "k", "b")
    store.forget("s", "k")
    history = store.history("s", "k")
    assert [(h.version, h.op, h.value) for h in history] == [
        (1, "write", "a"),
        (2, "write", "b"),
        (3, "forget", None),
    ]


def test_history_of_unknown_key_is_empty(store):
    assert store.history("s", "never") == []


def test_recall_of_an_old_version(store):
    store.remember("s", "k", "a")
    store.remember("s", "k", "b")
    assert store.recall("s", "k", version=1).value == "a"
    assert store.recall("s", "k", version=2).value == "b"
    assert store.recall("s", "k", version=3) is None


def test_recall_of_a_forget_version_is_none(store):
    store.remember("s", "k", "a")
    store.forget("s", "k")
    assert store.recall("s", "k", version=2) is None


def test_failed_write_leaves_no_version(store):
    store.remember("s", "k", "a")

    def boom(_value):
        raise RuntimeError("agent code failed")

    with pytest.raises(RuntimeError):
        store.update("s", "k", boom)
    assert ops_of(store) == [(1, "write")]
    assert store.remember("s", "k", "b").version == 2
