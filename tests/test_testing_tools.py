"""agentmemory.testing: the pytest plugin's fixtures (loaded through the pytest11 entry point, as in
any downstream project), the factories and the strategies -- on the real test database."""

import pytest
from django.db import connections
from hypothesis import given, settings
from hypothesis import strategies as st

from agentmemory import MemoryStore
from agentmemory.cache import encode_payload
from agentmemory.errors import InvalidMemory
from agentmemory.models import Memory, MemoryVersion
from agentmemory.testing import ConcurrencyUsageError, MemoryInconsistent, concurrently
from agentmemory.testing.factories import MemoryFactory, MemoryVersionFactory
from agentmemory.testing.strategies import (
    invalid_keys,
    invalid_session_ids,
    invalid_values,
    json_values,
    keys,
    session_ids,
)

from .helpers import hit


def test_the_plugin_is_registered_by_entry_point(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("agentmemory")


# ---------------------------------------------------------------- concurrently


@pytest.mark.django_db(transaction=True)
def test_concurrently_runs_workers_together_on_their_own_connections(concurrently, memory_store):
    seen = []

    def work(i):
        seen.append(connections["default"])
        return memory_store.update("s", "n", lambda n: n + 1, default=0).version

    results = concurrently(work, workers=6)
    assert sorted(results) == [1, 2, 3, 4, 5, 6]
    assert len({id(c) for c in seen}) == 6  # one connection per worker ...
    assert all(c.connection is None for c in seen)  # ... closed when the worker ended


@pytest.mark.django_db(transaction=True)
def test_concurrently_returns_results_in_worker_order_and_reraises_the_first_error(concurrently):
    assert concurrently(lambda i: i * i, workers=4) == [0, 1, 4, 9]

    def fail_on_two(i):
        if i == 2:
            raise KeyError("worker two")
        return i

    with pytest.raises(KeyError, match="worker two"):
        concurrently(fail_on_two, workers=4)
    with pytest.raises(ValueError, match="workers must be a positive int"):
        concurrently(lambda i: i, workers=0)


@pytest.mark.django_db
def test_concurrently_under_plain_db_says_to_use_transactional_db(concurrently):
    with pytest.raises(ConcurrencyUsageError, match="transactional_db"):
        concurrently(lambda i: i, workers=2)


@pytest.mark.django_db(transaction=True)
def test_concurrently_catches_the_unlocked_writer():
    """The fixture is sharp enough: the same test fails on a store without the row lock."""

    def bump(store):
        return lambda i: [store.update("s", "n", lambda n: n + 1, default=0) for _ in range(10)]

    concurrently(bump(MemoryStore(cache=None)), workers=6)
    assert MemoryStore(cache=None).recall("s", "n").value == 60
    concurrently(bump(MemoryStore(cache=None, row_lock=False)), workers=6)
    assert MemoryStore(cache=None).recall("s", "n").value < 120  # updates were lost


# ---------------------------------------------------------------- memory_store, memory_clock


@pytest.mark.django_db(transaction=True)
def test_memory_store_has_a_cache_namespace_of_its_own(memory_store):
    plain = MemoryStore()
    if memory_store.cache is None:
        pytest.fail("the suite runs with REDIS_URL set: memory_store must use the cache tier")
    assert ":test-" in memory_store.cache.prefix and memory_store.cache.prefix != plain.cache.prefix
    memory_store.remember("s", "k", 1)
    assert hit(memory_store).value == 1


@pytest.mark.django_db(transaction=True)
def test_memory_clock_expires_without_sleeping(memory_store, memory_clock):
    memory_store.remember("s", "k", "soon gone", ttl=60)
    memory_clock.advance(59)
    assert memory_store.recall("s", "k").value == "soon gone"
    memory_clock.advance(1)
    assert memory_store.recall("s", "k") is None
    with pytest.raises(ValueError, match="seconds >= 0"):
        memory_clock.advance(-1)


def test_memory_clock_was_reset_after_the_previous_test(memory_clock):
    from datetime import UTC, datetime

    assert abs((memory_clock.now() - datetime.now(UTC)).total_seconds()) < 5


# ---------------------------------------------------------------- assert_memory_consistent, factories


@pytest.mark.django_db(transaction=True)
def test_assert_memory_consistent_passes_on_store_data_and_names_each_violation(
    memory_store, assert_memory_consistent
):
    memory_store.remember("s", "k", 1)
    memory_store.remember("s", "k", 2)
    memory_store.forget("s", "k")
    assert_memory_consistent()
    assert_memory_consistent(session_id="s")
    MemoryFactory(session_id="broken", key="k", versions=4, gap=True)
    assert_memory_consistent(session_id="s")  # another session is not looked at
    with pytest.raises(MemoryInconsistent) as info:
        assert_memory_consistent()
    assert "[version-gap] ('broken', 'k'): history versions are [1, 3, 4, 5]" in str(info.value)


@pytest.mark.django_db(transaction=True)
def test_assert_memory_consistent_sees_a_stale_redis_entry(memory_store, assert_memory_consistent):
    memory_store.remember("s", "k", 1)
    memory_store.remember("s", "k", 2)
    client = memory_store.cache.client
    # Version 1 as this Redis server would serve it: its run_id, epoch and lineage.
    trusted = memory_store.cache.trusted_stamp()
    old = encode_payload("s", "k", memory_store.recall("s", "k", version=1))
    client.set(memory_store.cache.entry_key("s", "k"), f"1|{trusted}|{old}")
    with pytest.raises(MemoryInconsistent, match="Redis holds v1, the database v2"):
        assert_memory_consistent()


@pytest.mark.django_db
def test_memory_factory_builds_what_the_store_would_have(assert_memory_consistent):
    memory = MemoryFactory(session_id="s", key="k", value={"a": 1}, versions=3)
    assert (memory.version, memory.value) == (3, {"a": 1})
    store = MemoryStore(cache=None)
    assert [v.version for v in store.history("s", "k")] == [1, 2, 3]
    assert store.recall("s", "k").value == {"a": 1}
    assert store.revert("s", "k", 1).version == 4
    assert_memory_consistent()
    other = MemoryFactory()
    assert other.session_id != memory.session_id and other.version == 1


@pytest.mark.django_db
def test_memory_version_factory_appends_the_next_version(assert_memory_consistent):
    memory = MemoryFactory(versions=2)
    MemoryVersionFactory(memory=memory, value="third")
    MemoryVersionFactory(memory=memory, op="forget")
    memory.refresh_from_db()
    assert (memory.version, memory.state, memory.value) == (4, "forgotten", None)
    assert list(memory.versions.values_list("version", "op")) == [
        (1, "write"),
        (2, "write"),
        (3, "write"),
        (4, "forget"),
    ]
    fresh = MemoryVersionFactory()  # on a new memory: version 1
    assert fresh.version == 1 and fresh.memory.version == 1
    assert_memory_consistent()


@pytest.mark.django_db
def test_factories_refuse_data_the_store_would_refuse():
    with pytest.raises(InvalidMemory, match="session_id"):
        MemoryFactory(session_id="")
    with pytest.raises(InvalidMemory, match="value"):
        MemoryFactory(value=float("nan"))
    with pytest.raises(ValueError, match="versions must be an int >= 0"):
        MemoryFactory(versions=-1)
    assert not Memory.objects.exists() and not MemoryVersion.objects.exists()


# ---------------------------------------------------------------- strategies


@pytest.mark.django_db(transaction=True)
@settings(max_examples=40, deadline=None)
@given(session_id=session_ids(), key=keys(), value=json_values())
def test_valid_inputs_round_trip_on_this_database(session_id, key, value):
    store = MemoryStore()
    written = store.remember(session_id, key, value)
    assert store.recall(session_id, key).value == value == written.value
    store.erase_session(session_id)


@settings(max_examples=60, deadline=None)
@given(
    bad=st.one_of(
        invalid_session_ids().map(lambda s: (s, "k", 1)),
        invalid_keys().map(lambda k: ("s", k, 1)),
        invalid_values().map(lambda v: ("s", "k", v)),
    )
)
def test_invalid_inputs_are_refused_before_any_query(bad):
    # No database access is allowed in this test: a query would raise pytest-django's error.
    with pytest.raises(InvalidMemory):
        MemoryStore(cache=None).remember(*bad)
