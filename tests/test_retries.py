"""Semantic 8: transient errors are retried inside the store; callers see success or
MemoryUnavailable, never a half-write. Errors are the driver's own, injected on this backend."""

import sqlite3

import pytest
from django.db import DatabaseError, connection

from agentmemory import MemoryStore, MemoryUnavailable
from agentmemory.vendors import Transient, classify

from .helpers import holding_row_lock, inject_errors, inserts_a_version, is_write_statement

pytestmark = pytest.mark.django_db(transaction=True)


def conflict_error():
    """The error this backend raises for a deadlock / busy database."""
    if connection.vendor == "sqlite":
        return sqlite3.OperationalError("database is locked")
    if connection.vendor == "mysql":
        import MySQLdb

        return MySQLdb.OperationalError(
            1213, "Deadlock found when trying to get lock; try restarting transaction"
        )
    import psycopg

    return psycopg.errors.DeadlockDetected("deadlock detected")


def fatal_error():
    if connection.vendor == "sqlite":
        return sqlite3.OperationalError("disk I/O error")
    if connection.vendor == "mysql":
        import MySQLdb

        return MySQLdb.OperationalError(1146, "Table 'x' doesn't exist")
    import psycopg

    return psycopg.errors.UndefinedTable('relation "x" does not exist')


def test_conflict_on_a_write_statement_is_retried_to_a_gap_free_history(store):
    """The first write statement of the 2nd, 3rd and 5th call fails with a conflict (however many
    statements a write takes on this database and path): each call is retried, and the history
    has every value once, in order."""
    store.remember("s", "k", 0)
    hits = 0
    for i in range(1, 6):
        first = [i in (2, 3, 5)]

        def on_its_first_write(n, sql, first=first):
            if first[0] and is_write_statement(sql):
                first[0] = False
                return True
            return False

        with inject_errors(conflict_error, when=on_its_first_write) as hit:
            store.remember("s", "k", i)
        hits += len(hit)
    assert hits == 3
    assert [h.value for h in store.history("s", "k")] == [0, 1, 2, 3, 4, 5]
    assert store.retries["conflict"] == 3


def test_conflict_on_the_history_insert_leaves_no_half_write(store):
    """The row update ran, the history insert failed: the whole transaction is rolled back and
    run again, so the live row never runs ahead of its history."""
    store.remember("s", "k", "a")
    failed = []

    def on_history_insert(n, sql):
        # A plain INSERT, or (PostgreSQL's one-statement write) the CTE that inserts it.
        if inserts_a_version(sql) and not failed:
            failed.append(n)
            return True
        return False

    with inject_errors(conflict_error, when=on_history_insert):
        record = store.remember("s", "k", "b")
    assert record.version == 2
    assert [(h.version, h.value) for h in store.history("s", "k")] == [(1, "a"), (2, "b")]


def test_persistent_conflict_raises_memory_unavailable_and_writes_nothing(settings):
    """Without a deadline, ATTEMPTS bounds the retries of conflicts too."""
    settings.AGENTMEMORY = {"RETRY": {"ATTEMPTS": 3, "BASE_DELAY": 0.001, "DEADLINE": None}}
    store = MemoryStore(cache=None)
    store.remember("s", "k", "a")
    with (
        inject_errors(conflict_error, when=lambda n, sql: is_write_statement(sql)),
        pytest.raises(MemoryUnavailable) as info,
    ):
        store.remember("s", "k", "b")
    assert info.value.attempts == 3
    assert isinstance(info.value.cause, DatabaseError)
    assert [h.value for h in store.history("s", "k")] == ["a"]


def test_conflicts_are_retried_until_the_deadline_not_attempts_times(settings):
    """Contention (a hot key written from three Galera nodes) is retried for as long as the
    deadline allows: 3 attempts are not the limit, the deadline is -- and then nothing is
    written. A conflict that clears after the 3rd attempt is absorbed."""
    settings.AGENTMEMORY = {
        "RETRY": {"ATTEMPTS": 3, "BASE_DELAY": 0.001, "MAX_DELAY": 0.01, "DEADLINE": 0.5}
    }
    store = MemoryStore(cache=None)
    store.remember("s", "k", "a")
    with (
        inject_errors(conflict_error, when=lambda n, sql: is_write_statement(sql)),
        pytest.raises(MemoryUnavailable) as info,
    ):
        store.remember("s", "k", "b")
    assert info.value.attempts > 3
    assert [h.value for h in store.history("s", "k")] == ["a"]
    failures = []

    def six_conflicts(n: int, sql: str) -> bool:
        if is_write_statement(sql) and len(failures) < 6:
            failures.append(n)
            return True
        return False

    with inject_errors(conflict_error, when=six_conflicts):
        assert store.remember("s", "k", "c").version == 2
    assert len(failures) == 6


