"""Sessions sharded over databases (agentmemory.sharding): the placement's stability, each
session's rows on its shard alone, the calls about every session answered by every shard, bad
input refused before any shard is asked, and no lost update through the router.

The shards are the suite's two databases: ``default`` (this run's backend) and ``other`` (a
SQLite file) -- on the server runs two different engines, as a team moving from one database to
another would have them."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connections

from agentmemory import (
    Index,
    InvalidMemory,
    MemoryStore,
    MemoryUnavailable,
    ShardedStore,
    clock,
)
from agentmemory.checks import check_shards_setting
from agentmemory.models import Log, Memory
from agentmemory.sharding import (
    check_shards,
    forget_checked,
    place,
    record_shards,
    recorded_shards,
)
from agentmemory.testing.embeddings import HashEmbedder

from .conftest import redis_alias
from .helpers import child_database_url, run_memcheck

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])

SHARDS = ["default", "other"]


@pytest.fixture(autouse=True)
def _checked_again():
    """Each test's databases start empty: each shard's recorded list is checked again."""
    forget_checked()


def sessions_on(alias: str) -> set[str]:
    return set(Memory.objects.using(alias).values_list("session_id", flat=True)) | set(
        Log.objects.using(alias).values_list("session_id", flat=True)
    )


def session_ids(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"user-{rng.getrandbits(64):016x}" for _ in range(n)]


# ---------------------------------------------------------------------- placement


def test_the_placement_is_the_documented_function_of_the_session_id():
    """Golden values: a change of the hash would place every stored session elsewhere -- it
    must never happen silently."""
    assert [place(s, ["shard0", "shard1", "shard2"]) for s in ("a", "b", "c", "user-42")] == [
        place(s, ["shard2", "shard0", "shard1"]) for s in ("a", "b", "c", "user-42")
    ]
    assert {s: place(s, ["shard0", "shard1", "shard2"]) for s in ("a", "b", "c", "user-42")} == {
        "a": "shard2",
        "b": "shard0",
        "c": "shard2",
        "user-42": "shard0",
    }


def test_sessions_spread_evenly_and_adding_a_shard_moves_only_what_it_takes():
    ids = session_ids(20_000)
    three = ["s0", "s1", "s2"]
    before = {s: place(s, three) for s in ids}
    counts = Counter(before.values())
    assert all(abs(n - len(ids) / 3) < len(ids) * 0.02 for n in counts.values()), counts
    after = {s: place(s, [*three, "s3"]) for s in ids}
    moved = [s for s in ids if after[s] != before[s]]
    assert all(after[s] == "s3" for s in moved)  # only onto the new shard
    assert abs(len(moved) / len(ids) - 1 / 4) < 0.02, len(moved)
    # Removing a shard moves only its own sessions.
    without = {s: place(s, ["s0", "s2"]) for s in ids}
    assert all(without[s] == before[s] for s in ids if before[s] != "s1")


def test_session_ids_that_differ_in_case_accent_or_trailing_space_are_distinct_sessions():
    store = ShardedStore(SHARDS, cache=None)
    variants = ["Café", "café", "cafe", "café ", "CAFÉ"]
    for n, session_id in enumerate(variants):
        store.remember(session_id, "k", n)
    assert [store.recall(s, "k").value for s in variants] == list(range(len(variants)))
    for session_id in variants:
        assert session_id in sessions_on(store.place(session_id))
        other = next(a for a in SHARDS if a != store.place(session_id))
        assert session_id not in sessions_on(other)
    with pytest.raises(InvalidMemory, match="NFC"):  # the same text, decomposed: refused
        store.remember("cafe\u0301", "k", 0)


# ---------------------------------------------------------------------- routing


def test_every_row_of_a_session_is_on_its_shard_and_nowhere_else():
    store = ShardedStore(SHARDS, cache=None)
    ids = session_ids(24, seed=1)
    for session_id in ids:
        store.remember(session_id, "k", {"v": 1})
        store.update(session_id, "k", lambda v: {"v": v["v"] + 1})
        store.append(session_id, "events", [1, 2])
        store.pop(session_id, "events")
    placed = {s: store.place(s) for s in ids}
    assert set(placed.values()) == set(SHARDS), "24 sessions all on one shard"
    for alias in SHARDS:
        assert sessions_on(alias) == {s for s, a in placed.items() if a == alias}
    for session_id in ids:
        assert store.recall(session_id, "k").value == {"v": 2}
        assert [h.version for h in store.history(session_id, "k")] == [1, 2]
        assert [i.value for i in store.read_log(session_id, "events")] == [1]  # 2 popped
        assert store.shard(session_id) is store.stores[placed[session_id]]
    erased = ids[0]
    assert store.erase_session(erased) == 2
    assert erased not in sessions_on(placed[erased])


def test_keyword_arguments_and_a_missing_session_id_are_handled_as_the_store_does():
    store = ShardedStore(SHARDS, cache=None)
    record = store.remember(session_id="kw", key="k", value=1)
    assert store.recall(session_id="kw", key="k") == record
    with pytest.raises(TypeError, match="session_id"):
        store.remember(key="k", value=1)


@pytest.mark.parametrize("session_id", [None, 7, b"s", "", "x" * 10_000, ["s"]], ids=repr)
def test_a_bad_session_id_is_refused_naming_it_before_any_shard_is_asked(session_id):
    store = ShardedStore(SHARDS, cache=None)
    with pytest.raises(InvalidMemory) as refused:
        store.remember(session_id, "k", 1)
    assert refused.value.field == "session_id"
    assert all(not sessions_on(alias) for alias in SHARDS)


def test_the_router_keeps_no_lost_update_and_the_unsafe_seam_reaches_through_it():
    """Eight threads increment counters of four sessions through the router: every increment
    lands. The same with ``row_lock=False`` (the unsafe seam, given to each shard's store)
    loses some: the guarantee is the shards', and the router neither breaks nor hides it."""

    def run(store: ShardedStore) -> dict[str, int]:
        sessions = session_ids(4, seed=2)
        for session_id in sessions:
            store.remember(session_id, "n", 0)
        barrier = threading.Barrier(8)

        def worker() -> None:
            try:
                barrier.wait()
                for i in range(15):
                    session_id = sessions[i % 4]
                    store.update(session_id, "n", lambda n: n + 1)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {s: store.recall(s, "n").value for s in sessions}

    counted = run(ShardedStore(SHARDS, cache=None))
    assert sum(counted.values()) == 8 * 15, counted
    for alias in SHARDS:
        Memory.objects.using(alias).all().delete()
    unsafe = run(ShardedStore(SHARDS, cache=None, row_lock=False))
    assert sum(unsafe.values()) < 8 * 15, f"no update lost without the row lock: {unsafe}"


def test_each_shard_has_a_redis_tier_of_its_own_on_one_redis():
    store = ShardedStore(SHARDS, cache=redis_alias())
    prefixes = {store.stores[alias].cache.prefix for alias in SHARDS}
    assert len(prefixes) == 2
    ids = session_ids(8, seed=3)
    for session_id in ids:
        store.remember(session_id, "k", session_id)
    for session_id in ids:
        for _ in range(10):
            record = store.recall(session_id, "k")
            if store.last_read_source == "cache":
                break
        assert (record.value, store.last_read_source) == (session_id, "cache")


# ---------------------------------------------------------------------- every shard


def test_search_sessions_merges_every_shards_best_in_score_order():
    index = Index(embed=HashEmbedder(16), dims=16, fields=["$"])
    sharded = ShardedStore(SHARDS, cache=None, index=index)
    ids = session_ids(12, seed=4)
    words = ["apple pie", "apple tart", "pear", "plum", "apple", "cherry"]
    for n, session_id in enumerate(ids):
        sharded.remember(session_id, "k", words[n % len(words)])
    found = sharded.search_sessions("user-", "apple", limit=7)
    one = MemoryStore(cache=None, index=index)
    per_shard = sharded.each_shard(lambda s: s.search_sessions("user-", "apple", limit=20))
    everything = sorted(
        (h for hits in per_shard.values() for h in hits),
        key=lambda h: (-h.score, h.created_at, h.session_id, h.key),
    )
    assert [(h.session_id, h.score) for h in found] == [
        (h.session_id, h.score) for h in everything[:7]
    ]
    assert {sharded.place(h.session_id) for h in everything} == set(SHARDS)
    page = sharded.search_sessions("user-", "apple", limit=3, offset=4)
    assert [h.session_id for h in page] == [h.session_id for h in everything[4:7]]
    with pytest.raises(InvalidMemory) as refused:
        sharded.search_sessions("user-", "apple", limit=0)
    assert refused.value.field == "limit"
    with pytest.raises(InvalidMemory) as refused:
        sharded.search_sessions(["user-"], "apple")
    with pytest.raises(InvalidMemory) as as_one:
        one.search_sessions(["user-"], "apple")
    assert refused.value.field == as_one.value.field


def test_purges_and_pruning_run_on_every_shard_and_count_over_them():
    store = ShardedStore(SHARDS, cache=None)
    ids = session_ids(10, seed=5)
    for session_id in ids:
        store.remember(session_id, "gone", 1, ttl=60)
        for n in range(3):
            store.remember(session_id, "kept", n)
    per_shard = Counter(store.place(s) for s in ids)
    assert set(per_shard) == set(SHARDS)
    clock.advance(timedelta(seconds=61))
    assert store.expired_counts() == (10, 0)
    seen: list[tuple[int, int]] = []
    assert (
        store.purge_expired(batch=2, progress=lambda done, total: seen.append((done, total))) == 10
    )
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert seen[-1] == (10, 10)
    assert store.expired_counts() == (0, 0)
    assert store.each_shard(lambda s: s.prune_history(keep_last=1, dry_run=True)) == {
        alias: 3 * per_shard[alias]
        for alias in SHARDS  # "gone": its write; "kept": 2 of 3
    }
    assert store.prune_history(keep_last=1) == 30
    assert store.prune_history(keep_last=1, session_id=ids[0]) == 0


# ---------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("shards", "wanted"),
    [
        ("default", "must be a list of database aliases"),
        ([], "is empty"),
        (["default", "default"], "'default' twice"),
        (["default", "nowhere"], "'nowhere', which is not in DATABASES"),
        (["default", 3], "holds 3"),
        (["default", ""], "holds ''"),
        (["x" * 65], "not in DATABASES"),
    ],
    ids=repr,
)
def test_bad_shards_are_refused_by_the_store_and_by_check_e025(settings, shards, wanted):
    with pytest.raises(ImproperlyConfigured, match=wanted):
        check_shards(shards)
    with pytest.raises(ImproperlyConfigured, match=wanted):
        ShardedStore(shards)
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": shards}
    errors = check_shards_setting()
    assert [e.id for e in errors] == ["agentmemory.E025"] and wanted in errors[0].msg


