"""The store's hot statements, written once per database vendor and run through Django's cursor.

The write path and recall run the same four statements millions of times; building them with the
ORM costs more CPU than the database spends running them (profiled: about two thirds of a
``remember`` on MariaDB was query compilation). They are written here instead, from the models'
metadata, and run by :func:`run` on Django's connection: its transactions, ``on_commit``, execute
wrappers, query logging and error translation all apply.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.utils.dateparse import parse_datetime

from .models import Memory, MemoryVersion, is_live
from .records import MemoryRecord, ScoredMemory
from .vendors import json_placeholder

_UNSET: Any = object()


@dataclass
class LockedRow:
    """A live row as the write path holds it under its lock. The stored JSON is decoded only
    if something asks for ``value`` (``update(fn)``, a revert), not on every write."""

    id: int
    session_id: str
    key: str
    version: int
    state: str
    raw_value: Any
    created_at: datetime
    expires_at: datetime | None
    _value: Any = _UNSET

    @property
    def value(self) -> Any:
        if self._value is _UNSET:
            self._value = decode_json(self.raw_value)
        return self._value

    @value.setter
    def value(self, value: Any) -> None:
        self._value = value


def decode_json(raw: Any) -> Any:
    return json.loads(raw) if isinstance(raw, str | bytes) else raw


#: The columns a record is read from, in this order, wherever one is read as the driver returns
#: it (``read_keys``, ``recall_many``, a search's results): :func:`record_from_row` decodes them.
RECORD_COLUMNS = ("key", "state", "value", "version", "created_at", "updated_at", "expires_at")


def record_from_row(
    session_id: str, row: Sequence[Any], *, now: datetime | None = None, score: float | None = None
) -> MemoryRecord | None:
    """The record of a driver row of :data:`RECORD_COLUMNS`; with ``now``, None unless the row
    :func:`~agentmemory.models.is_live` then; with ``score``, a :class:`ScoredMemory`."""
    key, state, raw, version, created, updated, expires = row
    expires_at = to_datetime(expires)
    if now is not None and not is_live(state, expires_at, now):
        return None
    fields = (
        session_id,
        key,
        decode_json(raw),
        version,
        to_datetime(created),
        to_datetime(updated),
        expires_at,
    )
    if score is None:
        return MemoryRecord(*fields)  # type: ignore[arg-type]
    return ScoredMemory(*fields, score)  # type: ignore[arg-type]


def locked_row(row: Sequence[Any]) -> LockedRow:
    """The :class:`LockedRow` of a driver row of the ``lock``/``read_row`` statements."""
    row_id, session_id, key, version, state, raw, created, expires = row
    created_at = to_datetime(created)
    assert created_at is not None
    return LockedRow(row_id, session_id, key, version, state, raw, created_at, to_datetime(expires))


def to_datetime(raw: Any) -> datetime | None:
    """A datetime column as the driver returns it (SQLite: text; MySQL: naive UTC) -> aware."""
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            value = datetime.fromisoformat(raw)
        except ValueError:
            value = parse_datetime(raw)
    else:
        value = raw
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Statements:
    quote_key: str
    lock: str
    # The same row without a lock (the unsafe seam's read).
    read_row: str
    # A row's version and history watermark by id, locked (history retention).
    lock_by_id: str
    update_row: str
    insert_version: str
    # A blind write in one statement where the database can return what it updated (PostgreSQL:
    # the update and the history insert in one CTE; SQLite: UPDATE ... RETURNING, then the
    # insert_version statement); None elsewhere. See WritePath._blind_write.
    blind_write: str | None = None
    # PostgreSQL: the same for a write without expected_version, as an upsert -- a key that has
    # no row yet gets its first version in the same one statement: a call of the database's
    # agentmemory_upsert function (migration 0008). None elsewhere.
    upsert_write: str | None = None
    # PostgreSQL: update_row and insert_version in one statement (the locked path under its row
    # lock: one round trip fewer while other writers of the key wait). None elsewhere.
    append: str | None = None
    # Whether blind_write/upsert_write/create_write insert the history version themselves
    # (PostgreSQL).
    history_in_statement: bool = False
    # A write with expected_version=0 ("only if there is no such memory") of a key that has no
    # row: the row inserted at version 1, or nothing when a row exists (then the locked path
    # decides: a conflict, a forgotten key coming back, a replay). Where blind_write exists;
    # PostgreSQL inserts the history version in the same statement. Parameters: session_id,
    # key, value, created_at, updated_at, expires_at, embedding, embedding_key (PostgreSQL: then
    # value, created_at, expires_at, request_id, embedding).
    create_write: str | None = None
    # The version an earlier call or attempt committed under a request id, if any (parameters:
    # the row's id, the request id; columns: op, value, version, created_at, expires_at).
    find_request: str = ""

    def read_keys(self, count: int) -> str:
        """The rows of ``count`` keys of one session, whatever their state (parameters: the
        session id, then the keys; columns: :data:`RECORD_COLUMNS`)."""
        return _read_keys(self.quote_key, count)

    def blind(
        self,
        session_id: str,
        key: str,
        text: str | None,
        at: Any,
        until: Any,
        vector: bytes | None,
        name: int | None,
        expected: int | None,
        request_id: str,
    ) -> tuple[str, list[Any], bool]:
        """The one-statement write (``blind_write``, or ``upsert_write`` when there is no
        expected version and the vendor has it) with its parameters, and whether the history
        version must still be inserted after it (``insert_version``): SQLite's ``RETURNING``
        cannot feed an insert, PostgreSQL's CTE does it in the same statement."""
        assert self.blind_write is not None
        if expected is None and self.upsert_write is not None:
            # PostgreSQL's agentmemory_upsert (migration 0008), the history version included.
            return (
                self.upsert_write,
                [session_id, key, text, at, until, vector, name, request_id],
                False,
            )
        sql = self.blind_write
        params = [text, at, at, until, vector, name, session_id, key, at, expected, expected]
        if self.history_in_statement:
            params += [text, at, until, request_id, vector]
        return sql, params, not self.history_in_statement

    def appended(
        self,
        row: LockedRow,
        op: str,
        text: str | None,
        at: Any,
        until: Any,
        created: Any,
        request_id: str,
        vector: bytes | None,
        name: int | None,
    ) -> list[tuple[str, list[Any]]]:
        """The statements (one on PostgreSQL, two elsewhere) that make the live row match its
        new version ``row.version`` and append that version to the history."""
        update = [row.version, text, row.state, created, at, until, vector, name]
        insert = [row.id, row.version, op, text, at, until, request_id, vector]
        if self.append is not None:
            return [(self.append, [*update, row.id, *insert])]
        return [(self.update_row, [*update, row.id]), (self.insert_version, insert)]


