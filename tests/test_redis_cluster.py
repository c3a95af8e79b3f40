"""The Redis tier on Redis Cluster (agentmemory.redis_cluster, the groups of agentmemory.cache):
each session's names in one slot, a warm read still one MGET, and the cluster's own faults -- a
primary killed and its replica promoted without the last acknowledged write, a slot migrated
under traffic, a whole shard down -- cost misses, never a stale version. Every cluster here is
the test's own: six ``redis-server --cluster-enabled yes`` on free loopback ports
(:class:`~agentmemory.consistency.redis_servers.ClusterGroup`). ``CACHE_PROTECTION=False`` is the
seam that shows the failover does serve the older version without the protection."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from agentmemory import MemoryStore
from agentmemory.cache import CLUSTER_GROUPS, entry_version
from agentmemory.checks import check_cache_server
from agentmemory.consistency.faults import CACHE_FAULTS, CLUSTER_FAULTS
from agentmemory.consistency.redis_servers import ClusterGroup
from agentmemory.models import Memory
from agentmemory.redis_cluster import cluster_url, startup_nodes
from project.settings import redis_cache

from .helpers import hit, run_memcheck

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RECALLS = 20


@pytest.fixture
def cluster(tmp_path):
    with ClusterGroup(tmp_path / "cluster") as group:
        yield group
    caches.close_all()


def cache_on(settings, location, alias="cluster"):
    """A cache alias configured as the README tells users to (project.settings.redis_cache)."""
    settings.CACHES = {**settings.CACHES, alias: redis_cache(location)}
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": alias}
    return MemoryStore(cache=alias)


def slot_owner(store, cluster, session_id):
    slot = cluster.slot_of(store.cache.group(session_id).fence)
    return slot, cluster.owner(slot)


def sessions_apart(store, cluster):
    """Two session ids whose groups are on two different primaries."""
    first = "s"
    _, owner = slot_owner(store, cluster, first)
    for n in range(200):
        other = f"other-{n}"
        if slot_owner(store, cluster, other)[1].port != owner.port:
            return first, other
    raise AssertionError("200 sessions, all on one primary")


def wait_until(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def recalls(store, session_id="s"):
    return [store.recall(session_id, "k").version for _ in range(RECALLS)]


def test_each_sessions_names_share_one_slot_and_the_sessions_spread_over_every_primary(
    cluster, settings
):
    store = cache_on(settings, cluster.url)
    assert store.cache.clustered and len(store.cache.groups) == CLUSTER_GROUPS
    owners = set()
    for n in range(40):
        session_id = f"session-{n}"
        store.remember(session_id, "k", n)
        assert hit(store, session_id).value == n
        group = store.cache.group(session_id)
        names = [
            store.cache.entry_key(session_id, "k"),
            store.cache.lease_key(session_id, "k"),
            group.fence,
            group.epoch,
            group.lineage,
            group.incarnation,
            group.recent,
            group.checking,
        ]
        slots = {cluster.slot_of(name) for name in names}
        assert len(slots) == 1, (session_id, names)
        owner = cluster.owner(slots.pop())
        assert owner.client().exists(store.cache.entry_key(session_id, "k"))
        owners.add(owner.port)
    assert owners == {node.port for node in cluster.primaries()}


def test_a_warm_read_on_a_cluster_is_one_plain_mget(cluster, settings):
    store = cache_on(settings, cluster.url)
    store.remember("s", "k", "v1")
    store.remember_many("s", {"a": 1, "b": 2})
    hit(store)
    store.recall_many("s", ["a", "b"])
    _, owner = slot_owner(store, cluster, "s")
    before = owner.client().info("commandstats")
    recalls(store)
    assert store.recall_many("s", ["a", "b", "k"]).keys() == {"a", "b", "k"}
    assert store.last_read_source == "cache"
    after = owner.client().info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): stats["calls"] - before.get(name, {"calls": 0})["calls"]
        for name, stats in after.items()
    }
    assert calls.get("mget") == RECALLS + 1, calls
    assert not calls.get("evalsha") and not calls.get("eval"), calls


@pytest.mark.parametrize("protected", [True, False])
def test_a_replica_promoted_without_the_last_acknowledged_update(cluster, settings, protected):
    """The session's primary acknowledges v2 while its replica is paused, then is killed; the
    cluster promotes the replica, which holds v1 (and maybe a fence). The entry was stored by
    another server process: a miss, read from the database. Without the protection the promoted
    replica's v1 is served."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": protected}
    store = cache_on(settings, cluster.url)
    store.remember("s", "k", "v1")
    assert hit(store).version == 1
    slot, primary = slot_owner(store, cluster, "s")

    def acknowledged_v2():
        assert store.remember("s", "k", "v2").version == 2
        raw = primary.client().get(store.cache.entry_key("s", "k"))
        assert entry_version(raw) == 2  # Redis acknowledged the update

    _, promoted = cluster.fail_over(slot, meanwhile=acknowledged_v2)
    assert entry_version(promoted.client().get(store.cache.entry_key("s", "k"))) == 1
    served = recalls(store)
    if protected:
        assert served == [2] * RECALLS
        store.remember("s", "k", "v3")  # the promoted primary takes writes
        assert hit(store).version == 3
    else:
        assert 1 in served


