"""A MariaDB primary and its asynchronous GTID replica behind a router
(``agentmemory.consistency.mysql_pair``, started by ``make test``'s backend ``mariadb-pair``):
the most common MySQL-family high availability. A promotion that loses the primary's last
acknowledged writes moves no timeline, so the Redis tier sees it at a fence renewal: it serves
nothing the promoted database lacks after the documented bound (two fence periods), in this
process or a new one, and versions stay linear; memcheck's ``db-failover`` fault on the pair names
only the database's own losses. Every wait is for an event (the replica's applied GTID position,
the tier's renewals), never a fixed sleep."""

from __future__ import annotations

import time

import pytest
from django.db import connections

from agentmemory import MemoryStore
from agentmemory.consistency import mysql_pair
from agentmemory.consistency.runner import run_memcheck
from agentmemory.consistency.workloads import WorkloadConfig
from agentmemory.defects import Defect

from .helpers import hit
from .test_memcheck import run_json
from .test_restore import BOUND, in_another_process, renewals, served, tier, until_served

pytestmark = [pytest.mark.mariadb_pair, pytest.mark.django_db(transaction=True)]

__all__ = ["tier"]  # the fixture, imported for these tests


@pytest.fixture
def pair() -> mysql_pair.Pair:
    """The pair behind the alias, its replica caught up; after the test, a replica again (a
    test that crashed the primary rebuilt nothing yet)."""
    found = mysql_pair.pair_of("default")
    assert found is not None, "DATABASE_URL is not the MariaDB pair's router"
    wait_for(lambda: mysql_pair.caught_up(found), "the replica caught up")
    yield found
    if not mysql_pair.caught_up(found):
        mysql_pair.rejoin(found)


def wait_for(event, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not event():
        assert time.monotonic() < deadline, f"the pair did not report {what} in {seconds} s"
        time.sleep(0.05)


def lose_the_last_write(tier: MemoryStore, pair: mysql_pair.Pair) -> None:
    """v1 "kept" replicated; v2 "lost" acknowledged and served by the tier, then the primary
    crashes and the replica, which never received v2, is promoted."""
    tier.remember("s", "k", "kept")
    wait_for(lambda: mysql_pair.caught_up(pair), "the replica has v1")
    with mysql_pair.replication_stopped(pair):
        tier.remember("s", "k", "lost")
        record = hit(tier)  # served from Redis
        assert (record.version, record.value) == (2, "lost")
        mysql_pair.crash_and_promote(pair)
    connections.close_all()  # the old primary's, as a pooled application's would break


def test_a_promotion_that_lost_a_write_is_seen_within_the_bound(tier, pair):
    lose_the_last_write(tier, pair)
    assert until_served(tier, (1, "kept")) <= BOUND
    assert tier.cache.stats["went_back"] >= 1
    assert in_another_process() == (1, "kept")
    # Linear after it: the lost version number is written anew, and served at once.
    assert tier.remember("s", "k", "after").version == 2
    assert served(tier) == (2, "after")
    assert [v.value for v in tier.history("s", "k")] == ["kept", "after"]
    assert in_another_process() == (2, "after")


def test_without_the_protection_the_lost_write_is_served_after_the_same_renewals(
    tier, pair, settings
):
    """The declared seam: with CACHE_PROTECTION off no renewal checks anything, and the tier
    serves the write the promoted database lost for as long as its entry lives."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": False}
    lose_the_last_write(tier, pair)
    renewals(tier, 3)
    assert served(tier) == (2, "lost")


def test_memcheck_reports_what_a_promotion_lost_and_nothing_else(tier, pair):
    """``--faults db`` on the pair promotes the replica once, after half a second of writes it
    never received: memcheck names each lost write as the database's (exit 1), and nothing the
    store or its tier did."""
    code, report = run_json("--faults", "db", "--seconds", "4", "--workers", "6")
    assert report["faults"]["injected"].get("db-failover") == 1, report["faults"]
    theirs = [a for a in report["anomalies"] if a["check"] != "lost-by-database"]
    assert not theirs, [(a["check"], a["message"]) for a in theirs[:5]]
    assert code == 1 and report["anomalies"], "half a second of unreplicated writes, none lost"
    assert "replica was promoted" in report["anomalies"][0]["message"]


def test_memcheck_catches_a_renewal_that_does_not_see_the_promotion(tier, pair):
    """The same fault with the renewal's check planted out (``restore-unseen``): reads after the
    bound serve what the promotion lost, and memcheck says so beside the database's losses."""
    result = run_memcheck(
        ["default"],
        WorkloadConfig(workers=6, keys=4, ops=None, seconds=4, seed=3),
        faults="db",
        defects=[Defect.RESTORE_UNSEEN],
    )
    assert result.faults_injected.get("db-failover") == 1, result.fault_errors
    checks = {a.check for a in result.anomalies}
    assert checks - {"lost-by-database"}, checks