def build_statements(
    json_param: str, quote_key: str, select_for_update: bool, vendor: str, update_returning: bool
) -> Statements:
    """The statements of one backend (``statements_for`` builds them once per backend class)."""
    memory, version = Memory._meta.db_table, MemoryVersion._meta.db_table

    # What a blind write changes on a row it may take over, and the row it may not (a live row
    # whose TTL has passed: that expiry must become a version first). ``row``: how the statement
    # names the existing row ("" or "m."); ``new_life``: the created_at of a row coming back.
    def takes_over(row: str, new_life: str) -> str:
        return (
            f"created_at = CASE WHEN {row}state = 'live' THEN {row}created_at ELSE {new_life} END"
        )

    def not_due(row: str) -> str:
        return (
            f"NOT ({row}state = 'live' AND {row}expires_at IS NOT NULL AND {row}expires_at <= %s)"
        )

    # The row's next version, in one UPDATE: it takes the row lock itself and, under READ
    # COMMITTED, re-reads a row another writer changed meanwhile, so version + 1 is always the
    # newest + 1. Only a row that exists, whose TTL has not passed (that expiry must become a
    # version first) and, with expected_version=N > 0, that is live at version N. Parameters:
    # value, created_at (a new life), updated_at, expires_at, embedding, embedding_key,
    # session_id, key, now, N, N.
    def update_blind(null_param: str) -> str:
        return (
            f"UPDATE {memory} SET version = version + 1, value = {json_param}, state = 'live', "
            f"{takes_over('', '%s')}, "
            "updated_at = %s, expires_at = %s, embedding = %s, embedding_key = %s "
            f"WHERE session_id = %s AND {quote_key} = %s AND {not_due('')} "
            f"AND ({null_param} IS NULL OR (state = 'live' AND version = %s)) "
            "RETURNING id, version, created_at"
        )

    blind_write = upsert_write = None
    if vendor == "postgresql":
        # Then the history version, from what the update returned, in the same statement.
        # Parameters: the eleven above, then value, created_at, expires_at, request_id, embedding.
        # (A bare "%s IS NULL" has no type PostgreSQL can infer inside a CTE: typed.)
        history = (
            f"ins AS (INSERT INTO {version} (memory_id, version, op, value, created_at, "
            f"expires_at, request_id, embedding) SELECT id, version, 'write', {json_param}, "
            "%s, %s, %s, %s FROM upd) SELECT id, version, created_at FROM upd"
        )
        blind_write = f"WITH upd AS ({update_blind('%s::bigint')}), {history}"
        # A key with no row is inserted at version 1; a conflict takes the row lock and goes on
        # as update_blind does (the same WHERE: a passed TTL is not overwritten here), and the
        # history version is inserted: the function migration 0008 creates, whose statement is
        # planned once per connection (sent as a statement, it was parsed and planned at every
        # call under Django's client-side binding). Parameters: session_id, key, value, now,
        # expires_at, embedding, embedding_key, request_id.
        upsert_write = (
            "SELECT id, version, created_at FROM agentmemory_upsert"
            f"(%s, %s, {json_param}, %s, %s, %s, %s, %s)"
        )
    elif vendor == "sqlite" and update_returning:
        blind_write = update_blind("%s")
    update_row = (
        f"UPDATE {memory} SET version = %s, value = {json_param}, state = %s, "
        "created_at = %s, updated_at = %s, expires_at = %s, embedding = %s, "
        "embedding_key = %s WHERE id = %s"
    )
    insert_version = (
        f"INSERT INTO {version} (memory_id, version, op, value, created_at, expires_at, "
        f"request_id, embedding) VALUES (%s, %s, %s, {json_param}, %s, %s, %s, %s)"
    )
    # A data-modifying WITH runs to completion whether or not the main statement reads it.
    append = f"WITH upd AS ({update_row}) {insert_version}" if vendor == "postgresql" else None
    create_write = None
    if blind_write is not None:
        create_write = (
            f"INSERT INTO {memory} (session_id, {quote_key}, value, version, state, created_at, "
            "updated_at, expires_at, history_from, embedding, embedding_key) "
            f"VALUES (%s, %s, {json_param}, 1, 'live', %s, %s, %s, 1, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING id, version, created_at"
        )
        if vendor == "postgresql":
            create_write = f"WITH upd AS ({create_write}), {history}"
    columns = f"id, session_id, {quote_key}, version, state, value, created_at, expires_at"
    where = f"WHERE session_id = %s AND {quote_key} = %s"
    plain = f"SELECT {columns} FROM {memory} {where}"
    return Statements(
        quote_key=quote_key,
        lock=plain + (" FOR UPDATE" if select_for_update else ""),
        read_row=plain,
        lock_by_id=f"SELECT version, history_from FROM {memory} WHERE id = %s"
        + (" FOR UPDATE" if select_for_update else ""),
        update_row=update_row,
        insert_version=insert_version,
        blind_write=blind_write,
        upsert_write=upsert_write,
        append=append,
        history_in_statement=vendor == "postgresql",
        create_write=create_write,
        find_request="SELECT op, value, version, created_at, expires_at "
        f"FROM {version} WHERE memory_id = %s AND request_id = %s ORDER BY id LIMIT 1",
    )


