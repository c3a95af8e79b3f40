"""Everything that differs between database servers, in one place.

- which errors mean "the transaction was rolled back, run it again" (``CONFLICT``) and which mean
  "the connection is gone, reconnect and run it again" (``DISCONNECT``);
- how to tell TiDB from MySQL/MariaDB (django-tidb reports vendor ``"mysql"``);
- the exact (binary, no-pad) collation of the id columns on the MySQL family;
- the server's row estimate (the admin's changelist) and the JSON parameter placeholder;
- how to select the strings that start with a prefix, exactly (SQLite's ``LIKE`` ignores ASCII
  case).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import sqlite3
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DatabaseError, InterfaceError
from django.db.models import Q

from .errors import InvalidMemory, MemoryUnavailable


class Transient(enum.Enum):
    CONFLICT = "conflict"  # deadlock, serialization failure, lock wait timeout, write conflict
    DISCONNECT = "disconnect"  # the server or the network dropped the connection


# MySQL/MariaDB: 1213 deadlock, 1205 lock wait timeout. TiDB: 9007 write conflict, 8002 SELECT FOR
# UPDATE write conflict, 8022 transaction commit failed and must be retried, 8028 schema changed
# under the transaction; TiDB reports 1213 and 1205 too.
MYSQL_CONFLICT_CODES = frozenset({1213, 1205, 9007, 8002, 8022, 8028})
# 2002/2003 cannot connect, 2006 server has gone away, 2013 lost connection during query,
# 2055 lost connection (SSL), 1053 server shutdown, 1927 connection killed (MariaDB),
# 4031 disconnected by the server (MySQL 8); 1047 a Galera node that is not ready (joining,
# donor, or cut off from the primary component): reconnect and retry, as for a node that is down.
MYSQL_DISCONNECT_CODES = frozenset({2002, 2003, 2006, 2013, 2055, 1053, 1927, 4031, 1047})
# KILL CONNECTION of a connection that has closed already.
MYSQL_UNKNOWN_THREAD = 1094
# PostgreSQL SQLSTATEs: 40001 serialization_failure, 40P01 deadlock_detected,
# 55P03 lock_not_available (lock_timeout); 57014 query_canceled -- a statement_timeout, a
# pooler's query timeout or an operator's pg_cancel_backend, and PostgreSQL's own report of a
# lock_timeout that fired as the lock was granted: the next lock wait of the same statement
# resets the timeout's flag, so the pending cancel reads "canceling statement due to user
# request" (a CI run of memcheck's db-lock fault met it on a tuple lock). A cancelled statement
# aborts its transaction, and COMMIT cannot be cancelled (only its wait for a synchronous standby,
# which answers with a WARNING: durable_commit): the whole transaction is retried, within the
# deadline.
POSTGRES_CONFLICT_STATES = frozenset({"40001", "40P01", "55P03", "57014"})
# 57P01-57P03 admin/crash shutdown (pg_terminate_backend), class 08 connection exceptions.
POSTGRES_DISCONNECT_STATES = frozenset({"57P01", "57P02", "57P03"})
# SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes in the high bits.
SQLITE_BUSY_CODES = frozenset({5, 6})


def flavor(connection: Any) -> str:
    """``"sqlite"``, ``"postgresql"``, ``"mysql"``, ``"mariadb"`` or ``"tidb"``."""
    if connection.vendor != "mysql":
        return connection.vendor
    if getattr(connection, "display_name", "") == "TiDB":
        return "tidb"
    return "mariadb" if connection.mysql_is_mariadb else "mysql"


def _driver_error(exc: BaseException) -> BaseException:
    # Django wraps the driver's exception and keeps it as __cause__.
    return exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ else exc


def classify(exc: BaseException) -> Transient | None:
    """Whether ``exc`` is worth retrying the whole transaction for, and why; None if not."""
    error = _driver_error(exc)
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        if (code is not None and code & 0xFF in SQLITE_BUSY_CODES) or "locked" in str(error):
            return Transient.CONFLICT
        return None
    module = type(error).__module__.split(".")[0]
    if module in ("MySQLdb", "pymysql"):
        code = error.args[0] if error.args and isinstance(error.args[0], int) else None
        if code in MYSQL_CONFLICT_CODES:
            return Transient.CONFLICT
        if code in MYSQL_DISCONNECT_CODES or type(error).__name__ == "InterfaceError":
            return Transient.DISCONNECT
        return None
    if module in ("psycopg", "psycopg2"):
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state in POSTGRES_CONFLICT_STATES:
            return Transient.CONFLICT
        if state in POSTGRES_DISCONNECT_STATES or (state or "").startswith("08"):
            return Transient.DISCONNECT
        # A broken connection surfaces as OperationalError/InterfaceError with no SQLSTATE.
        if state is None and type(error).__name__ in ("OperationalError", "InterfaceError"):
            return Transient.DISCONNECT
        return None
    if isinstance(exc, InterfaceError):
        return Transient.DISCONNECT
    return None


def insert_if_missing(connection: Any, model: Any, values: dict[str, Any]) -> None:
    """Insert one row unless its unique key exists, without raising and without making two.

    On the MySQL family ``INSERT IGNORE`` (what ``bulk_create(ignore_conflicts=True)`` emits)
    takes a *shared* lock on an existing duplicate, which the ``SELECT ... FOR UPDATE`` that
    follows must upgrade: two writers racing to create a key then deadlock (1213). ``ON DUPLICATE
    KEY UPDATE id = id`` takes the exclusive lock at once. Elsewhere ``ON CONFLICT DO NOTHING``.
    """
    if connection.vendor != "mysql":
        # The base manager: a plain insert (Memory's own ORM writes would drop the key's
        # entries from the tier, for a placeholder row the write path replaces before commit).
        model._base_manager.using(connection.alias).bulk_create(
            [model(**values)], ignore_conflicts=True
        )
        return
    meta = model._meta
    fields = [meta.get_field(name) for name in values]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(field.column) for field in fields)
    params = [field.get_db_prep_value(values[field.name], connection) for field in fields]
    pk = quote(meta.pk.column)
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({', '.join(['%s'] * len(fields))}) "
        f"ON DUPLICATE KEY UPDATE {pk} = {pk}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


#: How many times :func:`locked_or_created` inserts a row that an erasure keeps deleting.
CREATE_ATTEMPTS = 50


def locked_or_created(
    connection: Any, model: Any, values: dict[str, Any], lock: Callable[[], list[Any]]
) -> list[Any]:
    """``lock()``'s rows (a ``SELECT ... FOR UPDATE`` of one row), the row inserted first if it
    is missing (:func:`insert_if_missing`). Again while it finds nothing: an erasure that commits
    between the insert and the lock deletes the row the lock waited for, and READ COMMITTED
    skips a row deleted while it waited -- the lock comes back empty although it was just
    created (a write racing ``erase_session`` returned None, a log append failed an assertion).
    Each round means an erasure committed meanwhile; after :data:`CREATE_ATTEMPTS` of them,
    :class:`~agentmemory.MemoryUnavailable`."""
    rows = lock()
    for _ in range(CREATE_ATTEMPTS):
        if rows:
            return rows
        insert_if_missing(connection, model, values)
        rows = lock()
    if rows:
        return rows
    raise MemoryUnavailable(
        f"a {model._meta.verbose_name} row was erased {CREATE_ATTEMPTS} times while this write "
        "created it; nothing was written",
        attempts=CREATE_ATTEMPTS,
    )


#: Rows per multi-row INSERT: 4-5 parameters each stays under SQLite's 32,766 variables (and
#: PostgreSQL's 65,535) -- one append of 62,500 items used to fail with "too many SQL variables".
ROWS_PER_STATEMENT = 2000
#: Bytes kept free in a MySQL-family packet for the statement around its values.
PACKET_MARGIN = 64 * 1024
_PACKET_LIMITS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def packet_limit(connection: Any) -> int | None:
    """The largest statement the server takes, in bytes: a MySQL-family server's
    ``max_allowed_packet``, read once per connection (a statement over it fails with error
    1153, or the server drops the connection); None elsewhere (no such limit)."""
    if connection.vendor != "mysql":
        return None
    connection.ensure_connection()
    raw = connection.connection
    limit = _PACKET_LIMITS.get(raw)
    if limit is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@max_allowed_packet")
            limit = _PACKET_LIMITS[raw] = int(cursor.fetchone()[0])
    return limit


def sent_size(value: str | bytes | None) -> int:
    """Bytes a value takes in a MySQL-family statement: the client escapes NUL, newline,
    carriage return, backslash, both quotes and Ctrl-Z with a backslash each."""
    if value is None:
        return 4
    data = value.encode() if isinstance(value, str) else bytes(value)
    return len(data) + sum(data.count(c) for c in b"\0\n\r\\'\"\x1a") + 3


def check_fits(connection: Any, field: str, value: str | bytes | None) -> None:
    """:class:`~agentmemory.InvalidMemory` naming ``field``, its size and the server's limit
    if one statement carrying ``value`` would exceed the server's packet size -- before the
    statement is sent (MariaDB answered with a raw error 1153, or dropped the connection and
    the retries spent 9 s on it)."""
    limit = packet_limit(connection)
    if limit is None:
        return
    size = sent_size(value)
    if size + PACKET_MARGIN > limit:
        raise InvalidMemory(
            field,
            f"is {size} bytes as sent to the server (escaped), over what one statement may "
            f"carry there: max_allowed_packet is {limit} bytes, less {PACKET_MARGIN} for the "
            "statement. Raise the server's max_allowed_packet, or store less",
        )


def statement_batches(
    connection: Any, values: list[tuple[str, str | bytes | None]], row_overhead: int
) -> list[tuple[int, int]]:
    """``(start, stop)`` slices of rows that fit one multi-row INSERT each: at most
    :data:`ROWS_PER_STATEMENT` rows, and on a MySQL-family server at most its packet size.
    ``values``: each row's ``(name, large value)``, the value refused by :func:`check_fits`,
    naming it, if it alone would not fit; ``row_overhead``: the bytes of the row's other
    columns and its place in the statement."""
    limit = packet_limit(connection)
    budget = None if limit is None else limit - PACKET_MARGIN
    sizes = [0] * len(values)
    if budget is not None:
        for index, (name, value) in enumerate(values):
            check_fits(connection, name, value)
            sizes[index] = sent_size(value) + row_overhead
    batches, start, used = [], 0, 0
    for index, size in enumerate(sizes):
        full = index - start >= ROWS_PER_STATEMENT or (
            budget is not None and used + size > budget and index > start
        )
        if full:
            batches.append((start, index))
            start, used = index, 0
        used += size
    batches.append((start, len(sizes)))
    return batches


def exact_collation(connection: Any) -> str | None:
    if connection.vendor != "mysql":
        return None
    if getattr(connection, "display_name", "") == "TiDB":
        # TiDB's new collation framework: utf8mb4_bin is PAD SPACE as in MySQL, and TiDB >= 7.4
        # adds utf8mb4_0900_bin (NO PAD). Older TiDB falls back to utf8mb4_bin.
        return "utf8mb4_0900_bin" if connection.tidb_version >= (7, 4) else "utf8mb4_bin"
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    return "utf8mb4_0900_bin"


def estimated_rows(connection: Any, table: str) -> int | None:
    """The server's own estimate of a table's row count (no scan), or None where there is none
    (SQLite)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table]
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT table_rows FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
        else:
            return None
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None


