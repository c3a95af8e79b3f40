from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from hypothesis import settings as hypothesis_settings

from agentmemory import MemoryStore, clock
from agentmemory.testing import concurrently

# Deterministic property tests: the same examples on every run (CI must not pass or fail by the
# luck of a random seed). HYPOTHESIS_PROFILE=explore searches anew each run, to look for bugs.
hypothesis_settings.register_profile("deterministic", derandomize=True, database=None)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def pytest_configure(config):
    from django.conf import settings

    # Django's advice for a suite's speed: pytest-django's admin_client makes a user with a
    # password for each of ~200 tests a backend, and the default hasher (PBKDF2, 1.2 million
    # rounds) spends 0.2-0.3 s of CPU on each -- minutes of a CI run whose cores are saturated.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(params=["db", "redis"])
def store(request) -> MemoryStore:
    """Every store test runs twice: on the database alone, and with the Redis tier."""
    if request.param == "db":
        return MemoryStore(cache=None)
    return MemoryStore(cache=redis_alias())


def redis_alias() -> str:
    from django.conf import settings
    from django.core.cache import caches

    if "agentmemory" not in settings.CACHES:
        pytest.fail("the cache tests need Redis: set REDIS_URL (scripts/test.sh does)")
    caches["agentmemory"].clear()  # a test database starts empty: so must its cache
    return "agentmemory"


def pytest_collection_modifyitems(config, items):
    """Tests that do not apply to this backend are deselected (never skipped on one where they
    apply): ``server`` tests act on a server connection (SQLite runs in-process), ``sqlite`` tests
    on SQLite's own locking; ``cluster``
    tests need the nodes of a cluster (aliases node2, node3: a multi-host DATABASE_URL);
    ``postgres`` tests are about PostgreSQL's driver settings, ``mysql`` tests the MySQL
    family's own read paths; ``pg_ha`` tests need the local
    PostgreSQL HA cluster (one alias over several hosts: scripts/pg-ha.sh); ``mariadb_pair``
    tests the local MariaDB primary and replica behind their router (scripts/mariadb-pair.sh)."""
    from django.conf import settings

    from agentmemory.consistency import mysql_pair

    not_here = set()
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        not_here.add("server")
    else:
        not_here.add("sqlite")
    if "node2" not in settings.DATABASES:
        not_here.add("cluster")
    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        not_here.add("postgres")
    if not settings.DATABASES["default"]["ENGINE"].endswith("mysql"):
        not_here.add("mysql")
    if "," not in str(settings.DATABASES["default"].get("HOST") or ""):
        not_here.add("pg_ha")
    if str(settings.DATABASES["default"].get("PORT") or "") != str(mysql_pair.ROUTER_PORT):
        not_here.add("mariadb_pair")
    deselected = [i for i in items if any(i.get_closest_marker(m) for m in not_here)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [i for i in items if i not in deselected]


@pytest.fixture(autouse=True)
def _reset_clock():
    yield
    clock.reset()


@pytest.fixture
def vendor() -> str:
    from agentmemory.vendors import flavor

    return flavor(connection)


def run_threads(fn: Callable[[int], Any], workers: int) -> list[Any]:
    """Run fn(i) in `workers` threads started together, each with its own connection."""
    return concurrently(fn, workers)


@pytest.fixture(scope="session", autouse=True)
def _no_connection_left_open(django_db_setup, django_db_blocker):
    """When the run ends, no connection but this thread's may hold the test database: one left
    open (a pool thread's, a worker's) makes PostgreSQL refuse to drop it -- and in an app, it is
    a connection that is never given back. Checked on PostgreSQL, which can list them."""
    yield
    import threading
    import time

    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            return
        # A connection a thread closed a moment ago is listed until its backend has seen the
        # client go (it exits asynchronously): wait for that, a few seconds at most.
        deadline = time.monotonic() + 5
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid, backend_start, state, left(query, 120) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'"
                )
                others = cursor.fetchall()
            if not others or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    threads = [t.name for t in threading.enumerate()]
    assert not others, f"connections left open on the test database: {others}; threads {threads}"


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser():
    """Debian's Chromium, headless, driven by Selenium through its ChromeDriver (no browser
    download: both paths are given). A machine without them fails the test, saying so."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed: scripts/bootstrap.sh installs them")
    options = Options()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--allow-file-access-from-files",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()
