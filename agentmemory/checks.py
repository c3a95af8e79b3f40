"""System checks (``manage.py check``; the database ones also run with ``--database`` and migrate)."""

from __future__ import annotations

import importlib.util
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from .conf import DEFAULTS, RETENTION_KEYS, RETRY_KEYS, get_config
from .errors import InvalidMemory
from .semantic import index_problems
from .validation import check_ttl
from .vendors import flavor, galera_status, is_galera

TIDB_MINIMUM = (6, 5)


def _check_retry(retry: dict[str, Any]) -> list[Error]:
    """E009: the retry policy's values."""
    problems = []
    attempts = retry.get("ATTEMPTS")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 1000:
        problems.append(f"ATTEMPTS is {attempts!r}: an int from 1 to 1000")
    for name in ("BASE_DELAY", "MAX_DELAY"):
        delay = retry.get(name)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 60:
            problems.append(f"{name} is {delay!r}: seconds from 0 to 60")
    if not isinstance(retry.get("RECONNECT"), bool):
        problems.append(f"RECONNECT is {retry.get('RECONNECT')!r}: True or False")
    return [
        Error(
            f"AGENTMEMORY['RETRY']: {problem}.",
            hint="See the RETRY defaults in the README's Configuration section.",
            id="agentmemory.E009",
        )
        for problem in problems
    ]


