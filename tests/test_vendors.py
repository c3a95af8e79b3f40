"""``agentmemory.vendors``: what differs between servers, in one place -- which errors are worth a
retry, and how a prefix is selected exactly."""

import pytest

from agentmemory.vendors import Transient, classify, prefix_successor


def test_tidb_error_codes_are_classified_as_retryable():
    import MySQLdb

    for code in (9007, 8002, 8022, 8028, 1213, 1205):
        assert classify(MySQLdb.OperationalError(code, "x")) is Transient.CONFLICT
    for code in (2006, 2013, 1927):
        assert classify(MySQLdb.OperationalError(code, "x")) is Transient.DISCONNECT
    assert classify(MySQLdb.IntegrityError(1062, "Duplicate entry")) is None
    assert classify(MySQLdb.OperationalError(1146, "Table doesn't exist")) is None


def test_postgres_states_are_classified():
    import psycopg

    assert classify(psycopg.errors.SerializationFailure()) is Transient.CONFLICT
    assert classify(psycopg.errors.DeadlockDetected()) is Transient.CONFLICT
    assert classify(psycopg.errors.AdminShutdown()) is Transient.DISCONNECT
    assert classify(psycopg.errors.UniqueViolation()) is None


@pytest.mark.parametrize(
    ("prefix", "successor"),
    [
        ("acme", "acmf"),
        ("a\U0010ffff", "b"),
        ("\U0010ffff", None),
        ("a\ud7ff", "a\ue000"),  # surrogates are skipped
        ("z", "{"),
    ],
)
def test_a_prefix_range_ends_at_the_smallest_string_after_every_extension(prefix, successor):
    assert prefix_successor(prefix) == successor
