"""Semantic 6: TTL belongs to one key; each write sets it anew; expired memories are never returned."""

from datetime import timedelta

import pytest
from django.test import override_settings

from agentmemory import MemoryStore, clock

pytestmark = pytest.mark.django_db


def test_memory_is_returned_until_it_expires(store):
    store.remember("s", "k", "v", ttl=60)
    clock.advance(59)
    assert store.recall("s", "k").value == "v"
    clock.advance(2)
    assert store.recall("s", "k") is None
    assert store.recall_many("s") == {}


def test_ttl_accepts_timedelta(store):
    record = store.remember("s", "k", "v", ttl=timedelta(minutes=1))
    assert record.expires_at == record.updated_at + timedelta(minutes=1)


def test_overwrite_refreshes_the_expiry(store):
    store.remember("s", "k", "v1", ttl=60)
    clock.advance(50)
    store.remember("s", "k", "v2", ttl=60)
    clock.advance(50)
    assert store.recall("s", "k").value == "v2"


def test_overwrite_without_ttl_means_the_default_never(store):
    store.remember("s", "k", "v1", ttl=60)
    store.remember("s", "k", "v2")
    clock.advance(10**6)
    assert store.recall("s", "k").value == "v2"


def test_writing_one_key_never_extends_another(store):
    store.remember("s", "a", "short", ttl=10)
    clock.advance(8)
    store.remember("s", "b", "other", ttl=1000)
    store.update("s", "c", lambda v: 1)
    clock.advance(3)
    assert store.recall("s", "a") is None
    assert store.recall("s", "b").value == "other"


def test_reading_does_not_renew_the_ttl(store):
    store.remember("s", "k", "v", ttl=10)
    for _ in range(5):
        clock.advance(1.9)
        assert store.recall("s", "k") is not None
    clock.advance(1)
    assert store.recall("s", "k") is None


def test_expired_old_version_is_not_returned(store):
    store.remember("s", "k", "v", ttl=10)
    clock.advance(11)
    assert store.recall("s", "k", version=1) is None
    assert store.history("s", "k")[0].value == "v"


def test_update_sees_an_expired_memory_as_missing(store):
    store.remember("s", "k", [1], ttl=10)
    clock.advance(11)
    assert store.update("s", "k", lambda v: [*v, 2], default=[]).value == [2]


def test_purge_expired_records_expire_versions_and_retires_the_row(store):
    store.remember("s", "a", 1, ttl=10)
    store.remember("s", "b", 2, ttl=100)
    store.remember("s", "c", 3)
    clock.advance(11)
    assert store.purge_expired() == 1
    assert [(h.version, h.op) for h in store.history("s", "a")] == [(1, "write"), (2, "expire")]
    assert set(store.recall_many("s")) == {"b", "c"}
    assert store.purge_expired() == 0


def test_purge_expired_works_in_batches(store):
    store.remember_many("s", {f"k{i}": i for i in range(7)}, ttl=1)
    clock.advance(2)
    assert store.purge_expired(batch=3) == 7
    assert store.recall_many("s") == {}


def test_purge_does_not_expire_a_memory_rewritten_with_a_longer_ttl(store):
    store.remember("s", "k", "v", ttl=1)
    store.remember("s", "k", "v2", ttl=100)
    clock.advance(2)
    assert store.purge_expired() == 0
    assert store.recall("s", "k").value == "v2"


@override_settings(AGENTMEMORY={"DEFAULT_TTL": 30})
def test_default_ttl_setting_applies_when_ttl_is_none():
    store = MemoryStore(cache=None)
    store.remember("s", "k", "v")
    clock.advance(31)
    assert store.recall("s", "k") is None