def test_check_e025_accepts_no_shards_and_good_ones_and_the_store_reads_them(settings):
    assert check_shards_setting() == []
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": ["other", "default"]}
    assert check_shards_setting() == []
    assert ShardedStore(cache=None).shards == ("default", "other")
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": None}
    with pytest.raises(ImproperlyConfigured, match="must be a list"):
        ShardedStore()


def test_a_plain_store_is_its_own_shard():
    store = MemoryStore(cache=None)
    assert store.shard("s") is store
    with pytest.raises(InvalidMemory):
        store.shard("")


# ---------------------------------------------------------------------- memcheck


@pytest.mark.slow  # memcheck runs (every backend in make test; not the matrix)
def test_memcheck_without_database_runs_on_every_shard_and_gives_each_a_verdict(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": SHARDS}
    code, out = run_memcheck("--ops", "100", "--faults", "none")
    assert code == 0, out
    table = out[out.index("shard        vendor") :].splitlines()
    # Each shard's run, then one across both with the run's sessions moving between them.
    assert [line.split()[0] for line in table[1:4]] == [*SHARDS, "moves"]
    assert all(line.endswith(" ok") for line in table[1:4]), table
    assert table[4] == "whole run: ok (2 shards)"
    assert out.count("RESULT: no anomaly") == 3
    assert "session-move" in out[out.index("== moves") :]


@pytest.mark.slow
def test_memcheck_across_shards_fails_when_the_shards_lose_updates(settings):
    """The unsafe path on every shard: each shard's run finds its lost updates, and the whole run
    is not ok -- the verdict is the shards' verdicts, not a summary that hides one."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": SHARDS}
    # The unsafe path's run of tests/test_memcheck.py, which finds lost updates on every backend.
    code, out = run_memcheck(
        "--ops", "800", "--workers", "8", "--unsafe", "--workloads", "register,list",
        "--faults", "none", "--format", "json",
    )  # fmt: skip
    assert code == 1, out
    report = json.loads(out)
    assert report["ok"] is False
    assert {alias: shard["verdict"] for alias, shard in report["shards"].items()} == {
        alias: "NOT OK" for alias in [*SHARDS, "moves"]
    }
    for shard in report["shards"].values():
        assert shard["run"]["anomalies"], shard


@pytest.mark.slow
def test_a_shard_that_cannot_run_is_reported_and_the_others_still_run():
    """A third shard whose database cannot be opened: the two others run and pass, the third is
    named with why, and the exit code is 2 (could not run), not 0."""
    from project.settings import cluster_urls

    url = child_database_url()
    # A shard is one server: of a Galera cluster, one node (a PostgreSQL host list stays whole).
    shard = url if url.startswith("postgres") else cluster_urls(url)[0]
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "SHARD_DATABASE_URLS": f"{shard},sqlite:////nonexistent-folder/x.sqlite3",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "memcheck", "--ops", "50", "--faults", "none"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stdout[done.stdout.index("shard        vendor") :].splitlines()
    assert lines[1].split()[0] == "shard0" and lines[1].endswith(" ok"), lines
    assert (
        lines[2].startswith("shard1") and "could not run: cannot use database 'shard1'" in lines[2]
    )
    assert lines[3] == "whole run: NOT OK (2 shards)"


@pytest.mark.parametrize("option", [["--audit"], ["--self-test"], ["--junit", "x.xml"]])
def test_options_of_one_database_are_refused_across_shards_naming_the_way(
    settings, option, tmp_path
):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": SHARDS}
    if option[0] == "--junit":
        option = ["--junit", str(tmp_path / "x.xml")]
    with pytest.raises(CommandError, match="--database SHARD, once per shard"):
        call_command("memcheck", *option, stdout=io.StringIO(), stderr=io.StringIO())
    assert not (tmp_path / "x.xml").exists()


def test_the_example_projects_shard_urls_keep_a_postgres_host_list_whole():
    from project.settings import shard_databases, shard_urls

    value = (
        "sqlite:////tmp/a.sqlite3, postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write"
        ",mysql://root@127.0.0.1:3306/x"
    )
    assert shard_urls(value) == [
        "sqlite:////tmp/a.sqlite3",
        "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
        "mysql://root@127.0.0.1:3306/x",
    ]
    databases = shard_databases(value)
    assert list(databases) == ["shard0", "shard1", "shard2"]
    assert (databases["shard1"]["HOST"], databases["shard1"]["PORT"]) == ("h1,h2", "5432,5433")
    with pytest.raises(ImproperlyConfigured, match=r"shard 0 .* names several hosts"):
        shard_databases("mysql://root@n1:3306,n2:3306/x")


# ---------------------------------------------------------------------- the recorded list


def test_a_process_with_another_list_of_shards_is_refused_and_writes_nothing():
    """The first store to use a shard records its list; a store over another list -- a process
    whose settings lack a shard, or name one more -- would place some sessions elsewhere and
    split their calls between two databases: its calls are refused, naming both lists."""
    first = ShardedStore(SHARDS, cache=None)
    first.remember("s", "k", 1)  # records the list on the session's shard
    assert recorded_shards(first.place("s")) == SHARDS
    first.expired_counts()  # and on every shard
    assert {alias: recorded_shards(alias) for alias in SHARDS} == {
        "default": SHARDS,
        "other": SHARDS,
    }
    for other_list in (["default"], ["other"]):
        lonely = ShardedStore(other_list, cache=None)
        with pytest.raises(ImproperlyConfigured, match=r"over shards \['default', 'other'\]"):
            lonely.remember("s2", "k", 1)
        with pytest.raises(ImproperlyConfigured):
            lonely.expired_counts()
    assert Memory.objects.using("default").count() + Memory.objects.using("other").count() == 1


def test_the_shards_command_shows_each_shards_list_and_sets_the_settings(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": SHARDS}
    out = io.StringIO()
    call_command("agentmemory_shards", "show", stdout=out)
    assert out.getvalue().splitlines() == [
        f"{alias}: none recorded (the first ShardedStore call records the setting's)"
        for alias in SHARDS
    ]
    record_shards("other", ["other"])  # a shard recorded with another list
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("agentmemory_shards", "show", stdout=out)
    assert exited.value.code == 1
    assert "other: other  <- not the setting's (default, other)" in out.getvalue()
    with pytest.raises(ImproperlyConfigured):
        ShardedStore(cache=None).each_shard(lambda store: store.expired_counts())
    out = io.StringIO()
    call_command("agentmemory_shards", "set", stdout=out)
    assert out.getvalue().splitlines() == [
        "default: default, other",
        "other: default, other",
        "0 session(s) forwarded from a new home to where they live (0 already were); "
        "`move_sessions --rebalance` brings them home",
    ]
    assert ShardedStore(cache=None).expired_counts() == (0, 0)


@pytest.mark.parametrize("shards", [None, "default", ["default", "nowhere"]], ids=repr)
def test_the_shards_command_refuses_a_bad_setting_with_exit_2(settings, shards):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": shards}
    with pytest.raises(CommandError) as refused:
        call_command("agentmemory_shards", "show", stdout=io.StringIO())
    assert refused.value.returncode == 2 and "SHARDS" in str(refused.value)


# ---------------------------------------------------------------------- maintenance commands


def test_the_maintenance_commands_run_on_every_shard_without_database(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": SHARDS}
    store = ShardedStore(cache=None)
    ids = session_ids(10, seed=6)
    for session_id in ids:
        store.remember(session_id, "k", 1, ttl=60)
        store.remember(session_id, "k", 2, ttl=60)
    clock.advance(timedelta(seconds=61))
    expected = Counter(store.place(s) for s in ids)
    out = io.StringIO()
    call_command("purge_expired", stdout=out, stderr=io.StringIO())
    lines = out.getvalue().splitlines()
    assert [line.split(": expired ")[0] for line in lines] == [
        f"purge_expired on {alias!r}" for alias in SHARDS
    ]
    assert [int(line.split(": expired ")[1].split()[0]) for line in lines] == [
        expected[alias] for alias in SHARDS
    ]
    out = io.StringIO()
    call_command("prunehistory", "--keep-last", "1", stdout=out, stderr=io.StringIO())
    assert [line.split(": removed ")[1].split()[0] for line in out.getvalue().splitlines()] == [
        str(2 * expected[alias])
        for alias in SHARDS  # of write, write, expire: two go
    ]
    out = io.StringIO()
    call_command("purge_expired", "--database", "other", stdout=out, stderr=io.StringIO())
    assert out.getvalue().startswith("purge_expired on 'other': expired 0")


@pytest.mark.parametrize(
    ("command", "args", "wanted"),
    [
        ("purge_expired", ["--batch", "0"], "batch"),
        ("prunehistory", ["--keep-last", "0"], "keep_last"),
        ("purge_expired", ["--database", "nowhere"], "unknown database alias 'nowhere'"),
        ("reindex", ["--session", ""], "session_id"),
    ],
)
def test_a_maintenance_command_refused_on_every_shard_exits_2_naming_each(
    settings, command, args, wanted
):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": SHARDS}
    with pytest.raises(CommandError, match=wanted) as refused:
        call_command(command, *args, stdout=io.StringIO(), stderr=io.StringIO())
    assert refused.value.returncode == 2
    if args[0] not in ("--database", "--session"):  # refused by each shard: each named
        assert all(f"shard {alias!r}" in str(refused.value) for alias in SHARDS)


def test_the_router_has_every_public_method_of_the_store_and_its_async_twins():
    """A method added to MemoryStore and forgotten here would be an AttributeError for a
    sharded project: every public name of the class is on the router too."""
    public = {name for name in dir(MemoryStore) if not name.startswith("_")}
    assert public - set(dir(ShardedStore)) == set()


def test_the_async_twins_go_to_the_sessions_shard():
    import asyncio

    store = ShardedStore(SHARDS, cache=None)
    ids = session_ids(6, seed=7)

    async def main() -> list[object]:
        await asyncio.gather(*(store.aremember(s, "k", s) for s in ids))
        await store.aappend(ids[0], "log", [1])
        return [(await store.arecall(s, "k")).value for s in ids]

    assert asyncio.run(main()) == ids
    for session_id in ids:
        assert session_id in sessions_on(store.place(session_id))


def test_a_shard_that_cannot_answer_fails_its_sessions_calls_naming_it_and_no_other(settings):
    """The ``other`` shard's write lock held (a raw SQLite connection's BEGIN IMMEDIATE) past the
    calls' deadline: a write of a session placed there raises MemoryUnavailable naming the
    shard, and so does a call about every session; a session on ``default`` is served."""
    import sqlite3

    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "RETRY": {"DEADLINE": 1.0}}
    store = ShardedStore(SHARDS, cache=None)
    ids = session_ids(16, seed=8)
    there = next(s for s in ids if store.place(s) == "other")
    here = next(s for s in ids if store.place(s) == "default")
    store.expired_counts()  # each shard's list recorded before the lock
    store.remember(there, "due", 1, ttl=60)  # a purge must write on the locked shard
    clock.advance(timedelta(seconds=61))
    holder = sqlite3.connect(connections["other"].settings_dict["NAME"], timeout=5)
    holder.execute("BEGIN IMMEDIATE")
    outcome: dict[str, object] = {}

    def calls() -> None:  # a thread of its own: connections opened under the 1 s deadline
        try:
            for name, call in (
                ("there", lambda: store.remember(there, "k", 1)),
                ("thread", lambda: store.checkpoints.delete_threads([there])),
                ("every", lambda: store.purge_expired()),
                ("here", lambda: store.remember(here, "k", 1)),
            ):
                try:
                    outcome[name] = call()
                except Exception as error:  # the assertions below name it
                    outcome[name] = error
        finally:
            connections.close_all()

    try:
        worker = threading.Thread(target=calls)
        worker.start()
        worker.join(60)
    finally:
        holder.rollback()
        holder.close()
    for name in ("there", "thread", "every"):
        assert isinstance(outcome[name], MemoryUnavailable), outcome
        assert str(outcome[name]).startswith("shard 'other': "), outcome[name]
        assert str(outcome[name]).count("shard 'other'") == 1, outcome[name]  # named once
    assert outcome["here"].version == 1, outcome  # the other shard served meanwhile
    assert store.recall(there, "k") is None and store.expired_counts() == (1, 0)
