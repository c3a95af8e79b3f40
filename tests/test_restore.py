"""The tier after the database went back in time (#43, item 2): a dump restored into the live
database -- its identity and timeline unchanged, every write since the dump gone -- is seen at
the next fence renewal, and from then on nothing cached before is served, from this process or a
new one. Two ways of seeing it, each tested: an entry stored since the last renewal that the
database does not back (a restore of a dump taken moments ago), and the database's incarnation
counter behind the one Redis holds (a dump older than a renewal). Then versions go on linear,
one value each.

Each test waits for the event (the tier serving the database's value), then holds the time it
took to the documented bound: two fence periods. The same scenario with ``CACHE_PROTECTION``
off (the declared seam) serves the lost version after as many renewals: the check is what
catches it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest
from django.db import connection

from agentmemory import MemoryStore
from agentmemory.consistency import dumps
from agentmemory.models import CacheIncarnation, MemoryVersion

from .conftest import redis_alias
from .helpers import child_database_url

pytestmark = pytest.mark.django_db(transaction=True)

FENCE = 0.4
#: docs/redis.md: "within two fence periods" (and the renewal's own round trips).
BOUND = 2 * FENCE + 0.5


@pytest.fixture
def tier(settings) -> MemoryStore:
    settings.AGENTMEMORY = {"CACHE": redis_alias(), "CACHE_FENCE_SECONDS": FENCE}
    store = MemoryStore(cache="agentmemory")
    store.recall("s", "warm")  # the fence is up
    return store


def served(store: MemoryStore, key: str = "k") -> tuple[int, object] | None:
    record = store.recall("s", key)
    return None if record is None else (record.version, record.value)


def until_served(store: MemoryStore, wanted: tuple[int, object] | None, key: str = "k") -> float:
    """Seconds until ``store`` serves ``wanted`` -- read again as fast as it answers -- and from
    then on through two more fence renewals (a read the database answered while the fence was
    down is no proof: the next one may come from the tier)."""
    started = time.monotonic()
    while (found := served(store, key)) != wanted:
        assert time.monotonic() - started < 30, f"still serving {found}, not {wanted}"
    took = time.monotonic() - started
    target = store.cache.stats["fence_renewals"] + 2
    while store.cache.stats["fence_renewals"] < target:
        found = served(store, key)
        assert found == wanted, f"served {found} again after {wanted}"
        assert time.monotonic() - started < 30, "the fence was not renewed"
    return took


def renewals(store: MemoryStore, count: int) -> None:
    """Read until the tier has renewed its fence ``count`` more times (the event: each one
    checked what was stored since the last)."""
    target = store.cache.stats["fence_renewals"] + count
    started = time.monotonic()
    while store.cache.stats["fence_renewals"] < target:
        store.recall("s", "warm")
        assert time.monotonic() - started < 30, "the fence was not renewed"


def in_another_process(key: str = "k") -> tuple[int, object] | None:
    """What a new process -- nothing of this one in memory -- recalls through the same tier."""
    url = child_database_url()
    code = (
        "import django, json; django.setup()\n"
        "from django.conf import settings\n"
        f"settings.AGENTMEMORY = {{'CACHE': 'agentmemory', 'CACHE_FENCE_SECONDS': {FENCE}}}\n"
        "from agentmemory import MemoryStore\n"
        "store = MemoryStore(cache='agentmemory')\n"
        f"r = store.recall('s', {key!r})\n"
        "print(json.dumps(None if r is None else [r.version, r.value, store.last_read_source]))"
    )
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "project.settings"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return None if found is None else (found[0], found[1])


def dumped_counter(taken: dumps.Dump) -> int:
    columns, rows = taken.tables[CacheIncarnation._meta.db_table]
    return rows[0][columns.index("counter")] if rows else 0


def test_a_dump_restored_moments_later_is_seen_by_the_entries_it_does_not_back(tier, caplog):
    tier.remember("s", "k", "kept")
    taken = dumps.dump()
    tier.remember("s", "k", "lost")
    assert served(tier) == (2, "lost") and tier.cache.stats["hits"]
    dumps.restore(taken)
    with caplog.at_level(logging.WARNING, logger="agentmemory.cache"):
        took = until_served(tier, (1, "kept"))
    assert took <= BOUND, f"the restore was seen after {took:.2f} s, the bound is {BOUND} s"
    assert "went back in time" in caplog.text
    assert in_another_process() == (1, "kept")
    # Versions go on linear, one value each: version 2 is written again, with its new value.
    tier.remember("s", "k", "after")
    assert served(tier) == (2, "after") == in_another_process()
    versions = MemoryVersion.objects.filter(memory__session_id="s", memory__key="k")
    assert sorted(versions.values_list("version", "value")) == [(1, "kept"), (2, "after")]


def test_an_older_dump_is_seen_by_the_incarnation_counter(tier, caplog):
    tier.remember("s", "k", "kept")
    taken = dumps.dump()
    tier.remember("s", "k", "lost")
    tier.remember("s", "other", "lost too")
    renewals(tier, 2)  # the entries were checked, the counter moved on
    assert CacheIncarnation.objects.get().counter > dumped_counter(taken)
    assert served(tier) == (2, "lost") and served(tier, "other") == (1, "lost too")
    dumps.restore(taken)
    with caplog.at_level(logging.WARNING, logger="agentmemory.cache"):
        took = until_served(tier, (1, "kept"))
    assert took <= BOUND, f"the restore was seen after {took:.2f} s, the bound is {BOUND} s"
    assert "incarnation counter" in caplog.text
    assert served(tier, "other") is None and in_another_process("other") is None


def test_a_restore_of_a_dump_taken_before_the_first_renewal_and_a_flushed_counter(tier):
    """A dump without the incarnation row (taken before any renewal moved it, or of a database
    older than the migration): the row's absence counts as 0."""
    CacheIncarnation.objects.all().delete()
    taken = dumps.dump()
    assert not taken.tables[CacheIncarnation._meta.db_table][1]
    tier.remember("s", "k", "lost")
    renewals(tier, 2)
    assert served(tier) == (1, "lost")
    dumps.restore(taken)
    assert until_served(tier, None) <= BOUND
    assert in_another_process() is None


