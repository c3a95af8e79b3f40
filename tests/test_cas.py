"""Semantic 3: compare-and-set."""

import pytest

from agentmemory import VersionConflict, clock

pytestmark = pytest.mark.django_db


def test_expected_version_matching_writes(store):
    store.remember("s", "k", 1)
    assert store.remember("s", "k", 2, expected_version=1).version == 2


def test_expected_version_mismatch_raises_and_writes_nothing(store):
    store.remember("s", "k", 1)
    store.remember("s", "k", 2)
    with pytest.raises(VersionConflict) as info:
        store.remember("s", "k", 3, expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert store.recall("s", "k").value == 2
    assert len(store.history("s", "k")) == 2


def test_expected_zero_creates_only_when_missing(store):
    assert store.remember("s", "k", "first", expected_version=0).version == 1
    with pytest.raises(VersionConflict) as info:
        store.remember("s", "k", "second", expected_version=0)
    assert info.value.actual == 1


def test_expected_version_on_missing_key_conflicts_and_creates_no_row(store):
    with pytest.raises(VersionConflict) as info:
        store.remember("s", "k", "x", expected_version=3)
    assert info.value.actual == 0
    assert store.history("s", "k") == []
    from agentmemory.models import Memory

    assert not Memory.objects.filter(session_id="s").exists()


def test_forgotten_memory_counts_as_missing_for_cas(store):
    store.remember("s", "k", "a")
    store.forget("s", "k")
    assert store.remember("s", "k", "b", expected_version=0).version == 3


def test_expired_memory_counts_as_missing_for_cas(store):
    store.remember("s", "k", "a", ttl=5)
    clock.advance(6)
    with pytest.raises(VersionConflict):
        store.remember("s", "k", "b", expected_version=1)
    assert store.remember("s", "k", "b", expected_version=0).version == 3


def test_forget_with_expected_version(store):
    store.remember("s", "k", "a")
    store.remember("s", "k", "b")
    with pytest.raises(VersionConflict):
        store.forget("s", "k", expected_version=1)
    assert store.recall("s", "k").value == "b"
    assert store.forget("s", "k", expected_version=2) is True
