"""PostgreSQL HA (``scripts/pg-ha.sh``: Patroni and etcd on this machine, a leader and a streaming
replica): the store's one alias over both hosts (``target_session_attrs=read-write``) is on the
leader and follows it across a switchover; across a crash of the leader that an asynchronous
standby's promotion loses writes with, the Redis tier serves none of them (in the writing process
and in a new one) and every write after it is recalled at once; a COMMIT whose wait for the
synchronous standby was cancelled is not acknowledged; checks W007; and memcheck's db-failover
fault, asynchronous (only the database's losses) and synchronous (nothing). Every wait is for an
event Patroni or PostgreSQL reports (a replica's replayed LSN, a new leader running, a COMMIT
waiting for the standby), never a fixed sleep. ``make test`` runs the whole suite on this cluster
too (backend ``pg-ha``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from agentmemory import MemoryStore, MemoryUnavailable
from agentmemory.checks import check_durable_commits
from agentmemory.consistency import recorded
from agentmemory.consistency.pg_failover import (
    FAILOVER_TIMEOUT_SECONDS,
    crash_primary,
    fail_over,
    replication_stopped,
)
from agentmemory.consistency.state import cached_versions

from .conftest import redis_alias
from .helpers import hit, run_processes

pytestmark = [pytest.mark.pg_ha, pytest.mark.django_db(transaction=True)]

#: Patroni's REST API of each node (scripts/pg-ha.sh: 8041, 8042).
API_PORTS = (8041, 8042)
#: Where scripts/pg-ha.sh keeps the cluster (its nodes' Patroni logs).
PG_HA_DIR = os.environ.get("PG_HA_DIR", "/tmp/agentmemory-pg-ha")


def patroni(path: str, body: dict | None = None, method: str | None = None) -> Any:
    """The first node's answer that comes (JSON), GET or, with ``body``, POST (or ``method``)."""
    last: Exception | None = None
    for port in API_PORTS:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method=method,
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
    # As long as memcheck's failover fault gives the crashed node to stream again: on a loaded
    # machine a rejoin (pg_rewind, then recovery) after the test before took more than 60 s.
    wait_for(healthy, "a leader and a streaming replica", seconds=FAILOVER_TIMEOUT_SECONDS)
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


# ---------------------------------------------------------------------- a failover that loses writes


@pytest.fixture
def cluster_restored():
    """After the test, the crashed node started again (Patroni rewinds it and it streams from
    the new leader): the next test finds a healthy cluster."""
    yield
    subprocess.run(["bash", "scripts/pg-ha.sh", "start"], check=True, capture_output=True)
    wait_for(healthy, "the crashed node streaming again", seconds=120)


def what_is_recalled(pairs: list[tuple[str, str]], store: MemoryStore | None = None) -> list[Any]:
    """Recall each (session, key) through the Redis tier (a fresh process runs this too):
    (version, value) or None."""
    store = store or MemoryStore(cache="agentmemory")
    found = []
    for session_id, key in pairs:
        record = store.recall(session_id, key)
        found.append(None if record is None else [record.version, record.value])
    return found


