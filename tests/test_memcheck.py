"""manage.py memcheck: exit 0 on the locked path, 1 with counterexamples on the unlocked one."""

import dataclasses
import json
import re
from collections import Counter

import pytest
from django.core.management import call_command

from agentmemory import MemoryStore, clock
from agentmemory.cache import encode_payload, stamp
from agentmemory.consistency.pg_failover import is_ha_alias
from agentmemory.consistency.selftest import run_self_test
from agentmemory.consistency.workloads import WorkloadConfig
from agentmemory.defects import Defect
from agentmemory.models import Memory

from .conftest import redis_alias
from .helpers import history_ops, run_memcheck

#: The faults a run under --faults db or all injects wherever a cache tier is configured (on the
#: run's own keys and sessions), whatever the database.
TIER_FAULTS = {
    "foreign-entry",
    "redis-clock",
    "writer-crash",
    "cache-evict",
    "fence-race",
    "orm-bulk",
}

pytestmark = pytest.mark.django_db(transaction=True)


run = run_memcheck


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_memcheck_passes_on_the_locked_path_and_cleans_up(settings):
    code, out = run("--ops", "600", "--workers", "6")
    assert code == 0, out
    assert "RESULT: no anomaly" in out
    if settings.AGENTMEMORY.get("CACHE"):  # REDIS_URL set: the run went through Redis
        assert "cache tier: off" not in out and " hits " in out
    assert not Memory.objects.filter(session_id__startswith="memcheck-").exists()


def test_memcheck_unsafe_finds_lost_updates_with_counterexamples():
    # The memories' workloads only: with every workload, the unsafe log pops and checkpoint puts
    # (0.2 s between read and write each) hold the workers, and a run of 800 calls has few
    # concurrent appends left (lost-update 3 times in 2 of 3 runs; with these, 68 to 104 in 6 of 6).
    code, out = run("--ops", "800", "--workers", "8", "--unsafe", "--workloads", "register,list")
    assert code == 1, out
    assert "lost-update         FAIL" in out
    assert "acknowledged append" in out
    assert not Memory.objects.filter(session_id__startswith="memcheck-").exists()


def test_memcheck_json_report(tmp_path):
    history = tmp_path / "history.jsonl"
    code, out = run(
        "--ops", "200", "--format", "json", "--history", str(history), "--faults", "none"
    )
    report = json.loads(out)
    ops = history_ops(history)
    assert code == 0 and report["anomalies"] == [] and report["operations"] == len(ops)
    # 200 calls by the workers (a recall_many, remember_many or search is recorded once per key,
    # as <call id>-<key> or under one id), then two rounds of final reads of every key, log and
    # checkpoint thread (3 sessions x 33: reg, list, ttl, search 3 each, many 3 and their
    # look-alikes Many 3, log streams 3, SDK session streams 3, ADK sessions 3, checkpoint
    # threads 3 read and listed), the second round paging through each reg key's history (3 x 3)
    # and reading each session's many keys by prefix (3 x 3), then a final search of each session
    # (3 x the 3 search keys); the ttl workload's sliding-TTL probe: a write and two reads; and
    # before the reads, a call with each TTL that is not positive (ttl=0, ttl=-1, remember_many
    # with ttl=0).
    # A search race step is two searches (<id>, <id>-s1) and its partner's two writes (<id>-w0,
    # <id>-w1); a recall_many race step its read and its partner's remember_many (<id>-w0).
    calls = {
        re.sub(r"-[sw]\d+$", "", re.sub(r"-(many|Many|search)-\d+$", "", op["id"]))
        for op in ops
        if op["client"] != "final"
    }
    assert len(calls) == 200
    assert sum(op["client"] == "final" for op in ops) == 2 * 3 * 33 + 3 * 3 + 3 * 3 + 3 * 3 + 3 + 3
    assert set(report["latency_ms"]) >= {
        "recall",
        "remember",
        "append",
        "log-append",
        "log-read",
        "cp-put",
        "cp-read",
        "sdk-add",
        "sdk-get",
    }
    assert {"p50", "p95", "p99"} <= set(report["latency_ms"]["recall"])


@pytest.mark.slow
def test_memcheck_with_processes():
    code, out = run("--ops", "200", "--workers", "2", "--processes", "2")
    assert code == 0, out