def json_placeholder(connection: Any) -> str:
    """The parameter placeholder of a JSON column (PostgreSQL wants the text cast to jsonb)."""
    return "%s::jsonb" if connection.vendor == "postgresql" else "%s"


def prefix_filter(connection: Any, field: str, prefix: str) -> Q:
    """The rows whose ``field`` starts with ``prefix``, case and all.

    SQLite and the MySQL family (binary collations here) order strings by code point, so the
    prefix is a range over the index: ``prefix <= field < successor(prefix)``, which is exact
    where SQLite's ``LIKE`` would also match ``ACME`` for ``acme`` (and where MariaDB's
    ``LIKE BINARY`` skips the index). PostgreSQL's ``LIKE`` is case-sensitive already."""
    if not prefix:
        return Q()
    if connection.vendor not in ("sqlite", "mysql"):
        return Q(**{f"{field}__startswith": prefix})
    upper = prefix_successor(prefix)
    if upper is None:  # the prefix is all U+10FFFF: nothing sorts after it but its extensions
        return Q(**{f"{field}__gte": prefix})
    return Q(**{f"{field}__gte": prefix, f"{field}__lt": upper})


def has_prefix(text: str, prefix: str | None) -> bool:
    """The exact test after :func:`prefix_filter` (None: no prefix), whatever the database's
    collation made of the filter: every reader of a prefix applies it to what it read."""
    return prefix is None or text.startswith(prefix)