def test_a_failover_that_loses_acknowledged_writes_never_lets_redis_serve_them(
    cluster_restored,
):
    """Asynchronous replication (Patroni's default): writes acknowledged while the replica
    received nothing are lost when the leader crashes. That loss is the database's; the cache
    tier must add nothing: every recall after the failover -- in the process that made the
    writes and in a new one -- returns exactly what the promoted database holds, and a write
    acknowledged after the failover is recalled at once."""
    store = MemoryStore(cache=redis_alias())
    for i in range(5):
        store.remember("kept", f"k{i}", {"n": 1})
    store.remember("kept", "forgotten", {"n": 1})
    wait_for(replayed_everywhere, "the replica replaying the first versions")

    # The leader sends the replica nothing more: what follows is acknowledged, never replicated.
    old = leader()
    with replication_stopped("default"):
        for i in range(5):
            store.remember("kept", f"k{i}", {"n": 2, "lost": True})
        store.forget("kept", "forgotten")
        for i in range(3):
            store.remember("kept", f"new{i}", {"lost": True})
            store.remember("gone", f"g{i}", {"lost": True})
        pairs = [("kept", f"k{i}") for i in range(5)] + [("kept", "forgotten")]
        pairs += [("kept", f"new{i}") for i in range(3)] + [("gone", f"g{i}") for i in range(3)]
        before = what_is_recalled(pairs, store)
        assert hit(store, *pairs[-1]).value == {"lost": True}  # served from Redis
        assert before[:6] == [[2, {"n": 2, "lost": True}]] * 5 + [None]
        crash_primary("default")

    wait_for(
        lambda: leader()["name"] != old["name"] and leader()["state"] == "running",
        "the replica promoted",
    )
    # What the promoted database holds: the first versions only.
    held = [[1, {"n": 1}]] * 6 + [None] * 6

    assert what_is_recalled(pairs, store) == held  # the process that made the lost writes
    (in_a_new_process,) = run_processes(what_is_recalled, [(pairs,)])
    assert in_a_new_process == held
    assert MemoryStore(cache=None).recall("kept", "k0").version == 1  # the database agrees

    # Acknowledged after the failover: recalled at once, by this process and a new one.
    after = [store.remember("kept", f"k{i}", {"n": 3}) for i in range(5)]
    assert [r.version for r in after] == [2] * 5  # the lost version 2 is written anew
    store.remember("gone", "g0", {"again": True})
    now = [[2, {"n": 3}]] * 5 + [[1, {"n": 1}]] + [None] * 3 + [[1, {"again": True}]] + [None] * 2
    assert what_is_recalled(pairs, store) == now
    assert run_processes(what_is_recalled, [(pairs,)]) == [now]
    assert [v.version for v in store.history("kept", "k0")] == [1, 2]


# ---------------------------------------------------------------------- synchronous replication
@pytest.fixture
def synchronous_mode():
    """Patroni's synchronous_mode_strict for the test (the replica becomes the synchronous
    standby: every COMMIT waits for it, and Patroni never falls back to asynchronous replication
    when the standby stops answering), asynchronous again after it."""
    set_synchronous_mode(True)
    wait_for(
        lambda: synchronous_everywhere() and leader_applied(synchronous_mode=True),
        "a synchronous standby, in every node's view and the primary's",
    )
    yield
    set_synchronous_mode(False)
    wait_for(
        lambda: (
            "sync_standby" not in [m["role"] for m in members()]
            and healthy()
            and leader_applied(synchronous_mode=False)
        ),
        "asynchronous replication again",
    )


def set_synchronous_mode(on: bool) -> None:
    patroni("/config", {"synchronous_mode": on, "synchronous_mode_strict": on}, method="PATCH")


def leader_applied(**dynamic: Any) -> bool:
    """The leader's Patroni has reloaded its configuration with these dynamic settings: it
    caches them in ``patroni.dynamic.json`` right after. The HA cycle that first sees a change
    applies synchronous mode (``/sync``, ``synchronous_standby_names``) before that reload, and
    the reload writes ``postgresql.conf`` without ``synchronous_standby_names`` until the next
    cycle sets it again (Patroni 4.1): a COMMIT in that gap waits for nothing."""
    cached = Path(PG_HA_DIR) / leader()["name"] / "data" / "patroni.dynamic.json"
    settings = json.loads(cached.read_text())
    return all(settings.get(name) == value for name, value in dynamic.items())


def synchronous_everywhere() -> bool:
    """Patroni's synchronous mode in force: each node's REST API (a replica's view of the DCS
    may lag the leader's) names one synchronous standby, and the primary itself has it in
    ``synchronous_standby_names`` and streaming as ``sync`` -- what makes a COMMIT wait."""
    for port in API_PORTS:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/cluster", timeout=30) as answer:
            roles = [m["role"] for m in json.loads(answer.read())["members"]]
        if roles.count("sync_standby") != 1:
            return False
    return healthy() and primary_waits_for_a_standby()


