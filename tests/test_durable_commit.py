"""A COMMIT is acknowledged only once it is durable (contract semantics 2, 7 and 11): where the
server's ``synchronous_commit`` would acknowledge it earlier (``off``: before the WAL is flushed,
so a crash of the server loses it; ``local``: before a synchronous standby has it), the store's
own transactions raise it to ``on``, and system check W005 says what stays exposed. The cancelled
wait for a synchronous standby, and the warnings about asynchronous standbys, are tested on the
PostgreSQL HA cluster (tests/test_pg_ha.py)."""

from __future__ import annotations

import pytest
from django.db import connection, connections

from agentmemory.checks import check_durable_commits

from .helpers import statements_sent

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def sessions_commit_asynchronously():
    """``ALTER DATABASE ... SET synchronous_commit = off``, as a "speed" setting is made: every
    new session of the test database starts with it."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    connections.close_all()
    yield
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')
    connections.close_all()


def session_setting() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


def test_the_store_commits_durably_where_the_session_would_not(
    sessions_commit_asynchronously, store
):
    seen = []
    store.update("s", "k", lambda old: seen.append(session_setting()) or 1)
    assert seen == ["on"]  # inside the store's transaction
    assert session_setting() == "off"  # the rest of the session keeps the user's setting
    with statements_sent() as sent:
        store.remember("s", "k", 2)
        store.remember_many("s", {"a": 1, "b": 2})
        store.forget("s", "a")
    assert sum("SET LOCAL synchronous_commit = on" in sql for sql in sent) == 3


def test_a_server_that_acknowledges_commits_before_they_are_durable_gets_w005(
    sessions_commit_asynchronously,
):
    (warning,) = [
        m for m in check_durable_commits(databases=["default"]) if m.id == "agentmemory.W005"
    ]
    assert "synchronous_commit=off" in warning.msg and "SET LOCAL" in warning.msg


def test_a_durable_session_sends_nothing_more(store):
    store.remember("s", "k", 1)  # the connection is open, its session set up
    with statements_sent() as sent:
        store.update("s", "k", lambda old: old + 1)
    assert not any("synchronous_commit" in sql for sql in sent)
    assert [m.id for m in check_durable_commits(databases=["default"])] in (
        [],
        ["agentmemory.W007"],  # the HA cluster's asynchronous standby (tests/test_pg_ha.py)
    )