def prefix_successor(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix``."""
    while prefix:
        code = ord(prefix[-1]) + 1
        if code == 0xD800:  # surrogates are not characters any database stores
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:-1] + chr(code)
        prefix = prefix[:-1]
    return None


def server_connection_id(connection: Any) -> int | None:
    """The server's id of this open connection (what another session kills it by); None on
    SQLite, which runs in-process."""
    if connection.vendor == "mysql":
        return int(connection.connection.thread_id())
    if connection.vendor == "postgresql":
        return int(connection.connection.info.backend_pid)
    return None


def kill_connection(connection: Any, server_id: int) -> bool:
    """Close another session's connection server-side, from ``connection``; False if it was
    gone already."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [server_id])
            return bool(cursor.fetchone()[0])
        try:
            cursor.execute(f"KILL CONNECTION {int(server_id)}")
        except DatabaseError as exc:
            error = _driver_error(exc)
            if error.args and error.args[0] == MYSQL_UNKNOWN_THREAD:  # it had closed already
                return False
            raise  # the killer's own connection failed: the caller opens another
        return True


def set_lock_wait(connection: Any, seconds: int) -> None:
    """Make this session give up on a row lock after ``seconds`` (a lock-timeout error, which
    the store retries); SQLite keeps its busy timeout."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}")
        elif connection.vendor == "postgresql":
            cursor.execute(f"SET lock_timeout = '{int(seconds)}s'")


def bound_lock_wait(connection: Any, seconds: float) -> None:
    """At connect: make this server session give up on a lock after at most ``seconds``
    (``AGENTMEMORY["RETRY"]["DEADLINE"]``), unless the server's own wait is shorter. MySQL's
    default is 50 s (``innodb_lock_wait_timeout``), PostgreSQL's forever (``lock_timeout`` 0).
    SQLite's is the connection's busy timeout (``OPTIONS["timeout"]``, 5 s unless set)."""
    if connection.vendor == "sqlite":
        configured = float(connection.settings_dict["OPTIONS"].get("timeout", 5.0))
        if configured > seconds:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {max(1, int(seconds * 1000))}")
    elif connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SET SESSION innodb_lock_wait_timeout = "
                f"LEAST(@@SESSION.innodb_lock_wait_timeout, {max(1, math.ceil(seconds))})"
            )
    elif connection.vendor == "postgresql":
        setup_postgres_session(connection, seconds)


@contextlib.contextmanager
def lock_wait_at_most(connection: Any, seconds: float) -> Iterator[None]:
    """Within the block, this session's lock waits last at most ``seconds`` (a retry with
    that little time left before its call's deadline); then as they were. Outside any
    transaction (the retries' attempts are)."""
    connection.ensure_connection()
    vendor = connection.vendor
    with connection.cursor() as cursor:
        if vendor == "sqlite":
            cursor.execute("PRAGMA busy_timeout")
            before: Any = cursor.fetchone()[0]
            cursor.execute(f"PRAGMA busy_timeout = {max(1, min(before, int(seconds * 1000)))}")
        elif vendor == "mysql":
            cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
            before = cursor.fetchone()[0]
            cursor.execute(
                f"SET SESSION innodb_lock_wait_timeout = {max(1, min(int(before), math.ceil(seconds)))}"
            )
        elif vendor == "postgresql":
            cursor.execute("SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout'")
            before = cursor.fetchone()[0]  # milliseconds; 0: no limit
            wanted = max(1, int(seconds * 1000))
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, false)",
                [f"{min(before, wanted) if before else wanted}ms"],
            )
    try:
        yield
    finally:
        try:
            if connection.connection is not None and not connection.in_atomic_block:
                with connection.cursor() as cursor:
                    if vendor == "sqlite":
                        cursor.execute(f"PRAGMA busy_timeout = {int(before)}")
                    elif vendor == "mysql":
                        cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {int(before)}")
                    elif vendor == "postgresql":
                        cursor.execute(
                            "SELECT set_config('lock_timeout', %s, false)", [f"{int(before)}ms"]
                        )
        except DatabaseError:
            connection.close()  # a session left with the short wait would be wrong: a new one