def primary_waits_for_a_standby() -> bool:
    """The primary's ``synchronous_standby_names`` is set and a standby streams as ``sync``."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW synchronous_standby_names")
        (names,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
        (synchronous,) = cursor.fetchone()
    return bool(names) and synchronous == 1


def patroni_log(lines: int = 30) -> str:
    """The end of every node's Patroni log (what it decided about synchronous replication)."""
    tails = []
    for path in sorted(Path(PG_HA_DIR).glob("node*/patroni.log")):
        text = path.read_text(errors="replace").splitlines()
        tails.append(f"--- {path}\n" + "\n".join(text[-lines:]))
    return "\n".join(tails)


def test_an_asynchronous_standby_behind_the_url_is_warned_of():
    (warning,) = check_durable_commits(databases=["default"])
    assert warning.id == "agentmemory.W007" and "async" in warning.msg


def test_a_synchronous_standby_is_not_warned_of(synchronous_mode):
    connections.close_all()
    assert check_durable_commits(databases=["default"]) == []


def waiting_for_the_standby() -> int | None:
    """The server process of a COMMIT waiting for the synchronous standby, if one is."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
        row = cursor.fetchone()
    return row[0] if row else None


def test_a_commit_whose_wait_for_the_synchronous_standby_was_cancelled_is_not_acknowledged(
    synchronous_mode,
):
    """PostgreSQL answers such a COMMIT with success and a WARNING: committed on the primary
    only, so a failover may take it back. The store raises MemoryUnavailable (an unknown
    outcome), the cache does not serve it, and the retry with the same idempotency key returns
    it only once the standby has it."""
    store = MemoryStore(cache=redis_alias())
    store.remember("s", "k", {"n": 1})

    def write_and_cancel_its_wait() -> dict[str, Any]:
        outcome: dict[str, Any] = {}

        def write() -> None:
            try:
                outcome["record"] = store.remember("s", "k", {"n": 2}, idempotency_key="w2")
            except MemoryUnavailable as error:
                outcome["error"] = error
            finally:
                connections.close_all()

        assert primary_waits_for_a_standby(), f"synchronous mode is off: {patroni_log()}"
        writer = threading.Thread(target=write)
        writer.start()
        pid = wait_for(
            lambda: waiting_for_the_standby() or not writer.is_alive(),
            "a COMMIT waiting for the standby",
        )
        assert pid is not True, (
            f"the COMMIT did not wait for the standby ({outcome}; synchronous standby now: "
            f"{primary_waits_for_a_standby()}): {patroni_log()}"
        )
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_cancel_backend(%s)", [pid])
        writer.join(60)
        return outcome

    with replication_stopped("default"):
        outcome = write_and_cancel_its_wait()
        assert "record" not in outcome, "a COMMIT the standby never confirmed was acknowledged"
        assert "synchronous standby was cancelled" in str(outcome["error"])
        assert cached_versions(store.cache, [("s", "k")]) == {("s", "k"): None}
        # What the primary holds, for now -- read without waiting for the standby: the recall's
        # fence renewal commits (its incarnation counter) on the primary only.
        assert recall_within(store, ("s", "k"), seconds=30).version == 2
        # Retried while the standby still has nothing: the retry's COMMIT waits for it too.
        outcome = write_and_cancel_its_wait()
        assert "record" not in outcome, "the retry acknowledged a write the standby lacks"

    # The standby receives the WAL again: the retry's COMMIT waits for it, then acknowledges.
    retried = store.remember("s", "k", {"n": 2}, idempotency_key="w2")
    assert (retried.version, retried.value) == (2, {"n": 2})
    assert [v.version for v in store.history("s", "k")] == [1, 2]
    assert store.recall("s", "k").version == 2


def recall_within(store: MemoryStore, at: tuple[str, str], seconds: float) -> Any:
    """``store.recall(*at)`` in a thread; fails if it has not returned after ``seconds``."""
    answer: dict[str, Any] = {}

    def recall() -> None:
        try:
            answer["record"] = store.recall(*at)
        except Exception as error:  # handed to the test
            answer["error"] = error
        finally:
            connections.close_all()

    reader = threading.Thread(target=recall, daemon=True)
    reader.start()
    reader.join(seconds)
    assert not reader.is_alive(), f"the recall waited {seconds} s (for the synchronous standby?)"
    if "error" in answer:
        raise answer["error"]
    return answer["record"]


# ---------------------------------------------------------------------- memcheck across a failover
def memcheck(*args: str) -> tuple[int, dict[str, Any]]:
    out = StringIO()
    try:
        call_command("memcheck", *args, "--format", "json", stdout=out, stderr=StringIO())
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, json.loads(out.getvalue())


def test_memcheck_reports_what_an_asynchronous_failover_lost_and_nothing_else():
    """``--faults db`` on the HA cluster crashes the primary after half a second of writes the
    standby never received: memcheck names each lost write as the database's loss (exit 1),
    and finds nothing the store or its cache tier did wrong."""
    redis_alias()
    out = StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("memcheck", "--faults", "db", "--seconds", "4", "--workers", "6", stdout=out)
    text = out.getvalue()
    assert exit_.value.code == 1, text
    assert "db-failover 1" in text
    verdicts = dict(re.findall(r"^  ([a-z-]+) +(pass|FAIL \d+) ", text, re.MULTILINE))
    assert verdicts.pop("lost-by-database").startswith("FAIL"), text
    assert set(verdicts.values()) == {"pass"}, text
    assert "asynchronous replication" in text
    assert "RESULT: the database lost" in text
    assert "no anomaly of the store or its cache tier" in text


def test_memcheck_catches_a_cache_tier_that_outlives_a_failover(settings):
    """The seam: with CACHE_PROTECTION off the tier ignores the database's epoch (and the Redis
    server's identity), so after the failover it serves writes the database lost -- reported as
    reads of values the database does not hold, beside the database's own losses."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": False}
    redis_alias()
    code, report = memcheck("--faults", "db", "--seconds", "4", "--workers", "6")
    checks = {anomaly["check"] for anomaly in report["anomalies"]}
    assert code == 1 and "lost-by-database" in checks, report["faults"]
    assert checks - {"lost-by-database"} & {"garbage-read", "stale-read", "cache-divergence"}, (
        checks
    )


