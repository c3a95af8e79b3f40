"""memcheck proves itself: the self-test on this backend, and the guarantees its variants break,
each tested through the public API with the declared seams of :mod:`agentmemory.defects`."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction

from agentmemory import InvalidMemory, MemoryStore
from agentmemory.consistency.selftest import REAL, run_self_test
from agentmemory.consistency.workloads import WorkloadConfig
from agentmemory.defects import (
    CACHE_DEFECTS,
    DESCRIPTIONS,
    Defect,
    InjectedFailure,
    fail_after_first_key,
)
from agentmemory.models import Memory, MemoryVersion

from .conftest import redis_alias

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def stored_values(session_id: str) -> dict[str, object]:
    return dict(
        Memory.objects.filter(session_id=session_id, state="live").values_list("key", "value")
    )


def assert_all_or_nothing(store: MemoryStore) -> None:
    """A remember_many that fails after its first key leaves nothing: no row, no version, no
    cache entry, and the keys as they were."""
    store.remember("s", "b", "before")
    with fail_after_first_key(), pytest.raises(InjectedFailure):
        store.remember_many("s", {"a": "new", "b": "new", "c": "new"})
    assert stored_values("s") == {"b": "before"}, "remember_many left part of its write"
    assert MemoryVersion.objects.filter(memory__session_id="s").count() == 1
    assert store.recall_many("s", ["a", "b", "c"]).keys() == {"b"}
    assert store.recall("s", "b").value == "before"


def test_remember_many_is_all_or_nothing_when_it_fails_midway(store):
    assert_all_or_nothing(store)
    # The failpoint fires once: the same call then writes every key.
    assert store.remember_many("s", {"a": 1, "c": 3}).keys() == {"a", "c"}


def test_the_all_or_nothing_test_fails_on_a_store_that_commits_key_by_key():
    broken = MemoryStore(cache=None, defects={Defect.NON_ATOMIC_MANY})
    with pytest.raises(AssertionError, match="left part of its write"):
        assert_all_or_nothing(broken)


def test_remember_many_inside_a_failed_caller_transaction_leaves_nothing(store):
    with pytest.raises(RuntimeError), transaction.atomic():
        store.remember_many("s", {"a": 1, "b": 2})
        raise RuntimeError("the caller's own code fails")
    assert stored_values("s") == {} and store.recall_many("s", ["a", "b"]) == {}


def test_a_store_with_defects_says_so_and_rejects_unknown_ones():
    broken = MemoryStore(cache=None, defects=["skipped-version"])
    assert "skipped-version" in repr(broken) and "defects" not in repr(MemoryStore(cache=None))
    with pytest.raises(ValueError):
        MemoryStore(cache=None, defects=["no-such-bug"])


def test_every_defect_is_described():
    assert set(DESCRIPTIONS) == set(Defect)


@pytest.mark.parametrize("ttl", [0, -1, 0.0])
def test_ttl_zero_or_negative_is_refused_and_the_defect_accepts_it(store, ttl):
    with pytest.raises(InvalidMemory, match="ttl"):
        store.remember("s", "k", 1, ttl=ttl)
    assert not Memory.objects.exists()
    broken = MemoryStore(cache=None, defects={Defect.TTL_ZERO_IS_FOREVER})
    assert broken.remember("s", "k", 1, ttl=ttl).expires_at is None  # the bug, planted


def run(*args: str) -> tuple[int, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("memcheck", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, out.getvalue()


@pytest.mark.slow
# Every variant once or more (43, the faulted ones each a round of faults): 3-4 minutes here on
# SQLite, more on a Galera cluster -- past the suite's 300 s bound for a hung test.
@pytest.mark.timeout(900)
def test_the_self_test_catches_every_variant_on_this_backend(settings):
    """The real store passes; every variant that applies here is caught by at least one check;
    the rest say why they do not apply. With and without Redis: the cache variants apply only
    with it."""
    redis_alias()
    # The move variant's shards: this database and the suite's other (a run outside the tests,
    # without AGENTMEMORY["SHARDS"], makes a SQLite shard of its own: tests/test_moves.py).
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": ["default", "other"]}
    code, out = run("--self-test", "--database", "default", "--ops", "600", "--format", "json")
    report = json.loads(out)
    # What failed first, by name (the whole report is long enough to be cut from CI's log).
    failed = {v["name"]: (v["runs"], v["caught"]) for v in report["variants"] if not v["passed"]}
    assert code == 0 and not failed, (failed, out)
    outcomes = {v["name"]: v for v in report["variants"]}
    assert set(outcomes) == {REAL} | {d.value for d in Defect}
    assert outcomes[REAL]["caught"] == {} and outcomes[REAL]["passed"]
    for defect in Defect:
        outcome = outcomes[defect.value]
        if outcome["applicable"]:
            assert outcome["caught"], f"{defect} was not caught"
        else:
            assert outcome["reason"]
    # The tier's second lines, each by the check of the fault that breaks its partner (in every
    # run: these faults are deterministic races, tests/test_fill_safeguards.py), and the hit's
    # expiry check by expired-read (redis-clock).
    by_check = {
        Defect.HIT_EXPIRY_UNCHECKED: ("expired-read",),
        Defect.FILL_IGNORES_VERSION: ("writer-crash",),
        Defect.FILL_IGNORES_LEASE: ("cache-evict",),
        # no lease and no version check: both faults' scenarios show it
        Defect.FILL_WITHOUT_LEASE: ("cache-evict", "writer-crash"),
        Defect.FENCE_FROM_RENEWAL: ("fence-race",),
        Defect.RENEWAL_IGNORES_PENDING: ("fence-race",),
    }
    for defect, checks in by_check.items():
        outcome = outcomes[defect.value]
        assert any(outcome["caught"].get(check, 0) for check in checks), (
            defect,
            checks,
            outcome["caught"],
            outcome["fault_errors"],
        )
    applicable = {d for d in Defect if outcomes[d.value]["applicable"]}
    # Redis is on: every cache variant but the one that needs a Redis restart (--faults cache)
    postgres = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    assert applicable >= set(Defect) - {
        Defect.NOT_RETRIED,
        Defect.SERVER_ID_KEPT,
        Defect.UPSERT_SKIPS_HISTORY,
        Defect.PUT_FUNCTION_FORKS,
    }
    assert "--faults cache" in outcomes[Defect.SERVER_ID_KEPT.value]["reason"]
    # The write function's own seam: on PostgreSQL, where the function is, it is caught.
    assert (Defect.UPSERT_SKIPS_HISTORY in applicable) == postgres
    assert (Defect.PUT_FUNCTION_FORKS in applicable) == postgres
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        assert Defect.NOT_RETRIED not in applicable
    else:
        assert Defect.NOT_RETRIED in applicable
    assert not Memory.objects.filter(session_id__startswith="memcheck-").exists()


def test_without_a_cache_tier_the_cache_variants_do_not_apply(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": None}
    config = WorkloadConfig(ops=300, workloads=("register",))
    result = run_self_test(["default"], config, faults="none", defects=sorted(CACHE_DEFECTS))
    assert result.ok
    assert all(not o.applicable and "no cache tier" in o.reason for o in result.outcomes[1:])


def test_a_variant_the_workload_cannot_reach_is_reported_missed():
    """A self-test that fails: with only the register workload (no TTLs written), a store that
    keeps TTLs on overwrite slips through, and the self-test says so (exit 1 from the command)."""
    config = WorkloadConfig(ops=300, workloads=("register",))
    result = run_self_test(
        ["default"], config, faults="none", attempts=1, defects=[Defect.TTL_KEPT_ON_OVERWRITE]
    )
    assert not result.ok
    missed = result.outcomes[1]
    assert (missed.name, missed.applicable, missed.passed) == (
        "ttl-kept-on-overwrite",
        True,
        False,
    )
