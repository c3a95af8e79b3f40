"""History retention: prune_history / manage.py prunehistory keep the newest versions (and/or the
young ones), never the newest, never restart the numbering; "no gap" holds above the watermark;
a pruned version is a clear answer (VersionPruned), a missing one an anomaly; safe beside live
writers."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from agentmemory import InvalidMemory, MemoryStore, VersionPruned
from agentmemory.consistency.audit import audit
from agentmemory.models import Memory

from .conftest import run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def versions(store, key="k"):
    return [h.version for h in store.history("s", key)]


def test_keep_last_keeps_the_newest_versions_and_the_count_goes_on(store):
    for i in range(10):
        store.remember("s", "k", i)
    store.remember("s", "short", 1)
    assert store.prune_history(keep_last=3) == 7
    assert versions(store) == [8, 9, 10] and versions(store, "short") == [1]
    assert Memory.objects.get(session_id="s", key="k").history_from == 8
    assert store.remember("s", "k", "next").version == 11  # the numbering never restarts
    assert store.prune_history(keep_last=3) == 1 and versions(store) == [9, 10, 11]
    assert store.prune_history(keep_last=3) == 0  # resumable: nothing more to do


def test_keep_days_keeps_young_versions_and_always_the_newest(store, memory_clock):
    for i in range(4):
        store.remember("s", "k", i)
    memory_clock.advance(3 * 86400)
    store.remember("s", "k", "young")
    store.remember("s", "old", "only version")
    memory_clock.advance(3 * 86400)
    assert store.prune_history(keep_days=4) == 4
    assert versions(store) == [5]  # v5 is 3 days old: kept
    assert versions(store, "old") == [1]  # older than 4 days, but the newest: kept


def test_either_rule_keeps_a_version(store, memory_clock):
    for i in range(6):
        store.remember("s", "k", i)
    memory_clock.advance(10 * 86400)
    store.remember("s", "k", "young")
    assert store.prune_history(keep_last=3, keep_days=1) == 4  # the newest 3: v5, v6, v7
    assert versions(store) == [5, 6, 7]


def test_a_pruned_version_is_a_clear_answer_and_a_missing_one_is_not(store):
    for i in range(5):
        store.remember("s", "k", i)
    store.prune_history(keep_last=2)
    with pytest.raises(VersionPruned, match="kept from version 4") as pruned:
        store.recall("s", "k", version=2)
    assert (pruned.value.version, pruned.value.kept_from) == (2, 4)
    with pytest.raises(VersionPruned):
        store.revert("s", "k", 1)
    assert store.recall("s", "k", version=4).value == 3
    assert store.recall("s", "k", version=99) is None  # never written: no such version
    assert store.revert("s", "k", 4).version == 6


def test_the_audit_passes_after_a_prune_and_still_finds_a_gap_above_the_watermark(store):
    for i in range(6):
        store.remember("s", "k", i)
    store.prune_history(keep_last=3)
    assert audit("default")[1] == []
    Memory.objects.filter(session_id="s", key="k").get().versions.filter(version=5).delete()
    anomalies = audit("default")[1]
    assert [a.check for a in anomalies] == ["version-gap"]
    assert "kept from v4" in anomalies[0].message


def test_prune_beside_concurrent_writers_loses_nothing_above_the_watermark():
    store = MemoryStore(cache=None)
    acknowledged = {}

    def work(worker):
        if worker == 0:
            return [store.prune_history(keep_last=5) for _ in range(15)]
        mine = MemoryStore(cache=None)
        acknowledged[worker] = [mine.remember("s", f"k{worker % 2}", i).version for i in range(40)]
        return None

    run_threads(work, 5)
    for key in ("k0", "k1"):
        row = Memory.objects.get(session_id="s", key=key)
        kept = versions(store, key)
        assert kept == list(range(row.history_from, row.version + 1))
        assert row.version == 80  # two writers of 40 on each key: every write is a version
    store.prune_history(keep_last=5)
    assert audit("default")[1] == []


def test_the_command_prunes_in_batches_with_a_dry_run_first(store):
    for key in ("a", "b", "c"):
        for i in range(4):
            store.remember("s", key, i)
    out, err = StringIO(), StringIO()
    call_command(
        "prunehistory", "--keep-last", "1", "--batch", "2", "--dry-run", stdout=out, stderr=err
    )
    assert "would remove 9 versions" in out.getvalue() and "3/3 memories" in err.getvalue()
    assert versions(store, "a") == [1, 2, 3, 4]
    call_command("prunehistory", "--keep-last", "1", stdout=out)
    assert "removed 9 versions" in out.getvalue() and versions(store, "a") == [4]


def test_the_settings_policy_applies_and_bad_values_are_refused(store, settings):
    for i in range(4):
        store.remember("s", "k", i)
    assert store.prune_history() == 0  # the default keeps everything
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "HISTORY_RETENTION": {"KEEP_LAST": 2}}
    assert store.prune_history() == 2
    for bad in ({"keep_last": 0}, {"keep_days": -1}, {"keep_days": "7"}):
        with pytest.raises(InvalidMemory):
            store.prune_history(**bad)


def test_prune_can_be_limited_to_one_session(store):
    for session_id in ("a", "b"):
        for i in range(4):
            store.remember(session_id, "k", i)
    assert store.prune_history(keep_last=1, session_id="a") == 3
    assert [h.version for h in store.history("b", "k")] == [1, 2, 3, 4]


def test_the_command_names_an_unknown_database_and_a_missing_policy():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown database alias 'nope'") as info:
        call_command("prunehistory", "--database", "nope", "--keep-last", "1")
    assert info.value.returncode == 2
    out = StringIO()
    call_command("prunehistory", "--dry-run", stdout=out)
    assert "no retention policy is set" in out.getvalue()