@lru_cache(maxsize=256)  # bounded: recall_many may be called with any number of keys
def _read_keys(quote_key: str, count: int) -> str:
    placeholders = ", ".join(["%s"] * count)
    columns = ", ".join(quote_key if name == "key" else name for name in RECORD_COLUMNS)
    return (
        f"SELECT {columns} FROM {Memory._meta.db_table} "
        f"WHERE session_id = %s AND {quote_key} IN ({placeholders})"
    )


def statements_for(connection: Any) -> Statements:
    # What the statements depend on belongs to the backend's class: worked out once per class.
    backend = type(connection)
    found = _by_backend.get(backend)
    if found is None:
        found = _by_backend[backend] = build_statements(
            json_placeholder(connection),
            connection.ops.quote_name("key"),
            bool(connection.features.has_select_for_update),
            connection.vendor,
            updates_return_rows(connection.vendor),
        )
    return found


_by_backend: dict[type, Statements] = {}


def updates_return_rows(vendor: str, sqlite_version: tuple[int, ...] | None = None) -> bool:
    """Whether ``UPDATE ... RETURNING`` exists here: PostgreSQL; SQLite from 3.35 (Django 5.2
    still runs on 3.31, where a SQLite write takes the locked path instead); not the MySQL
    family."""
    if vendor == "sqlite":
        return (sqlite_version or sqlite3.sqlite_version_info) >= (3, 35)
    return vendor == "postgresql"


