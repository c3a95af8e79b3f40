"""manage.py memcheck: exit 0 on the locked path, 1 with counterexamples on the unlocked one."""

import json

import pytest
from django.core.management import call_command

from agentmemory.models import Memory

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args):
    from io import StringIO

    out, err = StringIO(), StringIO()
    try:
        call_command("memcheck", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, out.getvalue()


def test_memcheck_passes_on_the_locked_path_and_cleans_up(settings):
    code, out = run("--ops", "600", "--workers", "6")
    assert code == 0, out
    assert "RESULT: no anomaly" in out
    if settings.AGENTMEMORY.get("CACHE"):  # REDIS_URL set: the run went through Redis
        assert "cache tier: off" not in out and " hits " in out
    assert not Memory.objects.filter(session_id__startswith="memcheck-").exists()


def test_memcheck_unsafe_finds_lost_updates_with_counterexamples():
    code, out = run("--ops", "800", "--workers", "8", "--unsafe")
    assert code == 1, out
    assert "lost-update         FAIL" in out
    assert "acknowledged append" in out
    assert not Memory.objects.filter(session_id__startswith="memcheck-").exists()


def test_memcheck_json_report(tmp_path):
    history = tmp_path / "history.jsonl"
    code, out = run("--ops", "200", "--format", "json", "--history", str(history))
    report = json.loads(out)
    assert code == 0 and report["anomalies"] == [] and report["operations"] == 200
    assert len(history.read_text().splitlines()) == 200


def test_memcheck_with_processes():
    code, out = run("--ops", "200", "--workers", "2", "--processes", "2")
    assert code == 0, out


def test_memcheck_audit_finds_a_planted_gap(store):
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
