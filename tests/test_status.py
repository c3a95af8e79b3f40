"""``manage.py agentmemory_status`` (#47, item 4): ready, degraded (Redis unreachable, an
invalidation pending) or down (a database not migrated), with the exit code a probe reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agentmemory.models import PendingInvalidation

from .conftest import redis_alias

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("agentmemory_status", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def states(text: str) -> dict[str, str]:
    report = json.loads(text)
    return {check["check"]: check["state"] for check in report["checks"]}


def test_a_migrated_database_with_its_tier_up_is_ready(settings):
    redis_alias()
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": "agentmemory"}
    code, out = run("--format", "json")
    assert code == 0, out
    assert states(out) == {
        "database": "ok",
        "migrations": "ok",
        "cache tier": "ok",
        "cache fence": "ok",
        "pending invalidations": "ok",
    }
    code, text = run()
    assert code == 0 and text.strip().endswith("'default': ready")


def test_without_a_tier_it_is_ready_and_says_the_tier_is_off(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": None}
    code, out = run("--format", "json")
    assert code == 0 and states(out)["cache tier"] == "off"


def test_a_pending_invalidation_or_an_unreachable_redis_is_degraded(settings):
    redis_alias()
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": "agentmemory"}
    PendingInvalidation.record("default", "s", ["k"])
    code, out = run("--format", "json")
    assert code == 1 and states(out)["pending invalidations"] == "degraded"
    PendingInvalidation.objects.all().delete()
    settings.CACHES = {
        **settings.CACHES,
        "agentmemory": {**settings.CACHES["agentmemory"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    code, out = run("--format", "json")
    assert code == 1 and states(out)["cache tier"] == "degraded", out
    assert json.loads(out)["state"] == "degraded"


def test_a_database_without_the_migrations_is_down_and_an_unknown_alias_is_refused(tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "agentmemory_status"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "not applied: 0001_initial" in done.stdout and "down" in done.stdout
    code, _ = run("--database", "nope")
    assert code == 2


def test_the_readiness_view_answers_200_while_it_serves_and_says_why(client, settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": None}
    answer = client.get("/agentmemory/status")
    assert answer.status_code == 200 and answer.json()["state"] == "ready"
    assert answer.headers["Cache-Control"].startswith("max-age=0")
    redis_alias()
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": "agentmemory"}
    PendingInvalidation.record("default", "s", ["k"])
    answer = client.get("/agentmemory/status")
    assert answer.status_code == 200 and answer.json()["state"] == "degraded"
    assert client.post("/agentmemory/status").status_code == 405
