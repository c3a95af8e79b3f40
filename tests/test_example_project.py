"""The example downstream project (examples/agent_backend) runs its own suite with nothing but the
plugin -- on this test run's database server -- and that suite catches an unlocked writer."""

import os
import subprocess
import sys
from pathlib import Path

import dj_database_url
import pytest
from django.conf import settings
from django.db import connection

from project.settings import cluster_urls

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "agent_backend"


def example_env() -> dict[str, str]:
    """This run's server, but a database of the example's own (``<this run's>_example``: its
    test database is never this suite's)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    # This suite's settings module is in the environment (pytest-django puts it there), and it
    # would win over the example's own: the example would then run on this suite's test database.
    env["DJANGO_SETTINGS_MODULE"] = "agent_backend.settings"
    # A cluster's URL lists every node: the example project is a one-database project, on node 1
    # -- on a PostgreSQL HA cluster, on the primary (a failover may have moved it off node 1).
    urls = cluster_urls(os.environ.get("DATABASE_URL", ""))
    url = urls[0]
    if len(urls) > 1 and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT inet_server_port()")
            port = cursor.fetchone()[0]
        (url,) = [one for one in urls if dj_database_url.parse(one)["PORT"] == port]
    if url and not url.startswith("sqlite"):
        # Named after this run's database: two runs on one server (CI's lanes) never share it.
        name = dj_database_url.parse(url)["NAME"]
        env["DATABASE_URL"] = url.rsplit("/", 1)[0] + f"/{name}_example"
    else:
        env.pop("DATABASE_URL", None)  # the example's own SQLite file
    if settings.AGENTMEMORY.get("CACHE"):
        env["REDIS_URL"] = settings.CACHES[settings.AGENTMEMORY["CACHE"]]["LOCATION"]
    return env


def run_example(*args: str) -> subprocess.CompletedProcess:
    env = example_env()
    if "DATABASE_URL" not in env:
        # A run that ended with a transaction open leaves a hot journal (or WAL) beside its test
        # database; a new database of the same name would then be rolled back against it ("disk
        # I/O error"). Each run on SQLite starts from no file at all. (On a server the example
        # has no file here: a run on SQLite beside this one, CI's other lane, keeps its own.)
        for stale in EXAMPLE.glob("test_agent_backend*.sqlite3*"):
            stale.unlink(missing_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# django_db: example_env asks this run's connection which host is the primary (PostgreSQL HA).
pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def test_the_example_project_passes_with_the_plugin():
    result = run_example()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


def test_the_example_project_catches_an_unlocked_writer():
    result = run_example("-p", "no:agentmemory", "-p", "unlocked_memory_plugin")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    wanted = "FAILED tests/test_agent_memory.py::test_parallel_preference_updates_are_all_kept"
    assert wanted in result.stdout, output
    assert "3 passed" in result.stdout  # the other tests do not depend on the lock
