"""Helpers for the suites: processes with their own connections, and injected server errors."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from django.db import connection


def _setup_child(database_name: str) -> None:
    import django

    django.setup()
    from django.db import connections

    # The parent runs on the test database; point this process at the same one.
    connections["default"].settings_dict["NAME"] = database_name


def _call(fn: Callable[..., Any], args: tuple) -> Any:
    from django.db import connections

    try:
        return fn(*args)
    finally:
        connections.close_all()


def run_processes(fn: Callable[..., Any], args_list: list[tuple]) -> list[Any]:
    """Run fn(*args) in one fresh process per args (spawned: nothing shared with this one)."""
    name = connection.settings_dict["NAME"]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        len(args_list), mp_context=context, initializer=_setup_child, initargs=(name,)
    ) as pool:
        return list(pool.map(_call, [fn] * len(args_list), args_list))


@contextmanager
def inject_errors(
    make_error: Callable[[], BaseException], *, when: Callable[[int, str], bool]
) -> Iterator[list[str]]:
    """Raise the driver's own exception (converted the way Django converts it) before every
    statement on this thread's connection for which ``when(statement_number, sql)`` is true.
    Yields the list of statements that got an error."""
    hit: list[str] = []
    count = 0

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal count
        count += 1
        if when(count, sql):
            hit.append(sql)
            with connection.wrap_database_errors:
                raise make_error()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield hit


@contextmanager
def statements_sent() -> Iterator[list[str]]:
    """Every statement this thread's connection sends inside the block (an execute wrapper).
    The connection is opened first: its session setup (agentmemory.apps) is not a call's."""
    sent: list[str] = []
    connection.ensure_connection()

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield sent


def is_write_statement(sql: str) -> bool:
    """INSERT, UPDATE, a CTE that writes (PostgreSQL's one-statement writes), or the call of
    PostgreSQL's write function (migration 0008)."""
    upper = sql.lstrip().upper()
    return (
        upper.startswith(("INSERT", "UPDATE"))
        or (upper.startswith("WITH") and ("INSERT INTO" in upper or "UPDATE " in upper))
        or "AGENTMEMORY_UPSERT(" in upper
    )


def inserts_a_version(sql: str) -> bool:
    """The statement appends a history version (alone, in PostgreSQL's one-statement CTE, or in
    the call of PostgreSQL's write function, migration 0008)."""
    sql = sql.lower()
    return "insert into agentmemory_memoryversion" in sql or "agentmemory_upsert(" in sql


def child_database_url() -> str:
    """The URL of this test run's database, for a process started with the project's settings
    (``manage.py`` in a subprocess): the SQLite file, or the suite's URL (one host or several: a
    cluster) with the test database's name."""
    import os
    import re

    name = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        return f"sqlite:///{name}"
    return re.sub(r"/[^/?]*(\?|$)", rf"/{name}\1", os.environ["DATABASE_URL"], count=1)


def run_until_it_dies(fn: Callable[..., Any], args: tuple, agentmemory: dict[str, Any]) -> int:
    """Run fn(*args) in a fresh process (spawned) on this test's database, with these
    ``AGENTMEMORY`` settings; wait for it to end, however it ends. Returns its exit code
    (negative: the signal that killed it). ``fn`` is imported there by name, after Django's set-up
    (a test module imports the app's models)."""
    context = multiprocessing.get_context("spawn")
    name = f"{fn.__module__}:{fn.__qualname__}"
    process = context.Process(
        target=_setup_and_call, args=(connection.settings_dict["NAME"], agentmemory, name, args)
    )
    process.start()
    process.join(120)
    if process.is_alive():
        process.kill()
        process.join()
        raise AssertionError(f"{name} did not end within 120 s")
    return process.exitcode


def _setup_and_call(
    database_name: str, agentmemory: dict[str, Any], name: str, args: tuple
) -> None:
    import importlib

    _setup_child(database_name)
    from django.conf import settings

    from agentmemory.conf import get_config

    settings.AGENTMEMORY = agentmemory
    get_config.cache_clear()
    module, _, function = name.partition(":")
    _call(getattr(importlib.import_module(module), function), args)