def test_non_retryable_error_surfaces_as_itself_and_writes_nothing(store):
    store.remember("s", "k", "a")
    with (
        inject_errors(fatal_error, when=lambda n, sql: is_write_statement(sql)),
        pytest.raises(DatabaseError) as info,
    ):
        store.remember("s", "k", "b")
    assert not isinstance(info.value, MemoryUnavailable)
    assert classify(info.value) is None
    assert store.retries == {}
    assert [h.value for h in store.history("s", "k")] == ["a"]


def test_inside_a_callers_transaction_errors_propagate_for_the_caller_to_retry(store):
    from django.db import transaction

    with (
        pytest.raises(DatabaseError),
        transaction.atomic(),
        inject_errors(conflict_error, when=lambda n, sql: is_write_statement(sql)),
    ):
        store.remember("s", "k", "a")
    assert store.history("s", "k") == []


def test_writes_inside_a_callers_transaction_roll_back_with_it(store):
    from django.db import transaction

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        store.remember("s", "k", "a")
        raise Abort
    assert store.history("s", "k") == []


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (sqlite3.OperationalError("database is locked"), Transient.CONFLICT),
        (sqlite3.OperationalError("database table is locked"), Transient.CONFLICT),
        (sqlite3.OperationalError("no such table: x"), None),
    ],
)
def test_sqlite_errors_are_classified(error, kind):
    assert classify(error) is kind


@pytest.mark.parametrize("deadline", [1.5])
def test_a_write_blocked_by_a_held_lock_gives_up_at_the_deadline_and_writes_nothing(
    settings, deadline
):
    """Another connection holds the key's row lock (SQLite: the database's write lock) for
    longer than the call's deadline: the call raises MemoryUnavailable once the deadline has
    passed -- not after ATTEMPTS x the lock wait (SQLite's busy timeout is 20 s here, MariaDB's
    lock wait 50 s, PostgreSQL's forever) -- and nothing is written."""
    import threading
    import time

    from django.db import connections

    MemoryStore(cache=None).remember("s", "k", "a")
    settings.AGENTMEMORY = {"RETRY": {"DEADLINE": deadline}}
    outcome = {}

    def write():  # a thread of its own: a connection opened under these settings
        started = time.monotonic()
        try:
            MemoryStore(cache=None).remember("s", "k", "b")
            outcome["error"] = None
        except MemoryUnavailable as error:
            outcome["error"] = error
        finally:
            outcome["seconds"] = time.monotonic() - started
            connections.close_all()

    with holding_row_lock("s", "k"):
        writer = threading.Thread(target=write)
        writer.start()
        writer.join(120)
    assert isinstance(outcome["error"], MemoryUnavailable), outcome
    assert "DEADLINE 1.5 s" in str(outcome["error"])
    # Well inside one lock wait of any backend without the deadline (20 s, 50 s, forever).
    assert deadline - 0.6 <= outcome["seconds"] < deadline + 5, outcome
    assert [h.value for h in MemoryStore(cache=None).history("s", "k")] == ["a"]


def lock_wait_of_this_session():
    """This thread's connection's lock wait, in milliseconds, as its session has it."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA busy_timeout")
            return cursor.fetchone()[0]
        if connection.vendor == "mysql":
            cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
            return cursor.fetchone()[0] * 1000
        cursor.execute("SELECT setting FROM pg_settings WHERE name = 'lock_timeout'")
        return int(cursor.fetchone()[0])


def test_a_connection_whose_session_setup_failed_is_never_used(settings):
    """The session setup of a new connection fails before its first setting (as a SET does on a
    Galera node that is still joining): the call fails, and the next call runs on a new
    connection with every setting -- never on the half set-up one."""
    import threading

    from django.db import connections

    from agentmemory.defects import InjectedFailure, fail_session_setup

    settings.AGENTMEMORY = {"RETRY": {"DEADLINE": 2.0}}
    seen = {}

    def calls():
        try:
            with fail_session_setup(), pytest.raises(InjectedFailure):
                MemoryStore(cache=None).remember("s", "k", 1)
            MemoryStore(cache=None).remember("s", "k", 2)
            seen["lock wait"] = lock_wait_of_this_session()
        finally:
            connections.close_all()

    thread = threading.Thread(target=calls)
    thread.start()
    thread.join(60)
    assert seen == {"lock wait": 2000}


@pytest.mark.django_db(transaction=True)
def test_a_retrys_lock_wait_is_only_ever_lowered_and_is_restored_after_it():
    """A retry with 20 s left on a session whose own lock wait is 1 s keeps the 1 s (never
    raised), one with 0.5 s left lowers it to 0.5 s, and the session's wait is as before after."""
    from agentmemory.vendors import lock_wait_at_most, set_lock_wait

    connection.ensure_connection()
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 1000")
    else:
        set_lock_wait(connection, 1)
    with lock_wait_at_most(connection, 20):
        assert lock_wait_of_this_session() == 1000
    if connection.vendor != "mysql":  # MySQL's wait is in whole seconds: 1 s is its least
        with lock_wait_at_most(connection, 0.5):
            assert lock_wait_of_this_session() == 500
    assert lock_wait_of_this_session() == 1000
