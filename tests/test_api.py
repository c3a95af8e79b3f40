"""The rest of the public API: recall_many, remember_many, forget, async twins, records."""

import asyncio
import dataclasses

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from agentmemory import MemoryRecord, MemoryStore
from agentmemory.errors import VersionConflict

pytestmark = pytest.mark.django_db


def test_recall_of_missing_key_is_none(store):
    assert store.recall("s", "missing") is None


def test_record_is_immutable(store):
    record = store.remember("s", "k", 1)
    assert isinstance(record, MemoryRecord)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.version = 5


def test_created_at_is_kept_on_update_and_updated_at_moves(store):
    first = store.remember("s", "k", 1)
    second = store.remember("s", "k", 2)
    assert second.created_at == first.created_at
    assert second.updated_at >= first.updated_at


def test_recall_many_by_keys_skips_missing(store):
    store.remember_many("s", {"a": 1, "b": 2, "c": 3})
    found = store.recall_many("s", ["a", "c", "zz"])
    assert {k: r.value for k, r in found.items()} == {"a": 1, "c": 3}


def test_recall_many_skips_forgotten(store):
    store.remember_many("s", {"a": 1, "b": 2})
    store.forget("s", "a")
    assert set(store.recall_many("s")) == {"b"}


def test_remember_many_returns_every_record(store):
    records = store.remember_many("s", {"b": 2, "a": 1})
    assert {k: (r.version, r.value) for k, r in records.items()} == {"a": (1, 1), "b": (1, 2)}
    assert store.remember_many("s", {}) == {}


def test_forget_missing_key_returns_false_and_writes_nothing(store):
    assert store.forget("s", "nothing") is False
    assert store.history("s", "nothing") == []


def test_forget_twice_writes_one_forget(store):
    store.remember("s", "k", 1)
    assert store.forget("s", "k") is True
    assert store.forget("s", "k") is False
    assert [h.op for h in store.history("s", "k")] == ["write", "forget"]


def test_update_uses_default_when_missing(store):
    assert store.update("s", "n", lambda n: n + 1, default=0).value == 1
    assert store.update("s", "n", lambda n: n + 1, default=0).value == 2


def test_store_uses_the_configured_alias(settings):
    settings.AGENTMEMORY = {"DATABASE": "default"}
    assert MemoryStore().using == "default"
    assert MemoryStore(using="other").using == "other"


@pytest.mark.django_db(transaction=True)
def test_async_twins(store):
    async def scenario():
        await store.aremember("s", "k", [1])
        await store.aupdate("s", "k", lambda v: [*v, 2])
        record = await store.arecall("s", "k")
        many = await store.arecall_many("s")
        history = await store.ahistory("s", "k")
        forgotten = await store.aforget("s", "k")
        await sync_to_async(connections.close_all)()  # the connection of sync_to_async's thread
        return record, many, history, forgotten

    record, many, history, forgotten = asyncio.run(scenario())
    assert record.value == [1, 2] and set(many) == {"k"}
    assert [h.version for h in history] == [1, 2] and forgotten is True


def test_expire_now_records_an_expire_version_whatever_the_ttl(store):
    store.remember("s", "k", "forever")
    assert store.expire("s", "k") is True
    assert store.recall("s", "k") is None
    assert [v.op for v in store.history("s", "k")] == ["write", "expire"]
    assert store.expire("s", "k") is False  # nothing live to expire: no version
    assert store.expire("s", "never") is False
    store.remember("s", "k", "back")
    with pytest.raises(VersionConflict):
        store.expire("s", "k", expected_version=1)
    assert store.expire("s", "k", expected_version=3) is True
    assert [v.version for v in store.history("s", "k")] == [1, 2, 3, 4]


def test_revert_with_expected_version_refuses_a_memory_that_moved_on(store):
    store.remember("s", "k", "one")
    store.remember("s", "k", "two")
    with pytest.raises(VersionConflict):
        store.revert("s", "k", 1, expected_version=1)
    assert store.revert("s", "k", 1, expected_version=2).value == "one"
    assert [v.version for v in store.history("s", "k")] == [1, 2, 3]


@pytest.mark.django_db(transaction=True)
def test_last_read_source_follows_every_kind_of_read(store):
    store.remember("s", "k", 1)
    store.remember("s", "k", 2)
    store.recall("s", "k")
    store.recall("s", "k")
    assert store.last_read_source == ("cache" if store.cache else "database")
    assert store.recall("s", "k", version=1).value == 1
    assert store.last_read_source == "database"  # old versions are never cached
    store.recall("s", "k")
    store.recall_many("s", prefix="k")
    assert store.last_read_source == "database"


def reentrant_calls(store):
    """Store writes that an ``update``'s ``fn`` might make: each is refused."""
    return {
        "remember": lambda: store.remember("s", "k", "inner"),
        "remember other key": lambda: store.remember("s", "other", "inner"),
        "update": lambda: store.update("s", "k", lambda v: "inner"),
        "forget": lambda: store.forget("s", "k"),
        "remember_many": lambda: store.remember_many("s", {"a": 1}),
        "erase_session": lambda: store.erase_session("s"),
        "a second store": lambda: MemoryStore(cache=None).remember("s", "k", "inner"),
    }


@pytest.mark.parametrize(
    "call",
    [
        "remember",
        "remember other key",
        "update",
        "forget",
        "remember_many",
        "erase_session",
        "a second store",
    ],
)
def test_a_write_from_inside_update_fn_is_refused_and_nothing_is_written(store, call):
    from agentmemory import InvalidMemory, ReentrantWrite
    from agentmemory.models import Memory, MemoryVersion

    store.remember("s", "k", "before")
    inner = reentrant_calls(store)[call]

    def fn(old):
        inner()
        return "outer"

    with pytest.raises(ReentrantWrite) as error:
        store.update("s", "k", fn)
    assert isinstance(error.value, InvalidMemory) and error.value.field == "fn"
    assert store.recall("s", "k").value == "before"
    assert MemoryVersion.objects.count() == 1 and Memory.objects.count() == 1
    # The store is not left thinking it is still writing.
    assert store.remember("s", "k", "after").version == 2
