"""Signals (#47, item 3): sent once what they tell of is committed -- at once outside a
transaction, at the caller's COMMIT inside one, never for a rollback or a replay -- for every
writer, and a receiver that fails does not fail the call."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.db import transaction

from agentmemory import MemoryStore, clock, signals
from agentmemory.integrations.llamaindex import AgentMemoryChatStore

pytestmark = pytest.mark.django_db(transaction=True)

ALL = ("memory_written", "memory_forgotten", "memory_expired", "log_appended", "session_erased")


@contextmanager
def received():
    """Every signal sent inside the block: (name, kwargs without the sender)."""
    got: list[tuple[str, dict]] = []
    handlers = {}
    for name in ALL:

        def handler(sender, name=name, **kwargs):
            assert sender is MemoryStore
            kwargs.pop("signal")
            got.append((name, kwargs))

        handlers[name] = handler
        getattr(signals, name).connect(handler)
    try:
        yield got
    finally:
        for name, handler in handlers.items():
            getattr(signals, name).disconnect(handler)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(cache=None)


def test_each_change_sends_its_signal_once_with_what_it_changed(store):
    with received() as got:
        written = store.remember("s", "k", {"a": 1}, idempotency_key="r1")
        store.remember("s", "k", {"a": 1}, idempotency_key="r1")  # a replay: nothing new
        store.update("s", "k", lambda v: {**v, "b": 2})
        store.remember_many("s", {"x": 1, "y": 2})
        store.revert("s", "k", 1)
        store.forget("s", "x")
        store.forget("s", "x")  # nothing live: nothing sent
        store.expire("s", "y")
        items = store.append("s", "chat", ["hi", "there"])
        store.append_with("s", "chat", lambda current: ["again"])
        store.rewrite_log("s", "chat", lambda current: [])  # a replacement is not an append
        store.erase_session("s")
    names = [name for name, _ in got]
    assert names == [
        "memory_written",
        "memory_written",
        "memory_written",
        "memory_written",
        "memory_written",
        "memory_forgotten",
        "memory_expired",
        "log_appended",
        "log_appended",
        "session_erased",
    ]
    assert got[0][1] == {"using": "default", "record": written}
    assert {got[2][1]["record"].key, got[3][1]["record"].key} == {"x", "y"}
    assert got[4][1]["record"].value == {"a": 1} and got[4][1]["record"].version == 3
    assert got[5][1] == {"using": "default", "session_id": "s", "key": "x"}
    assert got[7][1]["items"] == items and got[7][1]["stream"] == "chat"
    assert got[9][1] == {"using": "default", "session_id": "s"}


def test_inside_a_transaction_they_wait_for_its_commit_and_a_rollback_sends_none(store):
    with received() as got:
        with transaction.atomic():
            store.remember("s", "k", 1)
            store.append("s", "chat", ["x"])
            assert got == []  # not committed yet
        assert [name for name, _ in got] == ["memory_written", "log_appended"]
        got.clear()
        with pytest.raises(RuntimeError), transaction.atomic():
            store.remember("s", "k", 2)
            store.append("s", "chat", ["y"])
            raise RuntimeError("the caller rolls back")
        assert got == []
    assert store.recall("s", "k").value == 1


def test_purge_expired_and_the_adapters_send_them_too(store):
    store.remember("s", "old", 1, ttl=60)
    clock.advance(61)
    try:
        with received() as got:
            store.purge_expired()
            AgentMemoryChatStore(store=store).set_messages("chat", [])
    finally:
        clock.reset()
    assert got == [("memory_expired", {"using": "default", "session_id": "s", "key": "old"})]


def test_a_receiver_that_raises_does_not_fail_the_committed_call(store, caplog):
    def broken(sender, **kwargs):
        raise ValueError("the webhook is down")

    seen = []
    signals.memory_written.connect(broken)
    signals.memory_written.connect(
        lambda sender, **kwargs: seen.append(kwargs["record"].version),
        weak=False,
        dispatch_uid="test-seen",
    )
    try:
        assert store.remember("s", "k", 1).version == 1
    finally:
        signals.memory_written.disconnect(broken)
        signals.memory_written.disconnect(dispatch_uid="test-seen")
    assert seen == [1]  # the other receivers still ran
    assert store.recall("s", "k").value == 1
    assert "the change is committed" in caplog.text and "the webhook is down" in caplog.text
