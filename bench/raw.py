"""The raw-driver baseline: agentmemory's write protocol and point read written directly on
sqlite3, mysqlclient and psycopg, on the same tables -- the limit the store is measured against."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

MEMORY, VERSION = "agentmemory_memory", "agentmemory_memoryversion"


def vendor_of(settings_dict: dict[str, Any]) -> str:
    engine = settings_dict["ENGINE"]
    return "sqlite" if "sqlite" in engine else "mysql" if "mysql" in engine else "postgresql"


def create_database(settings_dict: dict[str, Any]) -> None:
    """Create the server database if it does not exist (SQLite creates its file itself)."""
    vendor, name = vendor_of(settings_dict), settings_dict["NAME"]
    if vendor == "mysql":
        import MySQLdb

        conn = MySQLdb.connect(
            host=settings_dict["HOST"],
            port=int(settings_dict["PORT"] or 3306),
            user=settings_dict["USER"],
            password=settings_dict["PASSWORD"] or "",
        )
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        conn.close()
    elif vendor == "postgresql":
        import psycopg

        with psycopg.connect(
            host=settings_dict["HOST"],
            port=settings_dict["PORT"] or 5432,
            user=settings_dict["USER"],
            dbname="postgres",
            autocommit=True,
        ) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')


class Driver:
    """One connection per thread, straight from the driver."""

    def __init__(self, settings_dict: dict[str, Any]) -> None:
        self.settings = settings_dict
        self.vendor = vendor_of(settings_dict)
        self._local = threading.local()
        key = "`key`" if self.vendor == "mysql" else '"key"'
        p = "?" if self.vendor == "sqlite" else "%s"
        json_param = f"{p}::jsonb" if self.vendor == "postgresql" else p
        insert_if_missing = {
            "sqlite": "INSERT OR IGNORE INTO",
            "mysql": "INSERT INTO",
            "postgresql": "INSERT INTO",
        }[self.vendor]
        on_conflict = {
            "sqlite": "",
            "mysql": " ON DUPLICATE KEY UPDATE id = id",
            "postgresql": " ON CONFLICT DO NOTHING",
        }[self.vendor]
        self.sql_insert = (
            f"{insert_if_missing} {MEMORY} (session_id, {key}, value, version, state, created_at, "
            f"updated_at) VALUES ({p}, {p}, NULL, 0, 'forgotten', {p}, {p}){on_conflict}"
        )
        lock = "" if self.vendor == "sqlite" else " FOR UPDATE"
        self.sql_lock = (
            f"SELECT id, version FROM {MEMORY} WHERE session_id = {p} AND {key} = {p}{lock}"
        )
        self.sql_update = (
            f"UPDATE {MEMORY} SET value = {json_param}, version = {p}, state = 'live', "
            f"updated_at = {p}, expires_at = NULL WHERE id = {p}"
        )
        self.sql_history = (
            f"INSERT INTO {VERSION} (memory_id, version, op, value, created_at, expires_at, "
            f"request_id) VALUES ({p}, {p}, 'write', {json_param}, {p}, NULL, {p})"
        )
        self.sql_read = (
            f"SELECT value, version, expires_at FROM {MEMORY} "
            f"WHERE session_id = {p} AND {key} = {p} AND state = 'live'"
        )
        self.begin = {"sqlite": "BEGIN IMMEDIATE", "mysql": "BEGIN", "postgresql": "BEGIN"}[
            self.vendor
        ]

    def connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            s = self.settings
            if self.vendor == "sqlite":
                conn = sqlite3.connect(s["NAME"], timeout=20, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
            elif self.vendor == "mysql":
                import MySQLdb

                conn = MySQLdb.connect(
                    host=s["HOST"],
                    port=int(s["PORT"] or 3306),
                    user=s["USER"],
                    password=s["PASSWORD"] or "",
                    database=s["NAME"],
                    charset="utf8mb4",
                    autocommit=True,
                )
                conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            else:
                import psycopg

                conn = psycopg.connect(
                    host=s["HOST"],
                    port=s["PORT"] or 5432,
                    user=s["USER"],
                    dbname=s["NAME"],
                    autocommit=True,  # as Django runs it: a read is one round trip
                )
            self._local.conn = conn
        return conn

    def _transient(self, exc: BaseException) -> bool:
        if self.vendor == "sqlite":
            return "locked" in str(exc) or "busy" in str(exc)
        if self.vendor == "mysql":
            return bool(exc.args) and exc.args[0] in (1213, 1205)
        return getattr(exc, "sqlstate", None) in ("40001", "40P01", "55P03")

    def writes(
        self,
        session: str,
        keys: list[str],
        value: Any,
        *,
        one_transaction: bool = False,
        redis: Any = None,
    ) -> int:
        """The write protocol once per key (or for all keys in one transaction); returns the
        number of writes. Deadlocks and busy errors are retried, like the store does.

        With a redis-py client, the least a write-through cache that never serves a stale
        version needs around each transaction: one round trip before COMMIT that marks the keys
        (a tombstone: readers miss, older fills are refused) and one after it that stores the
        new values -- as plain ``SET`` commands, no script, no lease, no server identity."""
        batches = [keys] if one_transaction else [[key] for key in keys]
        for batch in batches:
            for attempt in range(20):
                try:
                    self._transaction(session, batch, value, redis)
                    break
                except Exception as exc:
                    self._rollback()
                    if not self._transient(exc) or attempt == 19:
                        raise
                    time.sleep(0.001 * 2 ** min(attempt, 6))
        return len(keys)

    def _transaction(self, session: str, keys: list[str], value: Any, redis: Any = None) -> None:
        conn = self.connection()
        cursor = conn.cursor()
        text = json.dumps(value)
        cursor.execute(self.begin)
        versions = {}
        for key in keys:
            now = datetime.now(UTC)
            stamp = now.strftime("%Y-%m-%d %H:%M:%S.%f") if self.vendor == "sqlite" else now
            if self.vendor == "mysql":
                stamp = now.replace(tzinfo=None)
            cursor.execute(self.sql_insert, (session, key, stamp, stamp))
            cursor.execute(self.sql_lock, (session, key))
            row_id, version = cursor.fetchone()
            cursor.execute(self.sql_update, (text, version + 1, stamp, row_id))
            cursor.execute(self.sql_history, (row_id, version + 1, text, stamp, uuid.uuid4().hex))
            versions[key] = version + 1
        if redis is not None:
            self._redis_round_trip(redis, session, versions, None)
        cursor.execute("COMMIT")
        if redis is not None:
            self._redis_round_trip(redis, session, versions, text)

    @staticmethod
    def _redis_round_trip(
        redis: Any, session: str, versions: dict[str, int], text: str | None
    ) -> None:
        names = {key: f"bench-raw-cache:{session}:{key}" for key in versions}
        if len(versions) == 1:
            ((key, version),) = versions.items()
            redis.set(names[key], f"{version}|{'~' if text is None else text}", px=3_000)
            return
        pipe = redis.pipeline(transaction=False)
        for key, version in versions.items():
            pipe.set(names[key], f"{version}|{'~' if text is None else text}", px=3_000)
        pipe.execute()

    def _rollback(self) -> None:
        with contextlib.suppress(Exception):
            self.connection().cursor().execute("ROLLBACK")

    def read(self, session: str, key: str) -> Any:
        conn = self.connection()
        cursor = conn.cursor()
        cursor.execute(self.sql_read, (session, key))
        row = cursor.fetchone()
        if row is None:
            return None
        return row[0] if self.vendor == "postgresql" else json.loads(row[0])  # psycopg decodes
