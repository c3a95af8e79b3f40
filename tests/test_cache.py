"""The Redis tier (semantics 6 and 7 with a cache): real Redis, never a fake.

Tests that break Redis start their own redis-server on a free port."""

from __future__ import annotations

import logging
import time

import pytest
from django.core.cache import caches
from django.db import transaction

from agentmemory import MemoryStore, clock
from agentmemory.cache import entry_version
from agentmemory.consistency.redis_servers import RedisServer

from .conftest import redis_alias, run_threads
from .helpers import hit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cached() -> MemoryStore:
    return MemoryStore(cache=redis_alias())


@pytest.fixture
def own_redis(settings, tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    settings.CACHES = {
        **settings.CACHES,
        "own": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
        },
    }
    settings.AGENTMEMORY = {"CACHE_FENCE_SECONDS": 0.5}
    yield server
    server.stop()


# ------------------------------------------------------------------ read and write paths


def test_recall_after_write_is_a_cache_hit_with_the_new_version(cached):
    cached.recall("s", "k")  # no fence yet: database, then the fence is renewed
    cached.remember("s", "k", {"v": 1})
    assert cached.recall("s", "k").value == {"v": 1}
    cached.remember("s", "k", {"v": 2})
    record = cached.recall("s", "k")
    assert (record.version, record.value) == (2, {"v": 2})
    assert cached.cache.stats["hits"] >= 2


def test_a_miss_fills_the_cache_from_the_database(cached):
    MemoryStore(cache=None).remember("s", "k", "from db")  # Redis never saw this write
    cached.recall("s", "k")  # renews the fence
    assert cached.recall("s", "k").value == "from db"  # miss: database, fill
    assert cached.recall("s", "k").value == "from db"  # hit
    assert cached.cache.stats["fills"] == 1 and cached.cache.stats["hits"] >= 1


def test_forget_is_cached_as_absent(cached):
    cached.recall("s", "k")
    cached.remember("s", "k", 1)
    cached.forget("s", "k")
    assert cached.recall("s", "k") is None
    assert cached.cache.stats["hits"] >= 1


def test_an_expired_entry_is_never_returned(cached):
    cached.recall("s", "k")
    cached.remember("s", "k", "short", ttl=30)
    assert cached.recall("s", "k").value == "short"
    clock.advance(31)
    assert cached.recall("s", "k") is None
    assert cached.recall_many("s", ["k"]) == {}


def test_the_entry_never_outlives_the_memory_ttl_in_redis(cached):
    cached.remember("s", "k", "short", ttl=2)
    client = caches["agentmemory"].client.get_client()
    ttl_ms = client.pttl(cached.cache.entry_key("s", "k"))
    assert 0 < ttl_ms <= 2000


def test_a_rolled_back_write_leaves_at_most_a_short_tombstone(cached):
    """Before its commit a write turns the entry into a tombstone of its version; rolled back, it
    leaves that tombstone (a miss, never its value) until TOMBSTONE_MS passes."""
    from agentmemory.cache import TOMBSTONE_MS

    cached.recall("s", "k")
    cached.remember("s", "k", "committed")
    assert hit(cached).value == "committed"

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        cached.remember("s", "k", "rolled back")
        raise Abort
    assert cached.recall("s", "k").value == "committed"
    assert cached.last_read_source == "database"
    assert 0 < cached.cache.client.pttl(cached.cache.entry_key("s", "k")) <= TOMBSTONE_MS


def test_inside_a_transaction_reads_see_its_writes_and_never_fill_redis(cached):
    cached.remember("s", "k", "v1")
    assert cached.recall("s", "k").value == "v1"  # Redis now holds v1

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        cached.remember("s", "k", "v2 (uncommitted)")
        assert cached.recall("s", "k").value == "v2 (uncommitted)"  # read your own write
        cached.remember("s", "new", "uncommitted")
        assert cached.recall("s", "new").value == "uncommitted"  # a miss: must not fill Redis
        assert cached.last_read_source == "database"
        raise Abort
    left = cached.cache.client.get(cached.cache.entry_key("s", "new"))
    assert left is None or entry_version(left) is None  # at most a tombstone, never a value
    assert cached.recall("s", "k").value == "v1"
    assert cached.recall("s", "new") is None


def test_a_slow_readers_fill_never_overwrites_a_newer_version(cached):
    cached.recall("s", "k")  # fence
    cached.remember("s", "k", "v1")
    caches["agentmemory"].client.get_client().delete(cached.cache.entry_key("s", "k"))  # evicted
    read = cached.cache.read("s", ["k"])["k"]  # the slow reader misses and takes the lease ...
    assert read.lease
    old = MemoryStore(cache=None).recall("s", "k")  # ... reads v1 from the database ...
    version = old.version
    cached.remember("s", "k", "v2")  # ... a writer commits v2 and updates Redis ...
    cached.cache.fill("s", "k", old, version, read.lease)  # ... the reader's fill comes late
    assert cached.cache.stats["stale_rejected"] == 1
    assert cached.recall("s", "k").version == 2