@lru_cache(maxsize=512)
def _qmark(sql: str) -> str:
    """A statement in SQLite's parameter style, as Django's SQLite cursor rewrites it."""
    return _FORMAT.sub("?", sql).replace("%%", "%")


_FORMAT = re.compile(r"(?<!%)%s")


def run(connection: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run one statement on ``connection`` and return its rows (none for a statement that
    returns none).

    When something in Django watches statements -- an execute wrapper (instrumentation, the
    tests' error injection), query logging (``DEBUG``, ``CaptureQueriesContext``) -- it goes
    through Django's cursor like any query. Otherwise it goes straight to the cursor Django's
    backend creates (same driver settings, time zone and type conversions), with the checks
    Django's cursor makes -- a persistent connection's health check (``CONN_HEALTH_CHECKS``),
    thread sharing, a transaction already broken -- and Django's
    error translation, so callers and the retry policy see the same exceptions. Profiled: the
    cursor wrapper's layers were a third of a ``recall`` from SQLite (14.5 us of Django cursor
    against 5.2 us of driver cursor for the same point read)."""
    if connection.execute_wrappers or connection.queries_logged:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []
    connection.close_if_health_check_failed()  # CONN_HEALTH_CHECKS, as Django's cursor() does
    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        if connection.vendor == "sqlite":
            # Django's SQLite cursor rewrites %s to ? with a regex at every execute (3 us).
            cursor, sql = connection.connection.cursor(), _qmark(sql)
        else:
            cursor = connection.create_cursor()
        try:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []
        finally:
            cursor.close()


def run_query(connection: Any, queryset: Any) -> list[tuple[Any, ...]]:
    """A query the ORM builds (filters that depend on the vendor, a list of ids), run by
    :func:`run`: its rows as the driver returns them, decoded by the caller (for
    :func:`record_from_row`, as the hand-written statements' rows are)."""
    sql, params = queryset.query.get_compiler(connection=connection).as_sql()
    return run(connection, sql, params)


#: Ids per DELETE of :func:`delete_locked` (under SQLite's oldest limit of 999 parameters).
DELETE_CHUNK = 500


def lock_for_delete(connection: Any, queryset: Any) -> list[Any]:
    """The rows of ``queryset`` (a ``values_list``), locked in its order (``SELECT ... FOR
    UPDATE``; SQLite's ``BEGIN IMMEDIATE`` has locked everything, or the statement that follows
    takes the write lock). Every erasure and the ORM's own writes of memories lock this way.

    An erasure deletes the children of exactly these rows, then these rows: a writer of one of
    them waits for the lock and, once the erasure commits, finds no row and starts a new one
    (its write lands after the erasure); a row created after the lock is not the erasure's.
    Deleting by a ``session_id`` instead saw children written between two statements and
    failed on the foreign key (a raw ``IntegrityError``)."""
    if connection.features.has_select_for_update:
        queryset = queryset.select_for_update()
    return list(queryset)


def delete_locked(connection: Any, children: Sequence[tuple[Any, str]], ids: list[int]) -> int:
    """Plain DELETEs of the ``(model, foreign key column)`` children of the rows ``ids``, then
    of the rows, in chunks (nothing stored is read or decoded, so no value, however it was
    written, can stop an erasure). Returns how many rows (not children) were deleted."""
    if not ids:
        return 0
    quote = connection.ops.quote_name
    (parent,) = {model._meta.get_field(column).related_model for model, column in children}
    deleted = 0
    with connection.cursor() as cursor:
        for start in range(0, len(ids), DELETE_CHUNK):
            chunk = ids[start : start + DELETE_CHUNK]
            marks = ", ".join(["%s"] * len(chunk))
            for model, column in children:
                table, field = quote(model._meta.db_table), model._meta.get_field(column)
                cursor.execute(
                    f"DELETE FROM {table} WHERE {quote(field.column)} IN ({marks})", chunk
                )
            cursor.execute(
                f"DELETE FROM {quote(parent._meta.db_table)} WHERE id IN ({marks})", chunk
            )
            deleted += cursor.rowcount
    return deleted


def encode_json(value: Any) -> str | None:
    """What the value column receives: JSON text, or SQL NULL for None (as Django's JSONField
    with ``null=True`` stores it)."""
    return None if value is None else json.dumps(value, ensure_ascii=False, allow_nan=False)