def _check_retention(user: dict[str, Any], retention: dict[str, Any]) -> list[Error]:
    """E016: the history retention policy."""
    problems = [f"unknown setting {name!r}" for name in sorted(set(user) - RETENTION_KEYS)]
    keep_last, keep_days = retention["KEEP_LAST"], retention["KEEP_DAYS"]
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        problems.append(f"KEEP_LAST is {keep_last!r}: an int >= 1, or None")
    if keep_days is not None and (
        isinstance(keep_days, bool) or not isinstance(keep_days, int | float) or keep_days <= 0
    ):
        problems.append(f"KEEP_DAYS is {keep_days!r}: days > 0, or None")
    return [
        Error(
            f"AGENTMEMORY['HISTORY_RETENTION']: {problem}.",
            hint="KEEP_LAST (versions per memory) and KEEP_DAYS (days); None keeps everything.",
            id="agentmemory.E016",
        )
        for problem in problems
    ]


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    user = getattr(settings, "AGENTMEMORY", {}) or {}
    errors = []
    for name in sorted(set(user) - set(DEFAULTS)):
        errors.append(
            Error(
                f"AGENTMEMORY has an unknown setting {name!r}.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="agentmemory.E001",
            )
        )
    for name in sorted(set(user.get("RETRY") or {}) - RETRY_KEYS):
        errors.append(
            Error(
                f"AGENTMEMORY['RETRY'] has an unknown setting {name!r}.",
                hint=f"Known settings: {', '.join(sorted(RETRY_KEYS))}.",
                id="agentmemory.E008",
            )
        )
    config = get_config()
    errors += _check_retry(config["RETRY"])
    errors += _check_retention(user.get("HISTORY_RETENTION") or {}, config["HISTORY_RETENTION"])
    if config["DATABASE"] not in settings.DATABASES:
        errors.append(
            Error(
                f"AGENTMEMORY['DATABASE'] is {config['DATABASE']!r}, which is not in DATABASES.",
                hint=f"Use one of: {', '.join(settings.DATABASES)}.",
                id="agentmemory.E002",
            )
        )
    if config["CACHE"] is not None and config["CACHE"] not in settings.CACHES:
        errors.append(
            Error(
                f"AGENTMEMORY['CACHE'] is {config['CACHE']!r}, which is not in CACHES.",
                hint="Name a cache alias from CACHES, or None for no cache tier.",
                id="agentmemory.E003",
            )
        )
    elif config["CACHE"] is not None and not settings.CACHES[config["CACHE"]].get(
        "BACKEND", ""
    ).startswith("django_redis."):
        errors.append(
            Error(
                f"AGENTMEMORY['CACHE'] is {config['CACHE']!r}, which is not a django-redis cache.",
                hint="The cache tier needs Redis through django-redis "
                "(BACKEND 'django_redis.cache.RedisCache'), or set CACHE to None.",
                id="agentmemory.E006",
            )
        )
    if config["CACHE"] is not None and config["CACHE"] in settings.CACHES:
        client_class = (settings.CACHES[config["CACHE"]].get("OPTIONS") or {}).get(
            "CLIENT_CLASS", "django_redis.client.DefaultClient"
        )
        if client_class.endswith("ShardClient"):
            errors.append(
                Error(
                    f"AGENTMEMORY['CACHE'] is {config['CACHE']!r}, a sharded django-redis cache: "
                    "an entry, its lease and the fence would live on different servers, and no "
                    "script could keep them consistent.",
                    hint="Give the cache tier one Redis primary (optionally Sentinel-managed: "
                    "django_redis.client.SentinelClient).",
                    id="agentmemory.E015",
                )
            )
    for name in ("CACHE_FENCE_SECONDS", "CACHE_MAX_ENTRY_SECONDS"):
        seconds = config[name]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            errors.append(
                Error(
                    f"AGENTMEMORY[{name!r}] is {seconds!r}.",
                    hint="Seconds > 0.",
                    id="agentmemory.E007",
                )
            )
    if config["CACHE"] is not None and not config["CACHE_PROTECTION"]:
        errors.append(
            Error(
                "AGENTMEMORY['CACHE_PROTECTION'] is False: the Redis tier can serve an older "
                "version than an acknowledged write (after a restart, a failover, or a writer "
                "that could not reach Redis).",
                hint="Remove CACHE_PROTECTION from AGENTMEMORY (it exists for memcheck's tests).",
                id="agentmemory.E014",
            )
        )
    try:
        check_ttl(config["DEFAULT_TTL"])
    except InvalidMemory as exc:
        errors.append(
            Error(
                f"AGENTMEMORY['DEFAULT_TTL'] is invalid: {exc}",
                hint="Seconds > 0, or None.",
                id="agentmemory.E004",
            )
        )
    threads = config["ASYNC_THREADS"]
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        errors.append(
            Error(
                f"AGENTMEMORY['ASYNC_THREADS'] is {threads!r}.",
                hint="The async twins' thread pool size: an int from 1 to 1024 (default 16); "
                "each thread holds its own database connection.",
                id="agentmemory.E018",
            )
        )
    errors += search_errors(config["SEARCH"])
    size = config["MAX_VALUE_BYTES"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        errors.append(
            Error(
                f"AGENTMEMORY['MAX_VALUE_BYTES'] is {size!r}.",
                hint="A positive number of bytes, e.g. 1048576.",
                id="agentmemory.E005",
            )
        )
    return errors


SEARCH_KEYS = frozenset({"EMBED", "DIMS", "FIELDS", "TIMEOUT", "CACHE_MB"})


def search_errors(search: Any) -> list[Error]:
    """``AGENTMEMORY["SEARCH"]``: None, or a semantic index that can be built (E019), with numpy
    installed to score it (E020)."""
    if search is None:
        return []
    hint = (
        'None, or {"EMBED": "myproject.embeddings.embed", "DIMS": 384, "FIELDS": ["$"], '
        '"TIMEOUT": 30, "CACHE_MB": 256}.'
    )
    if not isinstance(search, dict):
        return [Error(f"AGENTMEMORY['SEARCH'] is {search!r}.", hint=hint, id="agentmemory.E019")]
    problems = [f"unknown setting {name!r}" for name in sorted(set(search) - SEARCH_KEYS)]
    problems += [f"{name} is missing" for name in ("EMBED", "DIMS") if name not in search]
    if not problems:
        problems = index_problems(
            search["EMBED"],
            search["DIMS"],
            search.get("FIELDS", ["$"]),
            search.get("TIMEOUT", 30.0),
        )
        megabytes = search.get("CACHE_MB", 256)
        if (
            isinstance(megabytes, bool)
            or not isinstance(megabytes, int | float)
            or not 0 <= megabytes < 1024 * 1024
        ):
            problems.append(f"CACHE_MB must be megabytes >= 0, got {megabytes!r}")
    errors = [
        Error(f"AGENTMEMORY['SEARCH']: {problem}.", hint=hint, id="agentmemory.E019")
        for problem in problems
    ]
    if importlib.util.find_spec("numpy") is None:
        errors.append(
            Error(
                "AGENTMEMORY['SEARCH'] is set, but numpy, which scores the vectors, is not "
                "installed.",
                hint="pip install 'agentmemory[search]'",
                id="agentmemory.E020",
            )
        )
    return errors


@register()
def check_database_options(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    alias = get_config()["DATABASE"]
    if alias not in settings.DATABASES:
        return []
    return database_warnings(alias, settings.DATABASES[alias])


def database_warnings(alias: str, database: dict[str, Any]) -> list[Warning]:
    engine = database.get("ENGINE", "")
    options = database.get("OPTIONS", {})
    if (
        engine.endswith("sqlite3")
        and str(options.get("transaction_mode", "")).upper() != "IMMEDIATE"
    ):
        return [
            Warning(
                f"SQLite database {alias!r} does not begin transactions with BEGIN IMMEDIATE; "
                "concurrent writers will fail with 'database is locked' instead of waiting.",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS'] = {{'transaction_mode': 'IMMEDIATE', "
                "'timeout': 20, 'init_command': 'PRAGMA journal_mode=WAL;'}.",
                id="agentmemory.W001",
            )
        ]
    if (engine.endswith("mysql") or engine == "django_tidb") and str(
        options.get("isolation_level", "")
    ).lower() != "read committed":
        return [
            Warning(
                f"MySQL-family database {alias!r} does not use READ COMMITTED; REPEATABLE READ "
                "takes gap locks that make concurrent first writes deadlock (they are retried, "
                "but cost time).",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS']['isolation_level'] = 'read committed'.",
                id="agentmemory.W002",
            )
        ]
    return []


@register()
def check_tidb_backend(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E017: django-tidb declares no Django requirement; its X.Y must be Django's X.Y."""
    if not any(db.get("ENGINE") == "django_tidb" for db in settings.DATABASES.values()):
        return []
    from importlib.metadata import PackageNotFoundError, version

    import django

    try:
        installed = version("django-tidb")
    except PackageNotFoundError:
        installed = None
    return tidb_backend_errors(installed, django.get_version())


def tidb_backend_errors(tidb_version: str | None, django_version: str) -> list[Error]:
    line = ".".join(django_version.split(".")[:2])
    if tidb_version is not None and tidb_version.split(".")[:2] == line.split("."):
        return []
    found = f"django-tidb {tidb_version}" if tidb_version else "no django-tidb"
    return [
        Error(
            f"A database uses the django_tidb backend, and {found} is installed beside Django "
            f"{django_version}: django-tidb X.Y supports Django X.Y only.",
            hint=f"pip install 'django-tidb~={line}.0' (none exists for Django 6.1 yet: use "
            "Django 6.0 or 5.2 with TiDB).",
            id="agentmemory.E017",
        )
    ]


@register(Tags.database)
def check_tidb_server(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Error]:
    """TiDB must run pessimistic transactions (optimistic ones ignore the row lock until COMMIT)
    and be >= 6.5 (savepoints, JSON, foreign keys)."""
    errors: list[Error] = []
    for alias in databases or ():
        connection = connections[alias]
        if flavor(connection) != "tidb":
            continue
        errors.extend(tidb_errors(alias, connection.tidb_version, _tidb_txn_mode(connection)))
    return errors


def _tidb_txn_mode(connection: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@tidb_txn_mode")
        return (cursor.fetchone()[0] or "").lower()


def tidb_errors(alias: str, version: tuple[int, ...], txn_mode: str) -> list[Error]:
    errors = []
    if tuple(version[:2]) < TIDB_MINIMUM:
        errors.append(
            Error(
                f"TiDB database {alias!r} runs version {'.'.join(map(str, version))}; agentmemory "
                f"needs >= {'.'.join(map(str, TIDB_MINIMUM))}.",
                hint="Upgrade TiDB (savepoints need 6.2, JSON 6.3, foreign keys 6.6; 6.5 is the LTS).",
                id="agentmemory.E010",
            )
        )
    # An empty tidb_txn_mode means the server default, pessimistic since TiDB 3.0.8.
    if txn_mode not in ("", "pessimistic"):
        errors.append(
            Error(
                f"TiDB database {alias!r} runs {txn_mode} transactions: row locks are not taken "
                "until COMMIT, so concurrent writers surface conflicts late.",
                hint="SET GLOBAL tidb_txn_mode = 'pessimistic', or add "
                '"init_command": "SET SESSION tidb_txn_mode=\'pessimistic\'" to the alias\' OPTIONS.',
                id="agentmemory.E011",
            )
        )
    return errors


@register(Tags.database)
def check_galera_nodes(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Error | Warning]:
    """A MariaDB Galera node must replicate row images and give the store causal reads."""
    messages: list[Error | Warning] = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor != "mysql" or not is_galera(connection):
            continue
        messages.extend(
            galera_errors(alias, galera_status(connection), get_config()["CAUSAL_READS"])
        )
    return messages


def galera_errors(alias: str, status: dict[str, str], causal_reads: bool) -> list[Error | Warning]:
    messages: list[Error | Warning] = []
    if status["binlog_format"].upper() != "ROW":
        messages.append(
            Error(
                f"Galera node {alias!r} runs binlog_format={status['binlog_format']}: Galera "
                "certifies and applies row images only, so writes may be lost or diverge.",
                hint="Set binlog_format=ROW in the server's configuration.",
                id="agentmemory.E012",
            )
        )
    if not causal_reads:
        messages.append(
            Error(
                f"AGENTMEMORY['CAUSAL_READS'] is False and {alias!r} is a Galera node: a recall "
                "on one node can miss a write another node acknowledged (semantic 7).",
                hint="Remove CAUSAL_READS from AGENTMEMORY (the default, True, sets "
                "wsrep_sync_wait on the store's connections).",
                id="agentmemory.E013",
            )
        )
    if status["innodb_autoinc_lock_mode"] != "2":
        messages.append(
            Warning(
                f"Galera node {alias!r} runs innodb_autoinc_lock_mode="
                f"{status['innodb_autoinc_lock_mode']}: concurrent first writes can deadlock.",
                hint="Set innodb_autoinc_lock_mode=2, as Galera's documentation requires.",
                id="agentmemory.W003",
            )
        )
    if status["wsrep_local_state_comment"] != "Synced":
        messages.append(
            Warning(
                f"Galera node {alias!r} is {status['wsrep_local_state_comment'] or 'not'} "
                "Synced: it refuses or delays queries until it has caught up.",
                hint="Wait for the node to rejoin (SHOW STATUS LIKE 'wsrep_local_state_comment').",
                id="agentmemory.W004",
            )
        )
    return messages