def history_ops(path: Any) -> list[dict]:
    """The operations of a history memcheck saved (``--history``), without its last line (the
    final state the run was checked against)."""
    import json
    from pathlib import Path

    lines = (json.loads(line) for line in Path(path).read_text().splitlines())
    return [line for line in lines if "record" not in line]


def run_memcheck(*args: str) -> tuple[int, str]:
    """``manage.py memcheck`` with these arguments: its exit code and standard output."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    try:
        call_command("memcheck", *args, stdout=out, stderr=StringIO())
    except SystemExit as exit_:
        return exit_.code, out.getvalue()
    return 0, out.getvalue()


def rows_examined(
    statement: str, params: list, table: str, alias: str, *, loops: bool = False
) -> int | None:
    """How many rows of ``table`` (``alias`` in the statement) the database read to answer
    ``statement`` (PostgreSQL: the rows its scans of the table returned or filtered out;
    MariaDB: ``r_rows``); None where it cannot say (SQLite: the plan is checked instead -- no
    sort, the index gives the order)."""
    import json

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            # ``loops``: each scan's rows times its loops (a lookup repeated per outer row).
            return sum(
                (
                    node.get("Actual Rows", 0)
                    + node.get("Rows Removed by Filter", 0)
                    + node.get("Rows Removed by Index Recheck", 0)
                )
                * (node.get("Actual Loops", 1) if loops else 1)
                for node in _nodes(plan[0]["Plan"])
                if node.get("Relation Name") == table
            )
        if connection.vendor == "mysql" and connection.mysql_is_mariadb:
            cursor.execute("ANALYZE FORMAT=JSON " + statement, params)
            text = cursor.fetchone()[0]
            return sum(
                int(node.get("r_rows") or 0)
                for node in _nodes(json.loads(text))
                if node.get("table_name") in (alias, table)
            )
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + statement, params)
            plan = " | ".join(str(row[-1]) for row in cursor.fetchall())
            assert "TEMP B-TREE" not in plan, plan
    return None


def analyze(cursor: Any, model: Any) -> None:
    """Bring the server's statistics of ``model``'s table up to date (as autovacuum and
    InnoDB's automatic statistics do in time), so that a plan reflects the table's size."""
    if connection.vendor == "mysql":
        cursor.execute(f"ANALYZE TABLE {model._meta.db_table}")
        cursor.fetchall()
    else:
        cursor.execute("ANALYZE")


def _nodes(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


#: How many reads :func:`hit` makes before it gives up.
HIT_ATTEMPTS = 10


def hit(store: Any, session_id: str = "s", key: str = "k") -> Any:
    """``store.recall(session_id, key)`` read until Redis served it (``last_read_source ==
    "cache"``), at most :data:`HIT_ATTEMPTS` reads. A read after a fill is a hit only while the
    fence (1 s) lives: on a loaded machine it may be gone by then, and that read renews it from
    the database instead -- the next is the hit. Tests that need an entry served use this rather
    than one read, which fails under load (CI has met it)."""
    for _ in range(HIT_ATTEMPTS):
        record = store.recall(session_id, key)
        if store.last_read_source == "cache":
            return record
    raise AssertionError(
        f"{HIT_ATTEMPTS} reads of {session_id!r}/{key!r}, none served by Redis "
        f"(the last from {store.last_read_source})"
    )


@contextmanager
def holding_row_lock(session_id: str, key: str, using: str = "default") -> Iterator[None]:
    """Within the block, another connection (a thread of its own) holds the memory's row lock
    (``SELECT ... FOR UPDATE`` in an open transaction; SQLite: the database's write lock)."""
    import threading

    from django.db import connections, transaction

    from agentmemory.models import Memory

    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(using=using):
                Memory.objects.using(using).select_for_update().get(session_id=session_id, key=key)
                holding.set()
                release.wait(120)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30), "the row lock was not taken"
        yield
    finally:
        release.set()
        holder.join()
