"""PostgreSQL HA (``scripts/pg-ha.sh``: Patroni and etcd on this machine, a leader and a streaming
replica): the store's one alias over both hosts (``target_session_attrs=read-write``) is on the
leader, and follows it across a switchover -- the connection the old leader drops is reopened by
the store's retry on whichever host is the primary now. Every wait is for an event Patroni or
PostgreSQL reports (a replica's replayed LSN, a new leader running, the old one streaming), never
a fixed sleep. ``make test`` runs the whole suite on this cluster too (backend ``pg-ha``)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

pytestmark = [pytest.mark.pg_ha, pytest.mark.django_db(transaction=True)]

#: Patroni's REST API of each node (scripts/pg-ha.sh: 8041, 8042).
API_PORTS = (8041, 8042)


def patroni(path: str, body: dict | None = None) -> Any:
    """The first node's answer that comes (JSON), GET or, with ``body``, POST."""
    last: Exception | None = None
    for port in API_PORTS:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                text = answer.read().decode()
        except (urllib.error.URLError, OSError) as error:
            last = error
            continue
        try:
            return json.loads(text)
        except ValueError:
            return text
    raise AssertionError(f"no Patroni REST API answered {path}: {last}")


def members() -> list[dict]:
    return patroni("/cluster")["members"]


def leader() -> dict:
    (found,) = [m for m in members() if m["role"] == "leader"]
    return found


def wait_for(event: Callable[[], Any], what: str, seconds: float = 60) -> Any:
    """Poll ``event`` until it answers something true: the cluster reports it; fail naming
    ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = event()
        except (AssertionError, ValueError, KeyError):
            found = None
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"the cluster did not report {what} within {seconds} s: {members()}")


def healthy() -> bool:
    """A running leader and every other member streaming from it."""
    found = members()
    return any(m["role"] == "leader" and m["state"] == "running" for m in found) and all(
        m["state"] == "streaming" for m in found if m["role"] != "leader"
    )


def server_of(alias: str = "default") -> tuple[bool, int]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_is_in_recovery(), inet_server_port()")
        in_recovery, port = cursor.fetchone()
    return in_recovery, port


def replayed_everywhere() -> bool:
    """Every replica has replayed all the leader's WAL (what was acknowledged is on it)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*), bool_and(replay_lsn >= pg_current_wal_lsn()) FROM pg_stat_replication"
        )
        count, caught_up = cursor.fetchone()
    return count == len(API_PORTS) - 1 and bool(caught_up)


@pytest.fixture(autouse=True)
def _cluster_healthy():
    wait_for(healthy, "a leader and a streaming replica")
    connections.close_all()
    yield
    connections.close_all()


def test_the_alias_is_on_the_leader_and_the_replica_streams():
    in_recovery, port = server_of()
    assert not in_recovery and port == leader()["port"]
    assert [m["state"] for m in members() if m["role"] != "leader"] == ["streaming"]


def test_the_store_follows_the_primary_across_a_switchover(store):
    store.remember("s", "k", {"n": 1})
    old = leader()
    wait_for(replayed_everywhere, "the replica replaying the write")
    (candidate,) = [m["name"] for m in members() if m["name"] != old["name"]]
    patroni("/switchover", {"leader": old["name"], "candidate": candidate})
    wait_for(lambda: leader()["name"] == candidate and healthy(), f"{candidate} leading")

    # The store's connection went with the old leader: its retry reconnects, to the new one.
    record = store.recall("s", "k")
    assert (record.version, record.value) == (1, {"n": 1})
    after = store.update("s", "k", lambda v: {"n": v["n"] + 1})
    assert (after.version, after.value) == (2, {"n": 2})
    assert server_of() == (False, leader()["port"])
    assert [v.version for v in store.history("s", "k")] == [1, 2]