# ---------------------------------------------------------------------- MariaDB Galera Cluster
#: ``wsrep_sync_wait`` bit for reads (SELECT, locking SELECT included, SHOW, BEGIN): the node
#: applies every write the cluster certified before the read, then answers.
GALERA_SYNC_WAIT_READS = 1
# Whether each alias's server is a Galera node (asked once per alias: a server does not change).
_galera: dict[str, bool] = {}


def is_galera(connection: Any) -> bool:
    """True when the alias's server is a MariaDB Galera Cluster node (``wsrep_on=ON``)."""
    if connection.alias not in _galera:
        found = False
        if connection.vendor == "mysql" and flavor(connection) != "tidb":
            with connection.cursor() as cursor:
                cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
                row = cursor.fetchone()
            found = bool(row) and str(row[1]).upper() == "ON"
        _galera[connection.alias] = found
    return _galera[connection.alias]


def make_reads_causal(connection: Any) -> None:
    """On a Galera node, make this session's reads wait until the node has applied every write
    the cluster had certified when the read began: another node's acknowledged write is then
    never missed (contract semantic 7). Galera certifies a transaction on every node before its
    COMMIT returns, but the other nodes apply it a moment later."""
    if is_galera(connection):
        with connection.cursor() as cursor:
            cursor.execute(f"SET SESSION wsrep_sync_wait = {GALERA_SYNC_WAIT_READS}")