def test_a_fill_after_the_entry_was_evicted_is_rejected_too(cached):
    cached.recall("s", "k")
    cached.remember("s", "k", "v1")
    client = caches["agentmemory"].client.get_client()
    client.delete(cached.cache.entry_key("s", "k"))
    read = cached.cache.read("s", ["k"])["k"]
    old = MemoryStore(cache=None).recall("s", "k")
    version = old.version
    cached.remember("s", "k", "v2")
    client.delete(cached.cache.entry_key("s", "k"))  # v2's entry evicted before the late fill
    cached.cache.fill("s", "k", old, version, read.lease)
    assert cached.recall("s", "k").version == 2


def test_flushed_redis_only_causes_misses(cached):
    cached.recall("s", "k")
    for i in range(5):
        cached.remember("s", "k", i)
    caches["agentmemory"].clear()
    assert cached.recall("s", "k").value == 4
    assert cached.recall("s", "k").value == 4


def test_hot_key_misses_do_not_stampede_the_database(cached):
    MemoryStore(cache=None).remember("s", "hot", "value")
    cached.recall("s", "hot")  # renew the fence, but leave the entry cold
    caches["agentmemory"].client.get_client().delete(cached.cache.entry_key("s", "hot"))
    loads = []
    database = MemoryStore(cache=None)

    def counting_load(session_id, keys):
        loads.append(keys)
        found = database.recall_many(session_id, keys)
        return [(k, found[k].version, found[k]) for k in keys]

    def read(_worker):
        found, _source = cached.cache.read_through("s", ["hot"], counting_load)
        return found["hot"].value

    values = run_threads(read, 16)
    assert values == ["value"] * 16
    assert len(loads) <= 4, f"{len(loads)} of 16 concurrent misses went to the database"


def test_concurrent_writers_and_readers_never_read_older_than_acknowledged(cached):
    """Every read is checked against the newest version acknowledged before the read began."""
    cached.remember("s", "k", 0)
    acknowledged = [(0.0, 1)]  # (time acknowledged, version)
    stale = []

    def worker(index):
        for i in range(40):
            if index % 2 == 0:
                record = cached.remember("s", "k", [index, i])
                acknowledged.append((time.monotonic(), record.version))
            else:
                began = time.monotonic()
                floor = max(v for t, v in list(acknowledged) if t < began)
                record = cached.recall("s", "k")
                if record.version < floor:
                    stale.append((record.version, floor))

    run_threads(worker, 8)
    assert stale == []
    assert cached.cache.stats["hits"] > 0


# ------------------------------------------------------------------ faults, on a Redis of our own


def test_redis_refusing_connections_costs_only_the_database(own_redis, caplog):
    store = MemoryStore(cache="own")
    own_redis.stop()
    caplog.set_level(logging.WARNING, logger="agentmemory.cache")
    started = time.monotonic()
    for i in range(20):
        store.remember("s", "k", i)
        assert store.recall("s", "k").value == i
    assert time.monotonic() - started < 10
    assert store.cache.stats["errors"] >= 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentmemory.cache"]
    assert len(warnings) == 1 and "unreachable" in warnings[0], (
        "logged once per outage, not per call"
    )
    own_redis.start()  # back (same port): one more line says so
    store.cache._down_until = 0
    store.recall("s", "k")
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentmemory.cache"]
    assert len(warnings) == 2 and "reachable again" in warnings[1]


def test_paused_redis_resumed_with_old_contents_serves_no_stale_read(own_redis):
    """SIGSTOP Redis while it holds v1, write v2..v6 while it is paused, resume it with its old
    contents: no recall may return a version older than the last acknowledged one."""
    store = MemoryStore(cache="own")
    store.recall("s", "k")
    store.remember("s", "k", 1)
    assert store.recall("s", "k").version == 1
    assert store.cache.stats["hits"] >= 1
    own_redis.pause()
    try:
        for i in range(2, 7):
            record = store.remember("s", "k", i)
        assert record.version == 6
        during = [store.recall("s", "k").version for _ in range(5)]
    finally:
        own_redis.resume()
    store.cache._down_until = 0  # Redis is back: stop waiting out the breaker
    other = MemoryStore(cache="own")  # a fresh client too, with no memory of the outage
    after = [s.recall("s", "k").version for s in (store, other) for _ in range(10)]
    stale = [v for v in during + after if v < 6]
    assert stale == [], f"stale reads: {stale}"
    assert store.cache.stats["pending_recorded"] >= 1


