"""Semantic 7 when Redis loses writes it acknowledged: restarted from an older RDB snapshot (at
several restart delays, inside and past the fence's lifetime), crashed with an AOF that lost its
last second, and a Sentinel failover to a replica. Every Redis here is one of the test's own, on a
free loopback port (agentmemory.consistency.redis_servers). ``CACHE_PROTECTION=False`` is the seam
that shows each scenario does serve the older version without the protection."""

from __future__ import annotations

import shutil
import socket
import time

import pytest
from django.core.cache import caches

from agentmemory import MemoryStore
from agentmemory.cache import entry_version
from agentmemory.consistency import redis_servers
from agentmemory.consistency.redis_servers import RedisServer, SentinelGroup
from agentmemory.defects import Defect
from project.settings import redis_cache

from .helpers import hit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RECALLS = 20


def cache_on(settings, alias, location, sentinels=None):
    """A cache alias configured as the README tells users to (project.settings.redis_cache)."""
    settings.CACHES = {**settings.CACHES, alias: redis_cache(location, sentinels)}
    return MemoryStore(cache=alias)


def warm(store):
    """v1 written and served from Redis (the fence renewed by the first read)."""
    store.remember("s", "k", "v1")
    assert hit(store).version == 1


def recalls(store):
    return [store.recall("s", "k").version for _ in range(RECALLS)]


def acknowledged_v2(store, server):
    record = store.remember("s", "k", "v2")
    raw = server.client().get(store.cache.entry_key("s", "k"))
    assert record.version == 2 and entry_version(raw) == 2  # Redis acknowledged the update
    return record


# The restart delay is the scenario's parameter (the fence lives 1 s): the server is down that
# long. Nothing waits for an event by sleeping; the restart itself waits until Redis is ready.
@pytest.mark.parametrize("delay", [0.0, 0.5, 1.5, 3.0])
def test_redis_restarted_from_an_older_snapshot_never_serves_the_older_version(
    tmp_path, settings, delay
):
    with RedisServer(tmp_path) as server:
        store = cache_on(settings, "restartable", server.url)
        warm(store)
        server.save()  # the snapshot holds v1 and a live fence
        acknowledged_v2(store, server)
        server.kill()
        time.sleep(delay)
        server.start()  # back from the snapshot: v1, and maybe the fence
        assert recalls(store) == [2] * RECALLS


@pytest.mark.parametrize("delay", [0.0, 3.0])
def test_without_the_protection_a_restarted_redis_serves_the_older_version(
    tmp_path, settings, delay
):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": False}
    with RedisServer(tmp_path) as server:
        store = cache_on(settings, "restartable", server.url)
        warm(store)
        server.save()
        acknowledged_v2(store, server)
        server.kill()
        time.sleep(delay)
        server.start()
        assert 1 in recalls(store)


def test_a_warm_read_is_one_plain_mget(tmp_path, settings):
    """A warm hit of one key, and of several, is a single MGET of the entries and the fence: no
    script, no INFO -- the server's identity was asked once, on the connection."""
    with RedisServer(tmp_path) as server:
        store = cache_on(settings, "counted", server.url)
        warm(store)
        store.remember_many("s", {"a": 1, "b": 2})
        store.recall_many("s", ["a", "b"])
        before = server.client().info("commandstats")
        recalls(store)
        assert store.recall_many("s", ["a", "b", "k"]).keys() == {"a", "b", "k"}
        assert store.last_read_source == "cache"
        after = server.client().info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): stats["calls"] - before.get(name, {"calls": 0})["calls"]
        for name, stats in after.items()
    }
    assert calls.get("mget") == RECALLS + 1, calls
    assert not calls.get("evalsha") and not calls.get("eval"), calls
    assert calls.get("info", 0) <= 1, calls  # the one INFO commandstats of this test


def test_a_warm_read_that_kept_the_first_servers_identity_serves_the_older_version(
    tmp_path, settings
):
    """The seam of the warm read's soundness: a connection that reconnects to a restarted Redis
    must learn the new server's run_id. The SERVER_ID_KEPT defect keeps the first one, and the
    entries the restart reloaded from the snapshot are served (the test above, broken)."""
    with RedisServer(tmp_path) as server:
        cache_on(settings, "restartable", server.url)
        store = MemoryStore(cache="restartable", defects={Defect.SERVER_ID_KEPT})
        warm(store)
        server.save()
        acknowledged_v2(store, server)
        server.kill()
        server.start()
        assert 1 in recalls(store)


def lose_the_aof_tail(server, kept):
    """What a host crash does to ``appendfsync everysec``: the AOF comes back as it was before
    its last second (``kept``, copied then), though Redis had acknowledged what followed."""
    server.kill()
    shutil.rmtree(server.directory / "appendonlydir")
    shutil.copytree(kept, server.directory / "appendonlydir")
    server.start()


