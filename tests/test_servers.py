"""Retries against what a server does: its own transient error codes (TiDB's among them, injected
as the driver's exceptions) on every statement of a write, connections killed server-side
mid-transaction, a lost COMMIT acknowledgement; and the history's uniqueness backstop."""

from __future__ import annotations

import itertools
import sqlite3
import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction

from agentmemory import MemoryStore
from agentmemory.models import Memory, MemoryVersion
from agentmemory.vendors import kill_connection, server_connection_id

from .conftest import redis_alias
from .helpers import hit, holding_row_lock, inject_errors, inserts_a_version, statements_sent

pytestmark = pytest.mark.django_db(transaction=True)


def transient_errors() -> list[tuple[str, object]]:
    """(label, factory) of every retryable error this backend's driver raises."""
    if connection.vendor == "sqlite":
        return [
            ("SQLITE_BUSY", lambda: sqlite3.OperationalError("database is locked")),
            ("SQLITE_LOCKED", lambda: sqlite3.OperationalError("database table is locked")),
        ]
    if connection.vendor == "mysql":
        import MySQLdb

        codes = {
            1213: "Deadlock found when trying to get lock; try restarting transaction",
            1205: "Lock wait timeout exceeded; try restarting transaction",
            9007: "Write conflict, txnStartTS=1, conflictStartTS=2, conflictCommitTS=3 [try again later]",
            8002: "[tikv:8002]SELECT FOR UPDATE write conflict",
            8022: "Error: KV error safe to retry ... [try again later]",
            8028: "Information schema is changed during the execution of the statement",
        }
        return [
            (str(code), lambda code=code, msg=msg: MySQLdb.OperationalError(code, msg))
            for code, msg in codes.items()
        ]
    import psycopg

    return [
        ("40001", lambda: psycopg.errors.SerializationFailure("could not serialize access")),
        ("40P01", lambda: psycopg.errors.DeadlockDetected("deadlock detected")),
        ("55P03", lambda: psycopg.errors.LockNotAvailable("could not obtain lock")),
        ("57014", lambda: psycopg.errors.QueryCanceled("canceling statement due to user request")),
    ]


def statements_of_an_overwrite(store) -> int:
    """How many statements a remember over an existing memory sends here: 1 on PostgreSQL (one
    CTE), 2 on SQLite (UPDATE ... RETURNING, INSERT), 3 on the MySQL family (SELECT ... FOR
    UPDATE, UPDATE, INSERT)."""
    store.remember("count", "k", 1)
    with statements_sent() as sent:
        store.remember("count", "k", 2)
    return sum(
        sql.lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE", "WITH")) for sql in sent
    )


def test_each_transient_error_is_retried_on_every_statement_of_a_write(store, vendor):
    """For each retryable code, fail each statement of a remember over an existing memory in turn
    (the one-statement write on PostgreSQL; UPDATE and INSERT on SQLite; SELECT ... FOR UPDATE,
    UPDATE and INSERT on the MySQL family): the store retries the whole transaction, and the
    history stays gap-free."""
    count = statements_of_an_overwrite(store)
    assert count == {"postgresql": 1, "sqlite": 2}.get(vendor, 3)
    for statement, (label, make_error) in itertools.product(
        range(1, count + 1), transient_errors()
    ):
        key = f"k-{label}-{statement}"
        store.remember("s", key, "before")
        seen = iter(range(1, 100))

        def on_statement(n, sql, statement=statement, seen=seen):
            return (
                sql.lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE", "WITH"))
                and next(seen) == statement
            )

        with inject_errors(make_error, when=on_statement) as hit:
            record = store.remember("s", key, "after")
        assert hit, label
        assert (record.version, record.value) == (2, "after"), label
        assert [(h.version, h.value) for h in store.history("s", key)] == [
            (1, "before"),
            (2, "after"),
        ], label


def kill_current_connection() -> None:
    """Kill this thread's database connection server-side, from another thread's connection."""
    target = server_connection_id(connection)

    def kill() -> None:
        try:
            assert kill_connection(connections["default"], target)
        finally:
            connections.close_all()

    killer = threading.Thread(target=kill)
    killer.start()
    killer.join()


@pytest.mark.server
def test_killing_a_connection_that_is_gone_says_so():
    """memcheck's kill fault: a connection that has closed already is False (try another); an
    error of the killer's own connection is raised (its caller opens a new one) instead of being
    taken for "gone"."""
    assert kill_connection(connections["default"], 2**31 - 7) is False