def test_memcheck_audit_finds_a_planted_gap(store):
    redis_alias()  # empties Redis: a cache-less store writing behind its back would diverge
    store.remember("s", "k", 1)
    store.remember("s", "k", 2)
    code, out = run("--audit")
    assert code == 0, out
    from agentmemory.models import MemoryVersion

    MemoryVersion.objects.filter(version=1).delete()
    code, out = run("--audit")
    assert code == 1 and "version-gap" in out


def test_memcheck_unknown_database_exits_2():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError) as info:
        call_command("memcheck", "--database", "nope")
    assert info.value.returncode == 2


def run_json(*args):
    code, out = run(*args, "--format", "json")
    return code, json.loads(out) if out.strip().startswith("{") else out


@pytest.mark.slow
def test_memcheck_faults_all_injects_every_kind_and_finds_nothing(vendor):
    redis_alias()
    code, report = run_json("--faults", "all", "--seconds", "8", "--workers", "6")
    ha = is_ha_alias("default")
    if ha:  # the failover of the HA cluster's primary: what it lost is the database's loss
        theirs = [a for a in report["anomalies"] if a["check"] != "lost-by-database"]
        assert not theirs, ([(a["check"], a["message"]) for a in theirs[:5]], report["faults"])
    else:
        assert code == 0, (report["anomalies"][:3], report["faults"])
    injected = report["faults"]["injected"]
    expected = (
        {
            "db-lock",
            "cache-kill",
            "cache-pause",
            "cache-restart",
            "cache-failover",
            *TIER_FAULTS,
        }
        | ({"db-kill"} if vendor != "sqlite" else set())
        | ({"db-failover"} if ha else set())
    )
    # The errors first: a fault that did not play out says why there (CI's log cuts long reprs).
    assert report["faults"]["errors"] == [], report["faults"]["errors"]
    assert set(injected) == expected and all(n >= 1 for n in injected.values()), report["faults"]
    assert report["faults"]["redis"].startswith("memcheck's own Redis")  # not the project's
    # The final reads after healing are in the history and were checked.
    assert report["counts"]["recall"]["ok"] > 0


