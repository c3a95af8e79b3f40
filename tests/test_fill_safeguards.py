"""The Redis tier's second lines (#49, item 2). A fill is checked twice -- against its lease, and
against the version Redis holds -- and each check is the other's second line; a fence renewal
checks the pending invalidations first, and counts the fence's expiry from the Redis clock read
before that check, so that a renewal that stalls after it cannot outlive a writer's wait. Each is
shown necessary here on the real servers, with the failpoints memcheck's faults use
(``defects.crash_next_write``, ``hold_next_fill``, ``hold_next_renewal``, ``cut_off_next_write``):
the store as it ships serves the acknowledged version; a store with the safeguard removed (the
declared defects ``fill-ignores-version``, ``fill-ignores-lease``, ``fence-counted-from-renewal``)
serves the version before it. That memcheck's own faults catch each variant in a default run, by
its check, is asserted by the self-test's test (tests/test_selftest.py), which runs them all."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from agentmemory import MemoryStore
from agentmemory.defects import (
    Defect,
    WriterCrashed,
    crash_next_write,
    cut_off_next_write,
    disarm,
    hold_next_fill,
    hold_next_renewal,
)

from .conftest import redis_alias

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(work) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(work())
        except Exception as exc:
            out.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def warm(store: MemoryStore, key: str) -> None:
    """The key is served by the tier (its fence is up)."""
    for _ in range(20):
        store.recall("s", key)
        if store.last_read_source == "cache":
            return
    pytest.fail("the tier never served the key")


def crash_during_a_fill(store: MemoryStore):
    """A writer of v2 stops before its COMMIT (its tombstone in Redis); a reader misses and
    fills v1 under its lease; the writer commits and crashes before its update. What a reader
    gets next."""
    store.remember("s", "k", "v1")
    warm(store, "k")
    hold = crash_next_write(lambda session_id, _keys: session_id == "s")
    writer, outcome = in_thread(lambda: store.remember("s", "k", "v2"))
    try:
        assert hold.reached.wait(5)
        assert store.recall("s", "k").value == "v1"  # the COMMIT is not made yet
        assert store.last_read_source == "database"  # a miss on the tombstone
    finally:
        disarm(hold)
        writer.join()
    assert isinstance(outcome[0], WriterCrashed), outcome
    assert hold.taken == ("s", {"k": 2})
    assert MemoryStore(cache=None).recall("s", "k").value == "v2"  # committed
    return store.recall("s", "k")


def evict_before_a_fill(store: MemoryStore):
    """A reader misses and reads v1, and stops before its fill; v2 is written (acknowledged) and
    its entry evicted; the reader fills. What a reader gets next."""
    store.remember("s", "k", "v1")
    warm(store, "k")
    store.cache.client.delete(store.cache.entry_key("s", "k"))
    hold = hold_next_fill(lambda session_id, _keys: session_id == "s")
    reader, outcome = in_thread(lambda: store.recall("s", "k"))
    try:
        assert hold.reached.wait(5)
        assert store.remember("s", "k", "v2").version == 2
        store.cache.client.delete(store.cache.entry_key("s", "k"))
    finally:
        disarm(hold)
        reader.join()
    assert outcome[0].value == "v1"  # it read before the write
    return store.recall("s", "k")


def renewal_stalled_past_a_writers_wait(defects=()):
    """A renewal stalls after its pending check found nothing; a writer that cannot reach Redis
    records its key as pending and waits out the fence; the renewal sets the fence. What a
    reader gets next."""
    reader = MemoryStore(cache=redis_alias(), defects=defects)
    writer = MemoryStore(cache="agentmemory", defects=defects)  # a tier instance of its own
    writer.remember("s", "k", "v1")
    warm(reader, "k")
    reader.cache.client.delete(reader.cache.fence_key)  # the fence expires
    hold = hold_next_renewal(lambda _s, _k: threading.current_thread().name == "renewer")
    renewer = threading.Thread(target=lambda: reader.recall("s", "k"), name="renewer")
    renewer.start()
    try:
        assert hold.reached.wait(5)
        cut = cut_off_next_write(lambda session_id, _keys: session_id == "s")
        assert writer.remember("s", "k", "v2").version == 2  # after the fence wait
        assert cut.reached.is_set() and writer.cache.stats["pending_recorded"] >= 1
    finally:
        disarm(hold)
        renewer.join()
    return reader.recall("s", "k"), reader


def test_a_renewal_that_stalls_after_its_pending_check_cannot_outlive_a_writers_wait():
    found, reader = renewal_stalled_past_a_writers_wait()
    assert (found.version, found.value) == (2, "v2")
    # The next renewal replays the pending key before Redis is trusted again.
    assert [reader.recall("s", "k").version for _ in range(3)] == [2, 2, 2]


def test_a_renewal_that_ignores_the_pending_keys_trusts_what_the_writer_could_not_update():
    found, reader = renewal_stalled_past_a_writers_wait([Defect.RENEWAL_IGNORES_PENDING])
    assert (found.version, reader.last_read_source) == (2, "database")  # no fence: renews
    # The renewal sets a fence of 1 s counted from the read's start: on a loaded machine it can
    # be gone by the next read, which renews again. Read until one is a hit: the pending key is
    # never replayed, so the hit is the version the writer could not update (with the real
    # store, replayed at the first renewal, no read ever is).
    for _ in range(5):
        found = reader.recall("s", "k")
        if reader.last_read_source == "cache":
            break
    assert (found.version, found.value, reader.last_read_source) == (1, "v1", "cache")


def test_a_fence_counted_from_its_renewal_outlives_the_writers_wait():
    found, reader = renewal_stalled_past_a_writers_wait([Defect.FENCE_FROM_RENEWAL])
    assert (found.version, found.value, reader.last_read_source) == (1, "v1", "cache")


def test_a_fill_older_than_a_crashed_writers_tombstone_is_refused():
    found = crash_during_a_fill(MemoryStore(cache=redis_alias()))
    assert (found.version, found.value) == (2, "v2")


def test_without_the_version_check_the_crashed_writers_version_is_lost_from_reads():
    store = MemoryStore(cache=redis_alias(), defects=[Defect.FILL_IGNORES_VERSION])
    found = crash_during_a_fill(store)
    assert (found.version, found.value, store.last_read_source) == (1, "v1", "cache")


def test_a_fill_whose_lease_a_write_deleted_is_refused_after_an_eviction():
    found = evict_before_a_fill(MemoryStore(cache=redis_alias()))
    assert (found.version, found.value) == (2, "v2")


def test_without_the_lease_check_an_evicted_write_is_lost_from_reads():
    store = MemoryStore(cache=redis_alias(), defects=[Defect.FILL_IGNORES_LEASE])
    found = evict_before_a_fill(store)
    assert (found.version, found.value, store.last_read_source) == (1, "v1", "cache")


def test_a_hold_nobody_reached_is_disarmed_and_never_stops_a_later_write():
    store = MemoryStore(cache=redis_alias())
    hold = crash_next_write(lambda session_id, _keys: session_id == "elsewhere")
    assert store.remember("s", "k", "v1").version == 1  # not selected: commits and answers
    disarm(hold)
    assert not hold.reached.is_set() and hold.taken is None
    assert store.remember("elsewhere", "k", "v1").version == 1  # disarmed: no crash


@pytest.mark.slow  # memcheck runs with their faults (the matrix leaves them to make test)
@pytest.mark.parametrize("planted", [(), (Defect.HIT_EXPIRY_UNCHECKED,)], ids=["real", "variant"])
def test_redis_clock_shows_a_hit_trusted_to_expire_with_its_entry_in_every_run(settings, planted):
    """memcheck's redis-clock fault, a staged race on a key of its own: a memory served from
    Redis, its entry stretched past the memory's expiry, read once the memory has expired. The
    store as it ships returns nothing; the variant whose hits are not checked for their memory's
    expiry returns the expired version -- an ``expired-read`` in every run, not only when a
    workload's read happened to fall in the window (a CI run once missed it three times)."""
    from agentmemory.consistency.runner import run_memcheck
    from agentmemory.consistency.workloads import WorkloadConfig

    redis_alias()
    for seed in range(2):
        result = run_memcheck(
            "default",
            WorkloadConfig(ops=30, workloads=("register",), seed=seed),
            faults="lock",
            defects=planted,
        )
        assert result.faults_injected.get("redis-clock") == 1, (
            result.faults_injected,
            result.fault_errors,
        )
        expired = [a for a in result.anomalies if a.check == "expired-read"]
        if planted:
            assert any(a.session_id.startswith("memcheck-clock-") for a in expired), (
                result.anomalies
            )
        else:
            assert result.anomalies == [] and result.fault_errors == []