def test_a_slot_migrated_under_traffic_serves_no_stale_version(cluster, settings):
    """The group's slot moves to another primary, ten keys per MIGRATE; after each batch a key
    is written and every key read back: each read gives the newest version. Entries that moved
    were stored by another process: misses, refilled on the new primary."""
    store = cache_on(settings, cluster.url)
    keys = [f"k{n}" for n in range(30)]
    store.remember_many("s", {key: 0 for key in keys})
    newest = dict.fromkeys(keys, 1)
    for key in keys:
        hit(store, "s", key)
    slot, source = slot_owner(store, cluster, "s")
    target = next(node for node in cluster.primaries() if node.port != source.port)
    steps = []

    def write_and_read():
        key = keys[len(steps) % len(keys)]
        newest[key] = store.remember("s", key, len(steps) + 1).version
        found = {key: record.version for key, record in store.recall_many("s", keys).items()}
        steps.append(found)
        assert found == newest, (len(steps), store.last_read_source)
        for key in keys[:3]:
            assert store.recall("s", key).version == newest[key]

    cluster.migrate_slot(slot, target, between=write_and_read)
    assert len(steps) >= 3  # the move took several batches, traffic between each
    write_and_read()
    assert cluster.owner(slot).port == target.port
    # A script that met a half-moved slot (TRYAGAIN until redis-py gave up) stopped calls about
    # the group for a moment: wait for that moment to end.
    wait_until(lambda: store.cache.up("s"))
    assert hit(store, "s", "k0").version == newest["k0"]
    assert target.client().exists(store.cache.entry_key("s", "k0"))


def test_a_whole_shard_down_costs_its_own_sessions_hits_only(cluster, settings):
    """A primary and its replica killed: the sessions of its slots are read and written through
    the database (correct, never an error), while another primary's sessions are still served
    by Redis."""
    store = cache_on(settings, cluster.url)
    down, up = sessions_apart(store, cluster)
    for session_id in (down, up):
        store.remember(session_id, "k", "v1")
        hit(store, session_id)
    slot, _ = slot_owner(store, cluster, down)
    cluster.down(slot)
    assert recalls(store, down) == [1] * RECALLS
    assert store.remember(down, "k", "v2").version == 2
    assert recalls(store, down) == [2] * RECALLS
    assert store.last_read_source == "database"
    assert hit(store, up).version == 1
    store.remember(up, "k", "v2")
    assert hit(store, up).version == 2


def test_repair_and_forget_everything_reach_every_group(cluster, settings):
    store = cache_on(settings, cluster.url)
    sessions = [f"session-{n}" for n in range(24)]
    for session_id in sessions:
        store.remember(session_id, "k", "v1")
        hit(store, session_id)
    table = connection.ops.quote_name(Memory._meta.db_table)
    with connection.cursor() as cursor:  # behind the store's back: no invalidation
        cursor.execute(
            f"UPDATE {table} SET version = version + 5 WHERE session_id = %s", ["session-7"]
        )
    compared, fixed = store.cache.repair()
    assert compared == len(sessions)
    assert [pair for pair, _ in fixed] == [("session-7", "k")]
    store.cache.forget_everything()
    left = [
        name
        for node in cluster.primaries()
        for name in node.client().scan_iter(match=f"{store.cache.prefix}*m:*")
    ]
    assert left == []
    assert [store.recall(s, "k").value for s in sessions] == ["v1"] * len(sessions)