@pytest.mark.parametrize("protected", [True, False])
def test_redis_crashed_with_an_aof_that_lost_its_last_second(tmp_path, settings, protected):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": protected}
    with RedisServer(tmp_path / "redis", appendonly=True) as server:
        store = cache_on(settings, "aof", server.url)
        warm(store)
        kept = shutil.copytree(server.directory / "appendonlydir", tmp_path / "kept")
        acknowledged_v2(store, server)
        lose_the_aof_tail(server, kept)
        served = recalls(store)
    if protected:
        assert served == [2] * RECALLS
    else:
        assert 1 in served


def test_a_sentinel_failover_right_after_an_acknowledged_update(tmp_path, settings):
    """django-redis' Sentinel support, a primary, a replica and three sentinels: the primary is
    killed right after Redis acknowledged v2; the sentinels promote the replica."""
    with SentinelGroup(tmp_path) as group:
        sentinels = ",".join(f"{host}:{port}" for host, port in group.addresses)
        store = cache_on(settings, "sentinel", f"redis://{group.NAME}/0", sentinels)
        warm(store)
        acknowledged_v2(store, group.primary)
        group.fail_over()
        assert recalls(store) == [2] * RECALLS
        store.remember("s", "k", "v3")  # and the promoted primary takes writes
        assert recalls(store) == [3] * RECALLS
        assert hit(store).version == 3


def test_flushall_eviction_and_a_pause_only_cause_misses(tmp_path, settings):
    with RedisServer(tmp_path) as server:
        store = cache_on(settings, "volatile", server.url)
        warm(store)
        server.client().flushall()
        assert recalls(store) == [1] * RECALLS
        store.remember("s", "k", "v2")
        server.client().delete(store.cache.entry_key("s", "k"))  # evicted
        assert recalls(store) == [2] * RECALLS
    caches.close_all()


def _write_v2_and_die(cache_alias):
    from agentmemory.defects import die_after_commit

    store = MemoryStore(cache=cache_alias, namespace="killed-writer")
    with die_after_commit():
        store.remember("s", "k", "v2")
    raise AssertionError("the writer was to die after its commit")


@pytest.mark.parametrize("protected", [True, False])
def test_a_writer_killed_between_its_commit_and_its_redis_update(settings, protected):
    """A writer process dies (SIGKILL) right after its COMMIT of v2, before it updates Redis,
    which held v1. Every reader then gets v2 -- from Redis, or a miss read from the database --
    never v1. Without the protection (no tombstone before the commit), Redis serves v1."""
    import signal

    from django.db import connections

    from .conftest import redis_alias
    from .helpers import run_until_it_dies

    alias = redis_alias()
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": alias, "CACHE_PROTECTION": protected}
    store = MemoryStore(cache=alias, namespace="killed-writer")
    warm(store)
    connections.close_all()
    code = run_until_it_dies(_write_v2_and_die, (alias,), settings.AGENTMEMORY)
    assert code == -signal.SIGKILL
    assert MemoryStore(cache=None).recall("s", "k").value == "v2"  # it committed
    readers = [store, MemoryStore(cache=alias, namespace="killed-writer")]
    seen = {reader.recall("s", "k").value for reader in readers for _ in range(RECALLS)}
    if protected:
        assert seen == {"v2"}
    else:
        assert "v1" in seen  # the test bites: an unprotected tier serves the older version


# The servers above are the suite's and memcheck's own, on ports chosen free. A chosen port can
# be taken before the server binds it (by another lane's server, or by the kernel handing one port
# to two probes: a CI run lost a sentinel group that way). ``free_port`` is the seam: it is told
# to hand out a taken port.


def test_a_server_whose_chosen_port_is_taken_starts_on_another(tmp_path, monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        handed = iter([taken])
        real = redis_servers.free_port
        monkeypatch.setattr(redis_servers, "free_port", lambda: next(handed, None) or real())
        with RedisServer(tmp_path) as server:
            assert server.port != taken
            assert server.client().info()["process_id"] == server.process.pid


def test_a_sentinel_group_told_one_port_twice_starts_every_sentinel_on_its_own(
    tmp_path, monkeypatch
):
    real, handed = redis_servers.free_port, []

    def once_twice():  # primary, replica, sentinel0, sentinel1, sentinel2 = sentinel1's port
        port = handed[-1] if len(handed) == 4 else real()
        handed.append(port)
        return port

    monkeypatch.setattr(redis_servers, "free_port", once_twice)
    with SentinelGroup(tmp_path) as group:
        assert handed[3] == handed[4]  # the seam did hand one port out twice
        assert len(set(group.sentinel_ports)) == 3
        pids = {group.sentinel_client(i).info("server")["process_id"] for i in range(3)}
        assert pids == {process.pid for process in group.sentinels}
        assert group.primary_port() == group.primary.port
