"""A dump of the store's memory tables and its restore into the live database, in plain SQL --
nothing of the store runs, as with ``pg_dump``/``mysqldump`` and their restore, or a file copied
back: the tables' rows as they were, every row written since gone, the database's identity and
(on PostgreSQL) its timeline unchanged. What memcheck's and the suite's restores use to take a
database back in time behind the Redis tier (docs/redis.md, "When the database goes back").

Covered: the live rows, their history, the pending invalidations and the cache incarnation --
every table the tier's entries are read from or checked against. Logs and checkpoints, which the
tier does not serve, are left as they are."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from ..models import CacheIncarnation, Memory, MemoryVersion, PendingInvalidation

#: Parents before children (the restore inserts in this order and deletes in the reverse one).
TABLES = (Memory, MemoryVersion, PendingInvalidation, CacheIncarnation)


@dataclass
class Dump:
    """The rows of :data:`TABLES` at one instant: table -> (columns, rows). ``sessions``: only
    these sessions' memories, their history and pending records (and the incarnation row, which
    every database has one of) -- memcheck's restore takes back its own sessions only."""

    using: str
    sessions: tuple[str, ...] | None = None
    tables: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(len(rows) for _, rows in self.tables.values())


def dump(using: str = "default", sessions: Iterable[str] | None = None) -> Dump:
    """Every row of the memory tables (``sessions``: of those sessions only), read in one
    transaction (one snapshot of them all)."""
    connection = connections[using]
    taken = Dump(using, None if sessions is None else tuple(sorted(sessions)))
    # One snapshot of every table, as a dump takes (pg_dump, mysqldump --single-transaction):
    # under READ COMMITTED a write committed between two SELECTs would leave a history out of
    # step with its live row.
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:  # for the next transaction
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for model in TABLES:
            columns = _columns(model)
            selected = ", ".join(_read(connection, model, c) for c in columns)
            table = connection.ops.quote_name(model._meta.db_table)
            where, params = _where(connection, model, taken.sessions)
            cursor.execute(f"SELECT {selected} FROM {table}{where}", params)
            taken.tables[model._meta.db_table] = (columns, list(cursor.fetchall()))
    return taken


def _where(connection: Any, model: Any, sessions: tuple[str, ...] | None) -> tuple[str, list[Any]]:
    """The rows of ``model`` a dump of ``sessions`` holds (all of them for None, and always the
    incarnation row)."""
    if sessions is None or model is CacheIncarnation:
        return "", []
    quote = connection.ops.quote_name
    marks = ", ".join(["%s"] * len(sessions))
    if model is MemoryVersion:
        memories = quote(Memory._meta.db_table)
        column = quote(MemoryVersion._meta.get_field("memory").column)
        return (
            f" WHERE {column} IN (SELECT {quote('id')} FROM {memories} "
            f"WHERE {quote('session_id')} IN ({marks}))",
            list(sessions),
        )
    return f" WHERE {quote('session_id')} IN ({marks})", list(sessions)


def restore(taken: Dump) -> None:
    """Put ``taken`` back into the live database: each table's rows deleted and the dump's
    inserted, in one transaction, by plain SQL."""
    connection = connections[taken.using]
    quote = connection.ops.quote_name
    with transaction.atomic(using=taken.using), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # As pg_restore --clean's DROP does: writers in flight finish first, the next ones
            # wait and then see the restored rows. (Rows deleted and inserted again under a
            # writer waiting on the old row's lock made PostgreSQL give that writer neither.)
            tables = ", ".join(quote(m._meta.db_table) for m in TABLES)
            cursor.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
        for model in reversed(TABLES):
            where, params = _where(connection, model, taken.sessions)
            cursor.execute(f"DELETE FROM {quote(model._meta.db_table)}{where}", params)
        for model in TABLES:
            columns, rows = taken.tables[model._meta.db_table]
            if not rows:
                continue
            names = ", ".join(quote(c) for c in columns)
            marks = ", ".join(_written(connection, model, c) for c in columns)
            cursor.executemany(
                f"INSERT INTO {quote(model._meta.db_table)} ({names}) VALUES ({marks})", rows
            )


def _columns(model: Any) -> list[str]:
    return [f.column for f in model._meta.concrete_fields]


def _json(model: Any, column: str) -> bool:
    return any(
        f.column == column and f.get_internal_type() == "JSONField"
        for f in model._meta.concrete_fields
    )


def _read(connection: Any, model: Any, column: str) -> str:
    """A column as the dump reads it: JSON as its text on PostgreSQL (psycopg decodes ``jsonb``
    into Python values, which it would not write back as the same JSON)."""
    name = connection.ops.quote_name(column)
    if connection.vendor == "postgresql" and _json(model, column):
        return f"{name}::text"
    return name


def _written(connection: Any, model: Any, column: str) -> str:
    if connection.vendor == "postgresql" and _json(model, column):
        return "%s::jsonb"
    return "%s"
