"""The hot statements' runner (``agentmemory.sql.run``): straight on the driver's cursor when
nothing in Django watches statements, through Django's cursor when something does -- and the same
errors, checks and results either way."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentmemory import MemoryStore
from agentmemory.models import Memory
from agentmemory.sql import build_statements, run, statements_for, updates_return_rows

from .helpers import statements_sent

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_execute_wrapper_sees_every_statement_of_the_hot_paths():
    store = MemoryStore(cache=None)
    with statements_sent() as seen:
        store.remember("s", "k", {"n": 1})  # a new key: the locked path (one statement on PG)
        store.remember("s", "k", {"n": 2})  # an overwrite: the one-statement path, if any
        store.forget("s", "k")
        assert store.recall("s", "k") is None
    assert any("agentmemory_memoryversion" in sql.lower() for sql in seen)
    reads = statements_for(connection).read_keys(1)
    assert reads in seen, "the recall's statement went around the wrapper"


def test_query_logging_records_the_hot_statements():
    store = MemoryStore(cache=None)
    store.remember("s", "k", 1)
    with CaptureQueriesContext(connection) as captured:
        assert store.recall("s", "k").value == 1
        store.remember("s", "k", 2)
    logged = [query["sql"].lower() for query in captured.captured_queries]
    assert any("from agentmemory_memory" in sql for sql in logged)
    # The write: its statements, or on PostgreSQL the call of its function (migration 0008).
    assert any("agentmemory_memoryversion" in sql or "agentmemory_upsert(" in sql for sql in logged)


def test_the_direct_path_raises_djangos_exceptions():
    """With nothing watching, a driver error still reaches callers as Django's class (the retry
    policy and callers' ``except DatabaseError`` depend on it)."""
    assert not connection.execute_wrappers and not connection.queries_logged
    with pytest.raises(DatabaseError) as raised:
        run(connection, "SELECT no_such_column FROM agentmemory_memory", [])
    assert type(raised.value).__module__ == "django.db.utils"


def test_the_direct_path_refuses_a_broken_transaction():
    """After an error inside ``atomic`` (no savepoint), Django refuses every further statement
    of the block: so does the direct path, instead of running on a transaction the server has
    aborted (PostgreSQL) or that will be rolled back anyway."""
    store = MemoryStore(cache=None)
    store.remember("s", "k", 1)
    row = Memory.objects.get(session_id="s", key="k")
    with transaction.atomic():
        with pytest.raises(IntegrityError), transaction.atomic(savepoint=False):
            Memory.objects.create(
                session_id="s",
                key="k",
                version=1,
                state="live",
                created_at=row.created_at,
                updated_at=row.updated_at,
            )
        with pytest.raises(TransactionManagementError):
            store.recall("s", "k")


def test_both_paths_return_the_same_rows():
    store = MemoryStore(cache=None)
    store.remember_many("s", {"a": {"x": [1, "two", None]}, "b": "text"})
    sql = statements_for(connection).read_keys(2)
    direct = run(connection, sql, ["s", "a", "b"])
    with CaptureQueriesContext(connection):
        logged = run(connection, sql, ["s", "a", "b"])
    assert sorted(direct) == sorted(logged) and len(direct) == 2


@pytest.mark.postgres
def test_the_hot_statements_are_prepared_as_the_connection_is_configured():
    """Prepared statements are the connection's choice (Django's OPTIONS), never the store's:
    with ``server_side_binding`` and ``prepare_threshold`` a recall's statement is prepared on
    the server once it has run that many times; with Django's default (client-side binding,
    which keeps poolers in transaction mode working) it never is."""
    store = MemoryStore(cache=None)
    store.remember("s", "k", 1)
    for _ in range(10):
        store.recall("s", "k")
    reads = statements_for(connection).read_keys(1).split(" WHERE ")[0]
    prepared = [
        sql
        for (sql,) in run(connection, "SELECT statement FROM pg_prepared_statements", [])
        if reads in sql
    ]
    options = connection.settings_dict["OPTIONS"]
    configured = options.get("server_side_binding") is True and options.get("prepare_threshold")
    assert bool(prepared) == bool(configured), (options, prepared)


@pytest.mark.postgres
def test_a_new_keys_first_write_is_one_statement_on_postgresql():
    """Without an expected version, PostgreSQL's one-statement write is an upsert: a key with no
    row gets version 1 and its history in the same statement (no placeholder row, no lock
    round trip), and the next write of it is one statement too."""
    store = MemoryStore(cache=None)
    with statements_sent() as sent:
        first = store.remember("s", "new", {"n": 1}, ttl=60)
        second = store.remember("s", "new", {"n": 2})
    assert len(sent) == 2, sent
    assert (first.version, second.version) == (1, 2)
    assert first.created_at == second.created_at == first.updated_at
    assert second.expires_at is None
    assert [(v.version, v.value) for v in store.history("s", "new")] == [
        (1, {"n": 1}),
        (2, {"n": 2}),
    ]
    assert store.recall("s", "new").value == {"n": 2}


def test_sqlite_before_3_35_writes_on_the_locked_path():
    """Django 5.2 supports SQLite from 3.31; ``UPDATE ... RETURNING`` came in 3.35. Before it,
    the one-statement write is not built at all (every write takes the locked path) instead
    of failing with a syntax error on the first overwrite."""
    assert not updates_return_rows("sqlite", (3, 34, 1))
    assert updates_return_rows("sqlite", (3, 35, 0))
    assert updates_return_rows("postgresql") and not updates_return_rows("mysql")
    old = build_statements(
        "%s", '"key"', False, "sqlite", updates_return_rows("sqlite", (3, 31, 1))
    )
    assert old.blind_write is None and old.upsert_write is None
    new = build_statements(
        "%s", '"key"', False, "sqlite", updates_return_rows("sqlite", (3, 45, 0))
    )
    assert new.blind_write is not None and "RETURNING" in new.blind_write