def galera_status(connection: Any) -> dict[str, str]:
    """The node's settings and state that the guarantees depend on (for the system checks)."""
    names = ("binlog_format", "wsrep_sync_wait", "innodb_autoinc_lock_mode")
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@binlog_format, @@wsrep_sync_wait, @@innodb_autoinc_lock_mode")
        status = dict(zip(names, map(str, cursor.fetchone()), strict=True))
        cursor.execute("SHOW STATUS LIKE 'wsrep_local_state_comment'")
        row = cursor.fetchone()
    status["wsrep_local_state_comment"] = str(row[1]) if row else ""
    return status


def database_identity(connection: Any) -> str:
    """A short name for the database this connection reaches, the same from every alias and
    node that reaches it and different for any other database (another file, server, cluster or
    database name) -- not the alias, which every project calls ``default``. The cache tier puts
    it in its Redis keys, so two databases sharing one Redis never read each other's entries."""
    import hashlib
    import os

    name = str(connection.settings_dict.get("NAME") or "")
    if connection.vendor == "sqlite":
        parts = ["sqlite", os.path.realpath(name) if name and ":memory:" not in name else name]
    elif connection.vendor == "postgresql":
        from django.db import transaction

        try:
            with transaction.atomic(using=connection.alias):  # a savepoint if in a transaction
                parts = ["postgresql", *_first_row(connection, _POSTGRES_IDENTITY)]
        except DatabaseError:  # pg_control_system() needs pg_monitor: the address instead
            parts = ["postgresql", *_first_row(connection, _POSTGRES_ADDRESS)]
    elif flavor(connection) == "tidb":
        settings = connection.settings_dict
        parts = ["tidb", str(settings.get("HOST")), str(settings.get("PORT")), name]
    elif is_galera(connection):
        with connection.cursor() as cursor:
            cursor.execute("SHOW STATUS LIKE 'wsrep_cluster_state_uuid'")
            row = cursor.fetchone()
        parts = ["galera", str(row[1]) if row else "", *_first_row(connection, "SELECT DATABASE()")]
    else:
        parts = ["mysql", *_first_row(connection, _MYSQL_IDENTITY)]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:12]