def test_the_cache_check_names_a_cluster_node_behind_a_plain_client(cluster, settings):
    node = cluster.primaries()[0]
    cache_on(settings, f"redis://127.0.0.1:{node.port}/0")
    (error,) = check_cache_server()
    assert error.id == "agentmemory.E024" and "node of a Redis Cluster" in error.msg
    cache_on(settings, f"redis-cluster://127.0.0.1:{node.port}/3", alias="numbered")
    (error,) = check_cache_server()
    assert error.id == "agentmemory.E024" and "database 0 only" in error.msg
    cache_on(settings, cluster.url, alias="right")
    assert check_cache_server() == []


def memcheck_json(*args):
    code, out = run_memcheck(*args, "--format", "json")
    return code, json.loads(out)


def test_memcheck_drives_every_cache_fault_against_a_cluster_of_its_own(cluster, settings):
    """With the project's cache on a cluster, ``--faults cache`` starts a cluster of memcheck's
    own and injects the Redis faults there -- a connection kill, a pause, a restart from an
    older snapshot, a failover, and the cluster's own: a slot migrated under traffic, a whole
    shard down -- with the tier's quiet faults; nothing is stale, lost or expired."""
    cache_on(settings, cluster.url)
    code, report = memcheck_json("--faults", "cache", "--seconds", "8", "--workers", "6")
    faults = report["faults"]
    assert faults["errors"] == [], faults["errors"]
    assert code == 0, ([(a["check"], a["message"]) for a in report["anomalies"][:5]], faults)
    expected = {*CACHE_FAULTS, *CLUSTER_FAULTS}
    assert expected <= set(faults["injected"]), faults
    assert faults["redis"].startswith("memcheck's own Redis Cluster"), faults["redis"]


def test_the_cluster_faults_catch_a_tier_without_its_protection(cluster, settings):
    """The same faults bite: without the server identity check, the tombstones and the pending
    records (the seam: CACHE_PROTECTION=False), readers are served stale versions."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": False}
    cache_on(settings, cluster.url)
    found: Counter[str] = Counter()
    for seed in range(3):
        code, report = memcheck_json("--faults", "cache", "--seconds", "6", "--seed", str(seed))
        found.update(a["check"] for a in report["anomalies"])
        if found["stale-read"]:
            break
    assert code == 1 and found["stale-read"] >= 1, found


@pytest.mark.parametrize(
    ("location", "says"),
    [
        ("redis://127.0.0.1:7000", "scheme"),
        ("redis-cluster://127.0.0.1", "host:port"),
        ("redis-cluster://:7000", "host:port"),
        ("redis-cluster://127.0.0.1:7000/1", "database 0 only"),
        (" redis-cluster ://127.0.0.1:7000", "scheme"),
    ],
)
def test_a_wrong_cluster_location_is_refused_naming_what_is_wrong(location, says):
    with pytest.raises(ImproperlyConfigured, match=says):
        cluster_url(location)


def test_every_node_of_the_location_is_a_startup_node():
    first, nodes = startup_nodes(["rediss-cluster://u:p@10.0.0.1:7000", "10.0.0.2:7001 "])
    assert first == "rediss://u:p@10.0.0.1:7000"
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]


def test_the_status_command_names_the_cluster_and_its_groups_fences(cluster, settings):
    from io import StringIO

    from django.core.management import call_command

    store = cache_on(settings, cluster.url)
    store.remember("s", "k", "v1")
    hit(store)
    out = StringIO()
    call_command("agentmemory_status", stdout=out)
    text = out.getvalue()
    assert "Redis Cluster cache 'cluster' reachable (3 primaries)" in text, text
    assert f"up in 1 of {CLUSTER_GROUPS} groups of sessions" in text, text