@pytest.mark.postgres
def test_the_locked_path_appends_in_one_statement_on_postgresql():
    """Under the row lock, PostgreSQL updates the live row and appends the version in one
    statement: ``update(fn)`` and ``forget`` are the lock and one write, so writers waiting for
    the key wait one round trip less."""
    store = MemoryStore(cache=None)
    store.remember("s", "k", {"n": 1})
    with statements_sent() as sent:
        updated = store.update("s", "k", lambda v: {"n": v["n"] + 1})
        assert store.forget("s", "k")
    assert [sql.split()[0].upper() for sql in sent] == ["SELECT", "WITH", "SELECT", "WITH"], sent
    assert updated.version == 2
    history = [(v.version, v.op, v.value) for v in store.history("s", "k")]
    assert history == [(1, "write", {"n": 1}), (2, "write", {"n": 2}), (3, "forget", None)]
    row = Memory.objects.get(session_id="s", key="k")
    assert (row.version, row.state, row.value) == (3, "forgotten", None)


def test_a_new_value_on_postgresql_is_one_call_of_the_write_function(vendor):
    """PostgreSQL: ``remember`` of a value (no expected version, no cache tier, no transaction of
    the caller's) is one short statement, the call of ``agentmemory_upsert`` (migration 0008),
    whose own statement the server plans once per connection; a key whose TTL passed makes its
    expiry a version first (the function returns nothing there, the locked path takes over).
    Other databases have no such function and never call it."""
    store = MemoryStore(cache=None)
    with statements_sent() as seen:
        store.remember("s", "k", {"n": 1})
        store.remember("s", "k", {"n": 2})
    calls = [sql for sql in seen if "agentmemory_upsert(" in sql]
    if vendor == "postgresql":
        assert calls == [statements_for(connection).upsert_write] * 2 and len(seen) == 2, seen
    else:
        assert calls == [] and statements_for(connection).upsert_write is None
    assert [(v.version, v.value) for v in store.history("s", "k")] == [(1, {"n": 1}), (2, {"n": 2})]

    store.remember("s", "short", {"n": 1}, ttl=60)
    Memory.objects.filter(key="short").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert store.recall("s", "short") is None
    again = store.remember("s", "short", {"n": 2})
    assert again.version == 3 and again.value == {"n": 2}
    assert [v.op for v in store.history("s", "short")] == ["write", "expire", "write"]


def test_the_write_function_migration_goes_back_and_forth(vendor):
    """``migrate agentmemory 0007`` drops the function (PostgreSQL) and ``migrate`` creates it
    again, even over one of another parameter naming (CREATE OR REPLACE cannot rename one)."""
    from django.core.management import call_command

    def functions() -> int:
        if vendor != "postgresql":
            return 0
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'agentmemory_upsert'")
            return cursor.fetchone()[0]

    call_command("migrate", "agentmemory", "0007", verbosity=0)
    try:
        assert functions() == 0
    finally:
        call_command("migrate", "agentmemory", verbosity=0)
    assert functions() == (1 if vendor == "postgresql" else 0)
    store = MemoryStore(cache=None)
    assert store.remember("s", "after", 1).version == 1


def test_a_create_of_a_key_without_a_row_inserts_it_at_once(vendor):
    """``remember(expected_version=0)`` -- "only if there is no such memory" -- of a key that
    has no row: the row is inserted at version 1 with its history version (PostgreSQL: one
    statement, in autocommit or in the call's transaction; SQLite: the insert and the history
    insert), with or without an idempotency key
    (a new row holds no earlier request to look up). A key that has a row takes the locked path:
    a live one conflicts, a forgotten one comes back, a replay is found by its key. The MySQL
    family has no ``RETURNING`` and takes the locked path for both."""
    from agentmemory import VersionConflict

    store = MemoryStore(cache=None)
    with statements_sent() as plain:
        assert store.remember("s", "k", {"n": 1}, expected_version=0, ttl=60).version == 1
    with statements_sent() as keyed:
        first = store.remember("s", "r", 1, expected_version=0, idempotency_key="req")
    again = store.remember("s", "r", 1, expected_version=0, idempotency_key="req")
    assert (first.version, first.replayed, again.version, again.replayed) == (1, False, 1, True)
    with pytest.raises(VersionConflict) as conflict:
        store.remember("s", "k", {"n": 2}, expected_version=0)
    assert conflict.value.actual == 1
    store.forget("s", "k")
    assert store.remember("s", "k", {"n": 3}, expected_version=0).version == 3
    assert [(v.version, v.op) for v in store.history("s", "k")] == [
        (1, "write"),
        (2, "forget"),
        (3, "write"),
    ]
    assert [(v.version, v.value) for v in store.history("s", "r")] == [(1, 1)]
    row = Memory.objects.get(session_id="s", key="r")
    assert (row.version, row.state, row.history_from) == (1, "live", 1)
    inserts = [sql for sql in plain + keyed if "ON CONFLICT DO NOTHING RETURNING" in sql]
    if vendor == "postgresql":
        assert len(plain) == len(keyed) == 1 and len(inserts) == 2, (plain, keyed)
    elif vendor == "sqlite":  # BEGIN IMMEDIATE, then the two inserts
        assert len(plain) == len(keyed) == 3 and len(inserts) == 2, (plain, keyed)
    else:
        assert not inserts
