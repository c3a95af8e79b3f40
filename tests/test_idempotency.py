"""Semantic 10: a write repeated with the same idempotency key returns the first version."""

import pytest

from agentmemory import InvalidMemory

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