def test_an_orm_delete_while_redis_is_paused_is_never_served_after(own_redis, settings):
    """The ORM's own write with Redis paused: the tier cannot drop the entry after the commit,
    so the key is recorded as pending and the call waits out the fence, as the store's own
    erase does -- after the resume, no client serves the deleted memory (#43)."""
    from agentmemory.models import Memory

    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": "own"}
    store = MemoryStore(cache="own")
    store.recall("s", "k")
    store.remember("s", "k", 1)
    assert store.recall("s", "k").version == 1 and store.cache.stats["hits"] >= 1
    own_redis.pause()
    try:
        Memory.objects.filter(session_id="s").delete()
    finally:
        own_redis.resume()
    assert Memory.objects.count() == 0
    other = MemoryStore(cache="own")  # a client with no memory of the outage
    assert [other.recall("s", "k") for _ in range(5)] == [None] * 5
    assert store.recall_many("s") == {}


def test_small_maxmemory_evictions_cause_misses_never_wrong_answers(settings, tmp_path):
    server = RedisServer(
        tmp_path / "tiny", extra=("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
    )
    server.start()
    try:
        settings.CACHES = {
            **settings.CACHES,
            "tiny": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url},
        }
        store = MemoryStore(cache="tiny")
        store.recall("s", "k0")
        big = "x" * 50_000
        latest = {}
        for round_number in range(3):
            for i in range(60):
                latest[f"k{i}"] = store.remember("s", f"k{i}", [round_number, big]).version
            for i in range(60):
                record = store.recall("s", f"k{i}")
                assert record.version == latest[f"k{i}"] and record.value[0] == round_number
        info = store.cache.client.info("stats")
        assert info["evicted_keys"] > 0
    finally:
        server.stop()


def test_memcheck_reports_a_cache_that_diverged_from_the_database(cached):
    from agentmemory.consistency.checker import cache_divergence
    from agentmemory.consistency.state import cached_entries, load_state

    cached.recall("s", "k")
    cached.remember("s", "k", "v1")  # Redis holds v1
    cached.remember("s", "other", "same")
    MemoryStore(cache=None).remember("s", "k", "v2")  # a write Redis never heard of
    state = load_state("default", ["s"])
    anomalies = cache_divergence(cached_entries(cached.cache, state), state)
    assert [(a.check, a.key, a.message) for a in anomalies] == [
        ("cache-divergence", "k", "Redis holds v1, the database v2")
    ]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_two_databases_sharing_one_redis_never_read_each_others_entries():
    """Staging and production, or two tenants' aliases, on one Redis database with the same
    prefix: each database's entries carry its identity, not the alias name."""
    alias = redis_alias()
    a, b = MemoryStore(using="default", cache=alias), MemoryStore(using="other", cache=alias)
    for i in range(5):
        a.remember("s", "k", f"from-a-{i}")
        a.recall("s", "k")
    assert b.remember("s", "k", "from-b").version == 1
    served = [b.recall("s", "k") for _ in range(5)]
    assert [(r.version, r.value) for r in served] == [(1, "from-b")] * 5
    assert (hit(b).version, hit(b).value) == (1, "from-b")  # B's own entry, not A's
    assert (a.recall("s", "k").version, a.recall("s", "k").value) == (5, "from-a-4")
    assert a.cache.prefix != b.cache.prefix


def test_the_put_script_never_rolls_an_entry_back_whatever_the_order(cached):
    """After-commit updates arriving out of order (a slow writer's behind a faster one's), a
    late fill, and a tombstone: Redis ends at the newest version each time."""
    from datetime import UTC, datetime

    from agentmemory import MemoryRecord

    cache, now = cached.cache, datetime.now(UTC)

    def record(version):
        return MemoryRecord("s", "k", f"v{version}", version, now, now, None)

    def cached_version():
        return entry_version(cache.client.get(cache.entry_key("s", "k")))

    cache.written("s", {"k": (record(3), 3)})
    cache.written("s", {"k": (record(2), 2)})  # the slower writer's update, late
    assert cached_version() == 3 and cache.stats["stale_rejected"] == 1
    cache.written("s", {"k": (record(3), 3)})  # the same version again: nothing changes
    assert cached_version() == 3
    assert cache.writing("s", {"k": 4})  # a write of v4 is committing: a tombstone
    assert cached_version() is None
    cache.written("s", {"k": (record(3), 3)})  # older than the tombstone: rejected
    assert cached_version() is None
    cache.written("s", {"k": (record(4), 4)})  # the committed version replaces it
    assert cached_version() == 4


def loader_of_the_database():
    """What the store's read-through loads from the database: (key, version, live record)."""
    plain = MemoryStore(cache=None)

    def load(session_id, keys):
        found = plain.recall_many(session_id, keys)
        return [(k, found[k].version if k in found else 0, found.get(k)) for k in keys]

    return load