@pytest.mark.slow
def test_db_kills_catch_a_store_that_does_not_retry_lost_connections(settings, vendor):
    """The kill fault bites: with reconnect-and-retry switched off, callers see the errors."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "RETRY": {"RECONNECT": False}}
    # Not the transactions workload: inside the caller's own transaction a lost connection
    # reaches the caller by design (the store cannot retry there), so it is no anomaly, and a
    # run whose kills all hit such calls would show nothing.
    workloads = "register,list,ttl,isolation,idempotent,many,erase,bad-input"
    # A run of 6 s kills one or two connections (a round of faults takes seconds on a loaded
    # machine), and a kill bites only if its connection is used again: one that lands after its
    # worker's last call shows nothing (a CI run). Three runs at most, as the self-test's.
    runs = []
    for seed in range(3):
        code, report = run_json(
            "--faults", "db", "--seconds", "6", "--workers", "6", "--workloads", workloads,
            "--seed", str(seed),
        )  # fmt: skip
        injected = report["faults"]["injected"]
        if vendor == "sqlite":  # no server to kill a connection of: only the lock fault runs
            cached = TIER_FAULTS if settings.AGENTMEMORY.get("CACHE") else set()
            assert code == 0 and set(injected) == {"db-lock", *cached}, report["faults"]
            return
        assert injected.get("db-kill", 0) >= 1, report["faults"]
        checks = {a["check"] for a in report["anomalies"]}
        runs.append((code, injected, checks, report["raised"]))
        if "caller-error" in checks:
            break
    assert code == 1 and "caller-error" in checks, runs


@pytest.mark.slow
def test_cache_faults_catch_a_cache_tier_without_its_protection(settings):
    """The Redis faults bite: if a writer that could not update Redis neither left a tombstone
    nor recorded the key and waited out the fence, readers are served stale versions after the
    pause -- and memcheck says so (the seam: CACHE_PROTECTION=False)."""
    redis_alias()
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": False}
    found = Counter()
    for seed in range(3):
        code, report = run_json("--faults", "cache", "--seconds", "6", "--seed", str(seed))
        found.update(a["check"] for a in report["anomalies"])
        if found["stale-read"]:
            break
    assert code == 1 and found["stale-read"] >= 1, found


@pytest.mark.slow
def test_cache_faults_catch_a_warm_read_that_keeps_its_first_servers_identity():
    """A warm hit is a plain MGET judged against the run_id its connection learned; a tier that
    does not learn it again when the connection reconnects (the SERVER_ID_KEPT defect) trusts
    what a Redis restarted from an older snapshot reloaded -- memcheck's restart fault shows it,
    as a self-test variant with --faults cache."""
    redis_alias()
    config = WorkloadConfig(seconds=6, ops=None)
    result = run_self_test(["default"], config, faults="cache", defects=[Defect.SERVER_ID_KEPT])
    real, outcome = result.outcomes
    assert real.passed, real
    assert outcome.applicable and outcome.caught.get("stale-read", 0) >= 1, outcome


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_the_default_run_catches_a_tier_that_trusts_another_servers_entries(settings):
    """memcheck's default faults, on the project's own Redis, plant an older version stamped with
    another server process's identity in one of the run's keys (a snapshot restore's leftover):
    the store as it ships ignores it; a tier without the identity check serves it (the seam:
    CACHE_PROTECTION=False)."""
    redis_alias()
    code, report = run_json("--ops", "2000")
    assert report["faults"]["injected"].get("foreign-entry", 0) >= 1, report["faults"]
    assert code == 0, report["anomalies"][:3]
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE_PROTECTION": False}
    code, report = run_json("--ops", "2000")
    assert report["faults"]["injected"].get("foreign-entry", 0) >= 1, report["faults"]
    assert code == 1 and any(a["check"] == "stale-read" for a in report["anomalies"])


def test_cache_faults_without_a_cache_tier_or_with_unsafe_exit_2(settings):
    from agentmemory.consistency.faults import FaultsUnavailable, fault_kinds

    with pytest.raises(FaultsUnavailable, match="AGENTMEMORY\\['CACHE'\\] is not set"):
        fault_kinds("cache", "default", None)
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="use --faults db") as info:
        call_command("memcheck", "--faults", "cache", "--unsafe")
    assert info.value.returncode == 2


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_memcheck_workloads_can_be_chosen(tmp_path):
    history = tmp_path / "h.jsonl"
    code, report = run_json("--workloads", "list", "--ops", "200", "--history", str(history))
    assert code == 0, report
    kinds = {op["kind"] for op in history_ops(history)}
    assert kinds == {"append", "recall"}
    sessions = {op["session_id"] for op in history_ops(history)}
    assert len(sessions) == 1  # no isolation workload: one session
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown workload"):
        call_command("memcheck", "--workloads", "list,bogus")
    # Names are exact: the ADK workload is "adk", not "ADK" or "Adk".
    for wrong in ("ADK", "Adk", "adk-session"):
        with pytest.raises(CommandError, match=f"unknown workload.*{wrong}"):
            call_command("memcheck", "--workloads", wrong)


def test_the_history_records_where_each_read_came_from(tmp_path):
    """Without faults: what is checked is the recording, not the store under faults. With the
    default lock fault (writers held a moment) the run failed once on PostgreSQL under load with
    one of the two sources missing -- not reproduced; the likeliest cause is fences lapsing
    while writers waited, which the faults' timing decides, not the history's recording."""
    redis_alias()
    history = tmp_path / "h.jsonl"
    code, out = run("--ops", "400", "--faults", "none", "--history", str(history))
    assert code == 0, out  # the report, with its counterexamples, when the run found anything
    sources = Counter(
        op["source"]
        for op in history_ops(history)
        if op["kind"] == "recall" and op["status"] == "ok"
    )
    assert sources["cache"] > 0 and sources["database"] > 0, sources


def test_audit_finds_a_diverging_cache_entry_and_an_unpurged_expired_row(store):
    redis_alias()
    if store.cache is None:
        store.remember("s", "k", 1, ttl=60)
        clock.advance(2 * 3600)
        code, out = run("--audit")
        assert code == 1 and "expired-live-row" in out and "purge_expired" in out
        code, out = run("--audit", "--grace", "86400")
        assert code == 0, out
        return
    store.remember("s", "k", 1)
    store.remember("s", "k", 2)
    assert store.recall("s", "k").version == 2
    code, out = run("--audit")
    assert code == 0, out
    # An entry this server would serve: its run_id, the database's epoch, the lineage.
    trusted = store.cache.trusted_stamp()
    store.cache.client.set(store.cache.entry_key("s", "k"), f"1|{trusted}|planted")
    code, out = run("--audit")
    assert code == 1 and "cache-divergence" in out and "Redis holds v1, the database v2" in out


def test_audit_finds_cache_entries_whose_value_or_memory_the_database_lacks():
    """What a database that went back (a failover that lost writes, a restore) leaves in a
    tier that did not follow it: v2 with another value than the database's v2, and a memory the
    database does not have at all. Entries the tier would not serve (another epoch) are no
    finding: nothing reads them."""
    store = MemoryStore(cache=redis_alias())
    store.remember("s", "k", "kept")
    store.remember("s", "k", "the database's v2")
    code, out = run("--audit")
    assert code == 0, out
    trusted = store.cache.trusted_stamp()
    lost_v2 = dataclasses.replace(store.recall("s", "k"), value="a lost v2")
    gone = dataclasses.replace(lost_v2, key="gone", version=3)
    client = store.cache.client
    client.set(store.cache.entry_key("s", "k"), f"2|{trusted}|{encode_payload('s', 'k', lost_v2)}")
    client.set(
        store.cache.entry_key("s", "gone"), f"3|{trusted}|{encode_payload('s', 'gone', gone)}"
    )
    code, out = run("--audit")
    assert code == 1, out
    assert "Redis holds v2 = 'a lost v2', the database's v2 = \"the database's v2\"" in out
    assert "('s', 'gone'): Redis holds v3 = 'a lost v2' of a memory the database does not" in out
    # Stamped with another epoch, the same entries are never served: nothing to report.
    older = stamp(client.info("server")["run_id"], "fffffffe")
    client.set(store.cache.entry_key("s", "k"), f"2|{older}|{encode_payload('s', 'k', lost_v2)}")
    client.set(store.cache.entry_key("s", "gone"), f"3|{older}|{encode_payload('s', 'gone', gone)}")
    code, out = run("--audit")
    assert code == 0, out


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--seconds", "0"], "--seconds"),
        (["--seconds", "-1"], "--seconds"),
        (["--seconds", "nan"], "--seconds"),
        (["--workers", "100000"], "at most 512"),
        (["--processes", "-1"], "--processes"),
        (["--ops", "0"], "--ops"),
    ],
)
def test_memcheck_refuses_a_bad_budget_before_running(args, named):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=named):
        call_command("memcheck", *args)
    assert not Memory.objects.exists()


def test_memcheck_refuses_an_unwritable_history_file_before_running(tmp_path):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="cannot write --history") as info:
        call_command("memcheck", "--history", str(tmp_path / "missing" / "h.jsonl"))
    assert info.value.returncode == 2
    assert not Memory.objects.exists()


def test_memcheck_bad_arguments_exit_2_from_the_command_line():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "manage.py", "memcheck", "--seconds", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--seconds" in done.stderr


def test_memcheck_help_states_every_default():
    from django.core.management.base import BaseCommand

    from agentmemory.management.commands.memcheck import Command

    django_own = {a.dest for a in BaseCommand().create_parser("manage.py", "x")._actions}
    parser = Command().create_parser("manage.py", "memcheck")
    for action in parser._actions:  # argparse's listing of the options
        if action.option_strings and action.dest not in django_own:
            assert action.help, f"{action.option_strings} has no help"
            if action.default not in (None, False) and action.dest not in ("workloads", "grace"):
                assert "default" in action.help, f"{action.option_strings} states no default"


def test_the_report_says_how_many_calls_raised_and_why_beside_the_result():
    from agentmemory.consistency.history import History, Operation
    from agentmemory.consistency.report import render_text
    from agentmemory.consistency.runner import RunResult
    from agentmemory.consistency.workloads import WorkloadConfig

    history = History("r")
    for i in range(10):
        op = Operation(f"op{i}", "c0", "remember", "s", "k", 0.0, completed_at=0.1, status="ok")
        if i < 3:
            op.status = "info"
            op.error = (
                "MemoryUnavailable: database 'default' still failing after 12 attempts in 20.0 s "
                "(RETRY: ATTEMPTS 12, DEADLINE 30.0 s): database is locked"
            )
        history.operations.append(op)
    result = RunResult(
        run_id="r",
        database="default",
        vendor="sqlite",
        unsafe=False,
        config=WorkloadConfig(),
        history=history,
        anomalies=[],
        seconds=1.0,
    )
    text = render_text(result)
    assert "3 of 10 calls raised to their caller" in text
    assert "3 x MemoryUnavailable: database is locked" in text
    assert "agentmemory.W001" in text
    assert text.splitlines()[-1] == "RESULT: no anomaly (3 of 10 calls raised, see above)"
    assert result.as_dict()["raised"] == {"MemoryUnavailable: database is locked": 3}


def test_the_report_tells_errors_the_contract_allows_from_anomalies_and_counts_calls_once():
    """An --unsafe run's raw IntegrityErrors were listed as "not anomalies" while the check
    caller-error failed on them; and the summary counted operations three ways."""
    from agentmemory.consistency.history import History, Operation
    from agentmemory.consistency.report import render_text
    from agentmemory.consistency.runner import RunResult
    from agentmemory.consistency.workloads import WorkloadConfig

    history = History("r")
    for i, error in enumerate(["MemoryUnavailable: gone", "IntegrityError: UNIQUE", None]):
        op = Operation(f"op{i}", "c0", "log-append", "s", "k", 0.0, completed_at=0.1)
        op.status, op.error = ("info", error) if error else ("ok", None)
        history.operations.append(op)
    result = RunResult(
        run_id="r",
        database="default",
        vendor="sqlite",
        unsafe=True,
        config=WorkloadConfig(ops=2),
        history=history,
        anomalies=[],
        seconds=1.0,
    )
    text = render_text(result)
    assert "3 calls by 8 workers" in text and "for 2 workload steps" in text
    assert "operations" not in text.split("\n\n")[0]
    allowed, refused = text.split("as the contract allows")[1].split("does not allow")
    assert "1 x MemoryUnavailable: gone" in allowed and "IntegrityError" not in allowed
    assert "1 x IntegrityError: UNIQUE" in refused and "caller-error" in text
    assert "info: no answer" in text


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_strict_makes_refusals_no_fault_explains_anomalies(settings):
    """``--strict``: the real store under the lock fault refuses nothing. The declared seam, a
    store that gives up at once (RETRY: one attempt, a 0.2 s deadline -- shorter than the held
    lock), refuses calls: without --strict they are listed and the run passes (check refusal
    off); with it each is a refusal anomaly, named, and the run fails."""
    args = ("--faults", "lock", "--seconds", "3", "--workers", "6", "--workloads", "register")
    code, report = run_json(*args, "--strict")
    assert code == 0, report["anomalies"][:3]

    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "RETRY": {"ATTEMPTS": 1, "DEADLINE": 0.2}}
    code, report = run_json(*args)
    # What was found, named (a CI run once failed here with the report cut to its first keys).
    assert code == 0 and any(c.startswith("MemoryUnavailable") for c in report["raised"]), (
        code,
        report["anomalies"][:3],
        report["raised"],
    )
    code, report = run_json(*args, "--strict")
    refused = [a for a in report["anomalies"] if a["check"] == "refusal"]
    assert code == 1 and refused, report["raised"]
    assert {a["check"] for a in report["anomalies"]} == {"refusal"}
    assert "refused" in refused[0]["message"]


@pytest.mark.parametrize("other", ["--audit", "--self-test", "--check=history.jsonl"])
def test_strict_is_refused_where_no_run_is_judged(other):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--strict judges a run") as refused:
        run("--strict", other)
    assert refused.value.returncode == 2


def test_a_workload_whose_package_is_missing_is_left_out_not_an_import_error():
    """``google-adk`` absent means no ``google`` package at all: ``find_spec("google.adk")``
    raises instead of answering None, and memcheck failed to import in a fresh project (the
    wheel's smoke test). A missing package, dotted or not, is just not installed."""
    from agentmemory.consistency.workloads import importable

    assert importable("json") and importable("email.mime")
    assert not importable("no_such_package_agentmemory")
    assert not importable("no_such_package_agentmemory.adk")


def test_each_race_step_commits_its_partners_writes_between_the_reads():
    """A search race stops its first search between its two reads, and a recall_many race its
    read between Redis and the database, until the partner's writes committed (the holds of
    agentmemory.defects): the race the checks look for is met in every step, not by chance.
    A search that found no candidate, or a read served whole by Redis, never stops."""
    from agentmemory.consistency.runner import run_memcheck as run_api

    redis_alias()
    result = run_api("default", WorkloadConfig(ops=300, workloads=("search", "many"), seed=3))
    assert result.anomalies == []
    ops = result.history.operations
    between = {"search": 0, "many": 0}
    for write in (o for o in ops if o.id.endswith("-w0") and o.client.endswith("w")):
        base = write.id.removesuffix("-w0")
        family = "search" if write.key.startswith("search-") else "many"
        prefixes = (
            (f"{base}-search-",) if family == "search" else (f"{base}-many-", f"{base}-Many-")
        )
        reads = [o for o in ops if o.id.startswith(prefixes)]
        assert reads, write
        stopped = (
            any(o.version is not None for o in reads)
            if family == "search"
            else reads[0].source == "database"
        )
        if stopped:
            assert all(
                o.invoked_at < write.invoked_at and write.completed_at <= o.completed_at
                for o in reads
            ), (write, reads[0])
            between[family] += 1
    assert between["search"] >= 3 and between["many"] >= 3, between


def test_via_mcp_runs_the_workloads_through_the_server_as_two_principals():
    """``--via mcp``: every call a tool call of the MCP server, as one of two principals whose
    sessions share names; the checks judge what it stored, where; nothing is left behind. A
    server that forgets the principal's prefix (the declared seam) is caught."""
    from agentmemory.consistency.mcp import PRINCIPALS
    from agentmemory.consistency.runner import run_memcheck as run_api

    redis_alias()
    config = WorkloadConfig(ops=200, workloads=("register", "isolation", "idempotent"), via="mcp")
    result = run_api("default", config)
    assert result.anomalies == [], result.anomalies[:3]
    sessions = {op.session_id for op in result.history.operations}
    for principal in PRINCIPALS:
        assert any(s.startswith(f"mcp:{principal}:memcheck-{result.run_id}-") for s in sessions)
    assert not Memory.objects.filter(session_id__contains=result.run_id).exists()
    broken = run_api("default", config, defects=(Defect.MCP_SHARED_SESSIONS,))
    checks = {a.check for a in broken.anomalies}
    assert {"cross-session-read", "lost-update"} <= checks, checks
    assert not Memory.objects.filter(session_id__contains=broken.run_id).exists()


def test_via_mcp_refuses_the_workloads_its_tools_do_not_cover():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"--via mcp runs the workloads .* not ttl, log") as info:
        call_command("memcheck", "--via", "mcp", "--workloads", "register,ttl,log")
    assert info.value.returncode == 2


@pytest.mark.slow  # memcheck runs with a self-test variant: every backend in make test
def test_the_sliding_ttl_probe_catches_a_read_that_renews_the_expiry_in_every_run():
    """The ttl workload ends with a probe (a memory with a 0.6 s TTL, read at 60 % of it, read
    again just after it): the variant ttl-renewed-on-read shows as an expired-read on the probe's
    key in every run -- a CI run on PostgreSQL once missed it three times when only the
    workload's 150 ms TTLs could show it; the store as it ships reads nothing there."""
    from agentmemory.consistency.runner import run_memcheck as run_api

    for seed in range(2):
        config = WorkloadConfig(ops=100, workloads=("ttl",), seed=seed)
        clean = run_api("default", config)
        assert clean.anomalies == [], clean.anomalies[:3]
        broken = run_api("default", config, defects=(Defect.TTL_RENEWED_ON_READ,))
        probe = {a.check for a in broken.anomalies if a.key == "ttl-probe"}
        assert "expired-read" in probe, broken.anomalies[:5]