def test_without_the_protection_the_lost_version_is_served_after_the_same_renewals(tier, settings):
    """The declared seam: with CACHE_PROTECTION off no renewal checks anything, and the tier
    serves the lost version for as long as its entry lives."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": False}
    tier.remember("s", "k", "kept")
    taken = dumps.dump()
    tier.remember("s", "k", "lost")
    dumps.restore(taken)
    renewals(tier, 3)
    assert served(tier) == (2, "lost")


def test_no_renewal_sees_a_restore_where_there_was_none(tier):
    """Writes, reads, erasures and forgets under many renewals: the tier never thinks the
    database went back (each time it did, every entry would be a miss)."""
    for round_ in range(30):
        tier.remember("s", f"k{round_ % 5}", round_)
        tier.recall_many("s", [f"k{i}" for i in range(5)])
        if round_ % 7 == 0:
            tier.forget("s", "k1")
        if round_ % 11 == 0:
            tier.erase_session("s")
    renewals(tier, 3)
    assert tier.cache.stats["went_back"] == 0
    assert tier.cache.stats["hits"] > 0


# ------------------------------------------------------------------ manage.py repaircache


def raw(sql: str, *params: object) -> None:
    """A statement from a SQL shell: nothing of the store or the ORM runs."""
    from agentmemory.models import Memory

    with connection.cursor() as cursor:
        quote = connection.ops.quote_name
        tables = {"table": Memory._meta.db_table, "versions": MemoryVersion._meta.db_table}
        names = {k: quote(v) for k, v in tables.items()}
        cursor.execute(sql.format(key=quote("key"), **names), params)


def repaircache(*args: str) -> str:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("repaircache", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_repaircache_deletes_what_raw_sql_left_the_tier_serving(tier):
    for key in ("same", "gone", "bumped", "fine"):
        tier.remember("s", key, f"{key} 1")
        assert served(tier, key) == (1, f"{key} 1")
    raw("UPDATE {table} SET value = %s WHERE session_id = 's' AND {key} = 'same'", '"edited"')
    gone = MemoryVersion.objects.filter(memory__session_id="s", memory__key="gone")
    raw(f"DELETE FROM {{versions}} WHERE memory_id = {gone.get().memory_id}")
    raw("DELETE FROM {table} WHERE session_id = 's' AND {key} = 'gone'")
    raw("UPDATE {table} SET version = 2 WHERE session_id = 's' AND {key} = 'bumped'")
    assert served(tier, "same") == (1, "same 1")  # the tier cannot see raw SQL by itself
    dry = repaircache("--dry-run")
    assert "3 not backed by the database (dry run: nothing deleted)" in dry, dry
    assert served(tier, "same") == (1, "same 1")
    out = repaircache()
    assert "deleted ('s', 'same'): Redis serves version 1 with another value" in out, out
    assert "deleted ('s', 'gone'): Redis serves version 1, the database holds version 0" in out
    assert "deleted ('s', 'bumped'): Redis serves version 1, the database holds version 2" in out
    assert "3 not backed by the database, deleted" in out
    for store in (tier, MemoryStore(cache="agentmemory")):
        assert served(store, "same") == (1, "edited") and served(store, "gone") is None
        assert served(store, "bumped") == (2, "bumped 1") and served(store, "fine") == (1, "fine 1")
    assert "0 not backed by the database" in repaircache()


def test_repaircache_under_traffic_deletes_nothing_the_database_backs(tier):
    """Writers and readers on a handful of keys while repairs run back to back: every entry a
    repair compares is one the store wrote or filled, so none may be reported -- a repair that
    deleted an entry a write had just replaced would (the deletion is conditional)."""
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def traffic(worker: int) -> None:
        store = MemoryStore(cache="agentmemory")
        n = 0
        try:
            while not stop.is_set():
                n += 1
                store.remember("s", f"hot{n % 4}", [worker, n])
                store.recall_many("s", [f"hot{i}" for i in range(4)])
        except BaseException as exc:
            errors.append(exc)
        finally:
            from django.db import connections

            connections.close_all()

    threads = [threading.Thread(target=traffic, args=(w,)) for w in range(3)]
    for thread in threads:
        thread.start()
    try:
        compared = 0
        for _ in range(300):
            out = repaircache()
            assert ", 0 not backed by the database" in out, out
            compared += int(out.split(": ")[1].split(" entries")[0])
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors
    assert compared > 0


def test_repaircache_without_a_tier_or_with_an_unknown_alias_exits_2(settings):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown database alias 'nope'") as caught:
        repaircache("--database", "nope")
    assert caught.value.returncode == 2
    settings.AGENTMEMORY = {"CACHE": None}
    with pytest.raises(CommandError, match="no cache tier") as caught:
        repaircache()
    assert caught.value.returncode == 2


# ------------------------------------------------------------------ memcheck --faults restore


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_memcheck_restore_faults_find_only_what_the_database_lost(tier):
    """Dumps of the run's sessions put back while the workload runs, Redis tier on: every
    anomaly is the database's own loss, named as the restore's; the tier served nothing it lost
    after its bound, and the final state holds linear histories (every other check passes)."""
    from .test_memcheck import run_json

    code, report = run_json("--faults", "restore", "--seconds", "4", "--workers", "4")
    faults = report["faults"]
    assert faults["injected"].get("db-restore", 0) >= 1, (faults["injected"], faults["errors"])
    theirs = [a for a in report["anomalies"] if a["check"] != "lost-by-database"]
    assert not theirs, [(a["check"], a["message"]) for a in theirs[:5]]
    assert code == 1 and report["anomalies"], "a restore a moment after its dump loses writes"
    assert "restored" in report["anomalies"][0]["message"]


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_the_self_test_catches_a_renewal_that_does_not_check_for_a_restore(tier):
    """The variant restore-unseen runs under restores whatever the run's faults are, and is
    caught; the real store passes under the same faults (test above)."""
    from agentmemory.consistency.selftest import run_self_test
    from agentmemory.consistency.workloads import WorkloadConfig
    from agentmemory.defects import Defect

    result = run_self_test(
        ["default"],
        WorkloadConfig(workers=4, keys=4, ops=600, seconds=None, seed=7),
        faults="lock",
        defects=[Defect.RESTORE_UNSEEN],
    )
    variant = next(o for o in result.outcomes if o.name == Defect.RESTORE_UNSEEN.value)
    assert variant.applicable and variant.caught, variant