# The server's own identity where it has one (PostgreSQL's system identifier, MySQL's
# server_uuid), its address and data directory otherwise; and the database's name (and OID).
_POSTGRES_IDENTITY = (
    "SELECT (SELECT system_identifier::text FROM pg_control_system()), "
    "current_database(), (SELECT oid::text FROM pg_database WHERE datname = current_database())"
)
_POSTGRES_ADDRESS = (
    "SELECT host(inet_server_addr()), inet_server_port()::text, current_database(), "
    "(SELECT oid::text FROM pg_database WHERE datname = current_database())"
)
_MYSQL_IDENTITY = "SELECT @@hostname, @@port, @@datadir, DATABASE()"


def _first_row(connection: Any, sql: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [str(value) for value in cursor.fetchone()]


# ---------------------------------------------------------------------- durability of a COMMIT
#: The epoch of a database whose acknowledged writes no failover takes back: every vendor but
#: PostgreSQL (one MySQL/MariaDB server keeps its own; Galera and TiDB replicate synchronously).
NO_EPOCH = "0"
#: ``synchronous_commit`` values under which PostgreSQL acknowledges a COMMIT that a crash
#: (``off``) or a failover to a synchronous standby (``local``) can take back.
POSTGRES_UNSAFE_COMMIT = frozenset({"off", "local"})
# At connect, one round trip: the timeline (the first 8 hex digits of the current WAL file's
# name: a promotion moves it forward at once, where pg_control_checkpoint() lags until the next
# checkpoint; '' on a standby), the session's synchronous_commit, and the lock wait bounded by
# the call deadline (only ever lowered; 0 ms: leave it).
_POSTGRES_SESSION = (
    "SELECT CASE WHEN pg_is_in_recovery() THEN '' "
    "ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END, "
    "current_setting('synchronous_commit'), "
    "(SELECT set_config('lock_timeout', %s, false) FROM pg_settings WHERE name = 'lock_timeout' "
    "AND %s > 0 AND (setting::bigint = 0 OR setting::bigint > %s))"
)


def setup_postgres_session(connection: Any, lock_wait_seconds: float | None) -> None:
    """At connect, on PostgreSQL: learn the database's epoch (:func:`epoch`) and whether the
    session's ``synchronous_commit`` needs raising for the store's transactions
    (:func:`raises_synchronous_commit`), bound the lock wait (:func:`bound_lock_wait`) -- in one
    round trip -- and watch the server's notices for a COMMIT that only committed locally
    (:func:`commit_unconfirmed`)."""
    limit = 0 if lock_wait_seconds is None else max(1, math.ceil(lock_wait_seconds * 1000))
    with connection.cursor() as cursor:
        cursor.execute(_POSTGRES_SESSION, [f"{limit}ms", limit, limit])
        timeline, synchronous_commit, _ = cursor.fetchone()
    connection.agentmemory_epoch = timeline or NO_EPOCH
    connection.agentmemory_raise_commit = synchronous_commit in POSTGRES_UNSAFE_COMMIT
    raw = connection.connection
    if raw not in _WATCHED:  # once per driver connection (a pool hands the same one out again)
        raw.add_notice_handler(functools.partial(_notice, weakref.ref(raw)))
        _WATCHED.add(raw)


#: The driver connections whose notices are watched, and those whose last COMMIT came back with
#: the cancelled-wait warning (kept with the driver's connection, not Django's wrapper: a pool
#: hands one driver connection to several wrappers in turn).
_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()
_UNCONFIRMED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _notice(raw: weakref.ref[Any], diagnostic: Any) -> None:
    # PostgreSQL's syncrep.c: a COMMIT whose wait for the synchronous standby was cancelled
    # (pg_cancel_backend, a pooler's statement timeout) returns success with this WARNING,
    # SQLSTATE 01000 (no code of its own; its text depends on lc_messages): "canceling wait for
    # synchronous replication due to user request -- The transaction has already committed
    # locally, but might not have been replicated to the standby." The store's statements
    # raise no other warning.
    found = raw()
    if found is not None and (diagnostic.severity_nonlocalized, diagnostic.sqlstate) == (
        "WARNING",
        "01000",
    ):
        _UNCONFIRMED[found] = True


def epoch(connection: Any) -> str:
    """The database's epoch, as this connection found it when it connected: on PostgreSQL its
    timeline (8 hex digits), which every promotion moves forward -- a failover, a switchover, a
    point-in-time recovery -- and which orders them; :data:`NO_EPOCH` elsewhere. The cache tier
    binds its entries to it: what was cached before a failover that lost writes is never served
    after it."""
    if connection.vendor != "postgresql":
        return NO_EPOCH
    found = getattr(connection, "agentmemory_epoch", None)
    if found is None or connection.connection is None:
        connection.ensure_connection()  # connection_created sets it
        found = getattr(connection, "agentmemory_epoch", None)
        if found is None:  # a connection made before the app was ready: ask now
            setup_postgres_session(connection, None)
            found = connection.agentmemory_epoch
    return found


def raises_synchronous_commit(connection: Any) -> bool:
    """Whether the store's transactions on this connection begin with ``SET LOCAL
    synchronous_commit = on``: the session's setting (``off``, ``local``) would acknowledge a
    COMMIT that a crash or a failover can take back (system check W005 says so)."""
    return bool(getattr(connection, "agentmemory_raise_commit", False))


def begin_durable(connection: Any) -> None:
    """At the start of one of the store's transactions: make its COMMIT durable (see
    :func:`raises_synchronous_commit`)."""
    if connection.vendor == "postgresql" and raises_synchronous_commit(connection):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = on")


def expect_commit(connection: Any) -> None:
    """Before one of the store's calls: forget what an earlier COMMIT's notices said."""
    if connection.vendor == "postgresql" and connection.connection is not None:
        _UNCONFIRMED.pop(connection.connection, None)


def commit_unconfirmed(connection: Any) -> bool:
    """Whether the last COMMIT on this connection returned with PostgreSQL's warning that its
    wait for the synchronous standby was cancelled: committed locally, perhaps not replicated,
    so a failover may take it back. The store does not acknowledge it (``MemoryUnavailable``),
    and the cache tier does not serve it."""
    return (
        connection.vendor == "postgresql"
        and connection.connection is not None
        and _UNCONFIRMED.get(connection.connection, False)
    )
