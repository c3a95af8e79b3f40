"""SQLite's writers queue: with ``transaction_mode IMMEDIATE`` (what the suite's settings and the
docs configure, system check ``agentmemory.W001``) every write transaction takes the database's
write lock at BEGIN and waits for it (the busy timeout), so concurrent writers -- of one key, of
one log, of one checkpoint thread -- each commit once and not one of them meets "database is
locked", not even as an error a retry absorbed.

The seam: the same database under an alias whose transaction mode is the driver's default
(DEFERRED, what a project gets without W001's fix). There a transaction reads under a shared lock
and fails to upgrade it when another writer got there first: "database is locked" at once (SQLite
does not wait, it would deadlock) -- absorbed by the retries (the data stays right: this is the
availability the lock buys, which memcheck --strict reports), and the test below fails.
"""

from __future__ import annotations

import pytest
from django.db import connections

from agentmemory import MemoryStore
from agentmemory.vendors import Transient

from .conftest import run_threads

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True)]

WORKERS, WRITES = 6, 40
DEFERRED = "sqlite-deferred"


@pytest.fixture(scope="module", autouse=True)
def deferred_alias(django_db_setup, django_db_blocker):
    """The test database under a second alias, without BEGIN IMMEDIATE (the seam). Module-scoped,
    so that it exists before a test's database access is set up (a test names it in its
    ``databases``), and is gone for every other module."""
    settings = dict(connections["default"].settings_dict)
    options = {k: v for k, v in settings["OPTIONS"].items() if k != "transaction_mode"}
    connections.settings[DEFERRED] = {**settings, "OPTIONS": options}
    try:
        yield DEFERRED
    finally:
        with django_db_blocker.unblock():
            connections[DEFERRED].close()
        del connections[DEFERRED]
        del connections.settings[DEFERRED]


def write_concurrently(store: MemoryStore) -> tuple[int, int]:
    """Every worker remembers WRITES versions of one key, appends WRITES items to one log and
    pops some back; returns (the key's last version, the log's last number)."""

    def worker(index: int) -> None:
        for i in range(WRITES):
            store.remember("s", "hot", {"w": index, "i": i})
            store.update("s", "counter", lambda n: n + 1, default=0)
            store.append("s", "log", [{"w": index, "i": i}], idempotency_key=f"{index}.{i}")
            if i % 4 == 0:
                store.pop("s", "log", idempotency_key=f"{index}.{i}.pop")

    run_threads(worker, WORKERS)
    assert store.recall("s", "counter").value == WORKERS * WRITES
    return store.recall("s", "hot").version, store.read_log("s", "log", limit=1)[-1].seq


def locked(store: MemoryStore) -> int:
    """How many 'database is locked' errors the store's retries absorbed."""
    return store.retries[Transient.CONFLICT.value]


def test_concurrent_writers_on_sqlite_queue_on_the_lock_and_never_meet_database_is_locked():
    store = MemoryStore(cache=None)
    version, last = write_concurrently(store)
    assert (version, last) == (WORKERS * WRITES, WORKERS * WRITES)
    assert locked(store) == 0, (
        f"{locked(store)} 'database is locked' errors were absorbed by retries: the writers did "
        "not queue on SQLite's write lock"
    )


@pytest.mark.django_db(transaction=True, databases=["default", DEFERRED])
def test_the_seam_without_begin_immediate_meets_database_is_locked(deferred_alias):
    """The test above fails when the lock is not taken at BEGIN: the same workload, on the same
    file, through the alias without it. The data is still right (retries absorb every error)."""
    store = MemoryStore(using=deferred_alias, cache=None)
    version, last = write_concurrently(store)
    assert (version, last) == (WORKERS * WRITES, WORKERS * WRITES)
    assert locked(store) > 0