def test_recall_many_through_redis_never_sees_half_of_a_remember_many(cached):
    """Key a is a hit of v1 in Redis, key b a miss; a remember_many of both commits between the
    Redis read and the database read: the answer is v1 of both or v2 of both, never a mix."""
    cached.recall("s", "a")  # the fence
    cached.remember_many("s", {"a": "v1", "b": "v1"})
    caches["agentmemory"].client.get_client().delete(cached.cache.entry_key("s", "b"))  # evicted
    reads = cached.cache.read("s", ["a", "b"])
    assert reads["a"].hit and not reads["b"].hit
    cached.remember_many("s", {"a": "v2", "b": "v2"})
    found, source = cached.cache.read_through("s", ["a", "b"], loader_of_the_database(), reads)
    assert {k: r.value for k, r in found.items()} == {"a": "v2", "b": "v2"}
    assert source == "database"


def test_a_read_of_several_keys_sees_redis_at_one_instant(own_redis):
    """Every key of a recall_many is read from Redis at one instant: a remember_many's
    tombstones, set by one script, are seen on all of its keys or none. Warm, by one MGET (no
    script); with a miss among them, that MGET and then one script for every key -- never the
    MGET's hits with the script's answer for the rest. (A Redis of the test's own: its command
    statistics are reset.)"""
    from agentmemory.cache import READ_MANY_SCRIPT, READ_SCRIPT

    cached = MemoryStore(cache="own")
    cached.recall("s", "a")
    cached.remember_many("s", {"a": 1, "b": 2, "c": 3})
    client = cached.cache.client

    def read() -> tuple[dict, dict]:
        client.execute_command("CONFIG", "RESETSTAT")
        found = cached.cache.read("s", ["a", "b", "c"])
        stats = client.info("commandstats")
        calls = {
            name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("mget", "evalsha")
        }
        return {k: r.record.value for k, r in found.items() if r.hit}, calls

    assert read() == ({"a": 1, "b": 2, "c": 3}, {"mget": 1, "evalsha": 0})
    client.delete(cached.cache.entry_key("s", "b"))
    assert read() == ({"a": 1, "c": 3}, {"mget": 1, "evalsha": 1})
    assert READ_MANY_SCRIPT != READ_SCRIPT


def test_a_pending_key_recorded_while_a_reader_replays_keeps_the_fence_down(settings):
    """The order that keeps a fence renewal from trusting a stale entry: a reader that found no
    fence reads the pending keys (one old record, x), and is held there; meanwhile a writer whose
    Redis is unreachable commits k2 v2, records k2 as pending and -- the oldest record being x,
    older than a fence period -- acknowledges at once, leaving Redis with k2 v1. The reader
    replays x. Whatever it does next, k2 v1 is never served: the fence is renewed only by a
    later call whose own pending check finds k2 (a renewal in the replaying call would trust
    Redis with k2's stale entry)."""
    import threading
    from datetime import timedelta

    from django.db import connection, connections
    from django.utils import timezone

    from agentmemory.models import PendingInvalidation

    alias = redis_alias()
    settings.CACHES = {
        **settings.CACHES,
        # The same names as the tier's (a copy of its settings) on a port nothing listens on.
        "unreachable": {
            **settings.CACHES[alias],
            "LOCATION": "redis://127.0.0.1:1/15",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.05, "SOCKET_TIMEOUT": 0.05},
        },
    }
    reader = MemoryStore(cache=alias, namespace="fence-order")
    reader.recall("s", "k1")
    reader.remember("s", "k1", "v1")
    reader.remember("s", "k2", "v1")
    assert hit(reader, "s", "k2").value == "v1"
    x = PendingInvalidation.objects.create(session_id="s", key="x")
    PendingInvalidation.objects.filter(id=x.id).update(
        created_at=timezone.now() - timedelta(seconds=60)
    )
    reader.cache.client.delete(reader.cache.fence_key)  # the fence has lapsed
    checked, go_on = threading.Event(), threading.Event()

    def hold_after_the_pending_check(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "pendinginvalidation" in sql.lower() and sql.lstrip().upper().startswith("SELECT"):
            checked.set()
            assert go_on.wait(30)
        return result

    def read_k1():
        try:
            with connection.execute_wrapper(hold_after_the_pending_check):
                reader.recall("s", "k1")
        finally:
            connections.close_all()

    thread = threading.Thread(target=read_k1)
    thread.start()
    assert checked.wait(30)
    writer = MemoryStore(cache="unreachable", namespace="fence-order")
    assert writer.remember("s", "k2", "v2").version == 2  # acknowledged, Redis never updated
    go_on.set()
    thread.join(30)
    assert reader.cache.client.get(reader.cache.entry_key("s", "k2")) is not None  # still v1
    assert [reader.recall("s", "k2").value for _ in range(5)] == ["v2"] * 5