def test_memcheck_finds_nothing_across_a_synchronous_failover(synchronous_mode):
    redis_alias()
    code, report = memcheck("--faults", "db", "--seconds", "4", "--workers", "6")
    assert report["faults"]["injected"].get("db-failover") == 1, report["faults"]
    assert code == 0, report["anomalies"][:5]


def test_memcheck_tells_a_failover_it_did_not_inject_by_the_timeline(tmp_path):
    """The cluster fails over on its own during a run without faults (here: the same crash as the
    db-failover fault, made from outside memcheck, once its workers are writing): memcheck sees
    the timeline move, reports the failover as not injected, and blames what it lost on the
    database. Checked again without that failover, the same history blames the store: what an
    HA manager's own failover on a loaded machine made of a CI run before memcheck watched."""
    redis_alias()
    started = threading.Event()

    def crash_once_writing() -> None:
        try:
            wait_for(lambda: memcheck_rows() > 0, "memcheck writing", seconds=30)
            started.set()
            fail_over("default")
        finally:
            connections.close_all()

    crasher = threading.Thread(target=crash_once_writing)
    crasher.start()
    history = tmp_path / "history.jsonl"
    try:
        code, report = memcheck(
            "--seconds", "14", "--workers", "6", "--workloads", "register,list",
            "--history", str(history),
        )  # fmt: skip
    finally:
        crasher.join()
    assert started.is_set()
    failovers = report["faults"]["failovers"]
    assert [f["injected"] for f in failovers] == [False], failovers
    assert "db-failover" not in report["faults"]["injected"], report["faults"]
    checks = {anomaly["check"] for anomaly in report["anomalies"]}
    assert code == 1 and checks == {"lost-by-database"}, [
        (a["check"], a["message"]) for a in report["anomalies"][:5]
    ]

    ops, final = recorded.load(history)
    final.failovers = []
    blamed = {anomaly.check for anomaly in final.anomalies(ops)} - {"lost-by-database"}
    assert blamed, "without the failover the history's losses would be the store's"


def memcheck_rows() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM agentmemory_memory WHERE session_id LIKE 'memcheck-%'")
        return cursor.fetchone()[0]