@pytest.mark.server
def test_a_dead_persistent_connection_is_replaced_at_a_requests_first_statement(settings):
    """``CONN_HEALTH_CHECKS`` (on in this project): a persistent connection that died between two
    requests is checked and replaced at the new request's first statement -- the store's own
    statements included, though they skip Django's cursor wrapper. The store's reconnecting
    retry is off here, so only the health check can save the call."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "RETRY": {"RECONNECT": False}}
    store = MemoryStore(cache=None)
    store.remember("s", "k", 1)
    assert connection.health_check_enabled
    kill_current_connection()
    connection.health_check_done = False  # what a new request does (request_started)
    assert store.recall("s", "k").value == 1


@pytest.mark.server
def test_connection_killed_server_side_mid_transaction_is_retried_exactly_once(store):
    store.remember("s", "k", "before")
    killed = []
    from django.db import connection as conn

    def kill_before_history_insert(execute, sql, params, many, context):
        # A plain INSERT, or (PostgreSQL's one-statement write) the CTE that inserts the version.
        if not killed and inserts_a_version(sql):
            killed.append(sql)
            kill_current_connection()
        return execute(sql, params, many, context)

    with conn.execute_wrapper(kill_before_history_insert):
        record = store.remember("s", "k", "after")
    assert killed and store.retries["disconnect"] >= 1
    assert [(h.version, h.value) for h in store.history("s", "k")] == [(1, "before"), (2, "after")]
    assert record.version == 2


def remember_losing_the_first_commit_answer(store, monkeypatch, key, value):
    """``store.remember`` whose first COMMIT reaches the database but whose answer is lost (the
    connection drops right after): the store must retry without writing twice. In autocommit
    (PostgreSQL's one-statement write without Redis) the statement is its own COMMIT: its answer
    is the one lost."""
    real_commit = connection.commit
    lost = []

    def lose_the_answer():
        if not lost:
            lost.append(True)
            with connection.wrap_database_errors:
                raise lost_connection_error()

    def commit_then_lose_the_answer():
        real_commit()
        lose_the_answer()

    def autocommit_statement_then_lose_the_answer(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if connection.get_autocommit() and inserts_a_version(sql):
            lose_the_answer()
        return result

    monkeypatch.setattr(connection, "commit", commit_then_lose_the_answer)
    try:
        with connection.execute_wrapper(autocommit_statement_then_lose_the_answer):
            return store.remember("s", key, value)
    finally:
        monkeypatch.undo()
        assert lost


def test_lost_commit_acknowledgement_is_not_written_twice(store, monkeypatch):
    """The COMMIT reached the database but its answer was lost: the store retries, finds its own
    request id in the history, and returns that version instead of writing another."""
    store.remember("s", "k", "before")
    record = remember_losing_the_first_commit_answer(store, monkeypatch, "k", "after")
    assert record.version == 2
    assert [(h.version, h.value) for h in store.history("s", "k")] == [(1, "before"), (2, "after")]


def test_a_lost_commit_acknowledgement_leaves_no_stale_cache_entry(monkeypatch):
    """The first attempt committed v2, but its after-commit cache update died with the lost
    acknowledgement: the retry must not leave Redis serving v1 (found by memcheck's db-kill on a
    Galera cluster)."""
    cached = MemoryStore(cache=redis_alias())
    cached.remember("s", "k", "before")
    assert hit(cached).version == 1
    record = remember_losing_the_first_commit_answer(cached, monkeypatch, "k", "after")
    assert record.version == 2
    assert (cached.recall("s", "k").version, cached.recall("s", "k").value) == (2, "after")


def lost_connection_error() -> BaseException:
    if connection.vendor == "sqlite":
        return sqlite3.OperationalError("database is locked")  # SQLite's only transient error
    if connection.vendor == "mysql":
        import MySQLdb

        return MySQLdb.OperationalError(2013, "Lost connection to server during query")
    import psycopg

    return psycopg.OperationalError("server closed the connection unexpectedly")


def test_the_history_rejects_a_second_copy_of_a_version_even_without_the_row_lock(store):
    """The backstop of semantic 2: whatever a writer skipped, the database refuses to commit two
    history rows for one version of one memory."""
    store.remember("s", "k", 1)
    memory = Memory.objects.get(session_id="s", key="k")
    first = MemoryVersion.objects.get(memory=memory, version=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        MemoryVersion.objects.create(
            memory=memory,
            version=1,
            op="write",
            value=2,
            created_at=first.created_at,
            request_id="another-writer",
        )
    assert [(h.version, h.value) for h in store.history("s", "k")] == [(1, 1)]


@pytest.mark.postgres
def test_a_write_whose_lock_wait_is_cancelled_is_retried_once_the_lock_goes(store):
    """PostgreSQL reports a ``lock_timeout`` that fired as the lock was granted as a cancel
    ("canceling statement due to user request", 57014: the statement's next lock wait resets the
    timeout's flag) -- a CI run of memcheck's db-lock fault met it on a tuple lock. Any
    cancelled statement rolls its transaction back, so the store retries it: here a write
    waiting behind a held row lock has its statement cancelled (``pg_cancel_backend``), then
    the lock goes -- the write lands once, as version 2, instead of raising the driver's
    error."""
    import time

    store.remember("s", "k", "a")
    outcome: dict[str, object] = {}

    def write() -> None:
        try:
            outcome["record"] = MemoryStore(cache=None).remember("s", "k", "b")
        except Exception as error:  # the assertion below shows it
            outcome["error"] = error
        finally:
            connections.close_all()

    writer = threading.Thread(target=write)
    with holding_row_lock("s", "k"):
        writer.start()
        deadline = time.monotonic() + 30
        waiting: list[tuple[int]] = []
        while not waiting and time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )
                waiting = cursor.fetchall()
        assert len(waiting) == 1, "the write never waited for the row lock"
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_cancel_backend(%s)", [waiting[0][0]])
            assert cursor.fetchone()[0] is True
    writer.join(60)
    assert "error" not in outcome, outcome
    assert outcome["record"].version == 2
    assert [(h.version, h.value) for h in store.history("s", "k")] == [(1, "a"), (2, "b")]
