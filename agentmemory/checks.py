"""System checks (``manage.py check``; the database ones also run with ``--database`` and migrate)."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from .conf import DEFAULTS, RETENTION_KEYS, RETRY_KEYS, SEARCH_DEFAULTS, SEARCH_KEYS, get_config
from .errors import InvalidMemory
from .semantic import index_problems
from .validation import check_ttl, short_repr
from .vendors import (
    PACKET_MARGIN,
    exact_collation,
    flavor,
    galera_status,
    is_galera,
    packet_limit,
)

TIDB_MINIMUM = (6, 5)


def _user() -> Any:
    return getattr(settings, "AGENTMEMORY", {}) or {}


def _config() -> dict[str, Any] | None:
    """The merged settings, or None when ``AGENTMEMORY`` is not a dict (E021 says so; every
    other settings check then has nothing to read)."""
    return get_config() if isinstance(_user(), Mapping) else None


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


def _type_name(value: Any) -> str:
    return f"{value!r} (a {type(value).__name__})"


@register()
def check_settings_dict(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E021: ``AGENTMEMORY`` is a dict."""
    user = _user()
    if isinstance(user, Mapping):
        return []
    return [
        Error(
            f"AGENTMEMORY is {short_repr(user, 60)}; it must be a dict of settings.",
            hint='For example AGENTMEMORY = {"CACHE": "agentmemory"}.',
            id="agentmemory.E021",
        )
    ]


@register()
def check_unknown_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E001: every key of ``AGENTMEMORY`` is a known setting."""
    user = _user()
    if not isinstance(user, Mapping):
        return []
    return [
        Error(
            f"AGENTMEMORY has an unknown setting {name!r}.",
            hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
            id="agentmemory.E001",
        )
        for name in sorted(set(user) - set(DEFAULTS), key=str)
    ]


@register()
def check_database_alias(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E002: ``DATABASE`` names an alias of ``DATABASES``."""
    config = _config()
    if config is None:
        return []
    alias = config["DATABASE"]
    if isinstance(alias, str) and alias in settings.DATABASES:
        return []
    return [
        Error(
            f"AGENTMEMORY['DATABASE'] is {alias!r}, which is not in DATABASES.",
            hint=f"Use one of: {', '.join(settings.DATABASES)}.",
            id="agentmemory.E002",
        )
    ]


@register()
def check_shards_setting(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E025: ``SHARDS`` is None or a list of distinct aliases of ``DATABASES``."""
    config = _config()
    if config is None or config["SHARDS"] is None:
        return []
    from .sharding import check_shards

    try:
        check_shards(config["SHARDS"])
    except ImproperlyConfigured as problem:
        return [
            Error(
                f"{problem}.",
                hint='For example AGENTMEMORY["SHARDS"] = ["shard0", "shard1"], each in DATABASES.',
                id="agentmemory.E025",
            )
        ]
    return []


@register()
def check_cache_alias(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E003: ``CACHE`` is None or an alias of ``CACHES``."""
    config = _config()
    if config is None or config["CACHE"] is None:
        return []
    alias = config["CACHE"]
    if isinstance(alias, str) and alias in settings.CACHES:
        return []
    return [
        Error(
            f"AGENTMEMORY['CACHE'] is {alias!r}, which is not in CACHES.",
            hint="Name a cache alias from CACHES, or None for no cache tier.",
            id="agentmemory.E003",
        )
    ]


def _cache_settings() -> tuple[str, dict[str, Any]] | None:
    """The cache tier's alias and its CACHES entry, when both exist."""
    config = _config()
    if config is None or not isinstance(config["CACHE"], str):
        return None
    found = settings.CACHES.get(config["CACHE"])
    return (config["CACHE"], found) if isinstance(found, Mapping) else None


@register()
def check_cache_backend(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E006: the cache tier is a django-redis cache."""
    cache = _cache_settings()
    if cache is None or str(cache[1].get("BACKEND", "")).startswith("django_redis."):
        return []
    return [
        Error(
            f"AGENTMEMORY['CACHE'] is {cache[0]!r}, which is not a django-redis cache.",
            hint="The cache tier needs Redis through django-redis "
            "(BACKEND 'django_redis.cache.RedisCache'), or set CACHE to None.",
            id="agentmemory.E006",
        )
    ]


@register()
def check_cache_not_sharded(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E015: the cache tier is one Redis primary, not django-redis' ShardClient."""
    cache = _cache_settings()
    if cache is None:
        return []
    client_class = (cache[1].get("OPTIONS") or {}).get(
        "CLIENT_CLASS", "django_redis.client.DefaultClient"
    )
    if not str(client_class).endswith("ShardClient"):
        return []
    return [
        Error(
            f"AGENTMEMORY['CACHE'] is {cache[0]!r}, a sharded django-redis cache: "
            "an entry, its lease and the fence would live on different servers, and no "
            "script could keep them consistent.",
            hint="Give the cache tier one Redis primary (optionally Sentinel-managed: "
            "django_redis.client.SentinelClient), or a Redis Cluster through "
            "agentmemory.redis_cluster.ClusterClient.",
            id="agentmemory.E015",
        )
    ]


@register(Tags.caches)
def check_cache_server(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E024/W009: the cache tier's Redis answers a PING within two seconds. One that answers
    with an error (a database index out of range: ``redis://host/99``; a refused password) is a
    configuration error (E024); one that does not answer may be down for now (W009). Tagged
    ``caches``: ``manage.py check --tag caches`` runs it alone (a deploy pipeline's step)."""
    cache = _cache_settings()
    if cache is None or not str(cache[1].get("BACKEND", "")).startswith("django_redis."):
        return []
    from .cache import probe_cache

    problem = probe_cache(cache[0])
    if problem is None:
        return []
    if problem.kind == "misconfigured":
        return [
            Error(
                f"AGENTMEMORY['CACHE'] is {cache[0]!r}: {problem}.",
                hint="Fix the cache's LOCATION (a database index the server has: 0-15 by "
                "default), its password or its user's rights.",
                id="agentmemory.E024",
            )
        ]
    return [
        Warning(
            f"AGENTMEMORY['CACHE'] is {cache[0]!r}: {problem}. The store works without it "
            "(every read goes to the database) until it answers.",
            hint="Start Redis, or check the cache's LOCATION.",
            id="agentmemory.W009",
        )
    ]


@register()
def check_cache_seconds(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E007: ``CACHE_FENCE_SECONDS`` and ``CACHE_MAX_ENTRY_SECONDS`` are seconds > 0."""
    config = _config()
    if config is None:
        return []
    return [
        Error(
            f"AGENTMEMORY[{name!r}] is {_type_name(config[name])}.",
            hint="Seconds > 0 (an int or a float).",
            id="agentmemory.E007",
        )
        for name in ("CACHE_FENCE_SECONDS", "CACHE_MAX_ENTRY_SECONDS")
        if not _is_number(config[name]) or not 0 < config[name] < math.inf
    ]


@register()
def check_cache_protection(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E014: the Redis tier's protection is on."""
    config = _config()
    if config is None or config["CACHE"] is None or config["CACHE_PROTECTION"] is True:
        return []
    return [
        Error(
            "AGENTMEMORY['CACHE_PROTECTION'] is not True: the Redis tier can serve an older "
            "version than an acknowledged write (after a restart, a failover, or a writer "
            "that could not reach Redis).",
            hint="Remove CACHE_PROTECTION from AGENTMEMORY (it exists for memcheck's tests).",
            id="agentmemory.E014",
        )
    ]


@register()
def check_default_ttl(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E004: ``DEFAULT_TTL`` is None or a TTL the store accepts."""
    config = _config()
    if config is None:
        return []
    try:
        check_ttl(config["DEFAULT_TTL"])
    except InvalidMemory as exc:
        return [
            Error(
                f"AGENTMEMORY['DEFAULT_TTL'] is invalid: {exc}",
                hint="Seconds > 0, or None.",
                id="agentmemory.E004",
            )
        ]
    return []


@register()
def check_max_value_bytes(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E005: ``MAX_VALUE_BYTES`` is a positive int."""
    config = _config()
    if config is None or (_is_int(config["MAX_VALUE_BYTES"]) and config["MAX_VALUE_BYTES"] >= 1):
        return []
    return [
        Error(
            f"AGENTMEMORY['MAX_VALUE_BYTES'] is {_type_name(config['MAX_VALUE_BYTES'])}.",
            hint="A positive number of bytes (an int), e.g. 1048576.",
            id="agentmemory.E005",
        )
    ]


@register()
def check_retry(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E008: ``RETRY`` is a dict of known settings."""
    user = _user()
    if not isinstance(user, Mapping) or user.get("RETRY") is None:
        return []
    retry = user["RETRY"]
    if not isinstance(retry, Mapping):
        return [
            Error(
                f"AGENTMEMORY['RETRY'] is {_type_name(retry)}; it must be a dict.",
                hint=f"A dict of {', '.join(sorted(RETRY_KEYS))}, e.g. {{'ATTEMPTS': 12}}.",
                id="agentmemory.E008",
            )
        ]
    return [
        Error(
            f"AGENTMEMORY['RETRY'] has an unknown setting {name!r}.",
            hint=f"Known settings: {', '.join(sorted(RETRY_KEYS))}.",
            id="agentmemory.E008",
        )
        for name in sorted(set(retry) - RETRY_KEYS, key=str)
    ]


@register()
def check_retry_values(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E009: the retry policy's values."""
    config = _config()
    if config is None or not isinstance(config["RETRY"], Mapping):
        return []
    retry = config["RETRY"]
    problems = []
    attempts = retry.get("ATTEMPTS")
    if not _is_int(attempts) or not 1 <= attempts <= 1000:
        problems.append(f"ATTEMPTS is {attempts!r}: an int from 1 to 1000")
    for name in ("BASE_DELAY", "MAX_DELAY"):
        delay = retry.get(name)
        if not _is_number(delay) or not 0 <= delay <= 60:
            problems.append(f"{name} is {delay!r}: seconds from 0 to 60")
    deadline = retry.get("DEADLINE")
    if deadline is not None and (not _is_number(deadline) or not 0 < deadline <= 3600):
        problems.append(f"DEADLINE is {deadline!r}: seconds from 0 to 3600, or None")
    if not isinstance(retry.get("RECONNECT"), bool):
        problems.append(f"RECONNECT is {retry.get('RECONNECT')!r}: True or False")
    return [
        Error(
            f"AGENTMEMORY['RETRY']: {problem}.",
            hint="See the RETRY defaults in the docs' Configuration page.",
            id="agentmemory.E009",
        )
        for problem in problems
    ]


@register()
def check_history_retention(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E016: the history retention policy."""
    user = _user()
    if not isinstance(user, Mapping) or user.get("HISTORY_RETENTION") is None:
        return []
    given = user["HISTORY_RETENTION"]
    hint = "KEEP_LAST (versions per memory) and KEEP_DAYS (days); None keeps everything."
    if not isinstance(given, Mapping):
        return [
            Error(
                f"AGENTMEMORY['HISTORY_RETENTION'] is {_type_name(given)}; it must be a dict.",
                hint=hint,
                id="agentmemory.E016",
            )
        ]
    problems = [
        f"unknown setting {name!r}" for name in sorted(set(given) - RETENTION_KEYS, key=str)
    ]
    keep_last = given.get("KEEP_LAST")
    keep_days = given.get("KEEP_DAYS")
    if keep_last is not None and (not _is_int(keep_last) or keep_last < 1):
        problems.append(f"KEEP_LAST is {keep_last!r}: an int >= 1, or None")
    if keep_days is not None and (not _is_number(keep_days) or not 0 < keep_days <= 36500):
        problems.append(f"KEEP_DAYS is {keep_days!r}: days from 0 to 36500, or None")
    return [
        Error(f"AGENTMEMORY['HISTORY_RETENTION']: {problem}.", hint=hint, id="agentmemory.E016")
        for problem in problems
    ]


@register()
def check_async_threads(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E018: the async twins' pool size."""
    config = _config()
    if config is None or (
        _is_int(config["ASYNC_THREADS"]) and 1 <= config["ASYNC_THREADS"] <= 1024
    ):
        return []
    return [
        Error(
            f"AGENTMEMORY['ASYNC_THREADS'] is {config['ASYNC_THREADS']!r}.",
            hint="The async twins' thread pool size: an int from 1 to 1024 (default 16); "
            "each thread holds its own database connection.",
            id="agentmemory.E018",
        )
    ]


@register()
def check_causal_reads_setting(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E022: ``CAUSAL_READS``, ``CACHE_PROTECTION``, ``OPENTELEMETRY`` and
    ``TELEMETRY_RAW_IDS`` are booleans."""
    config = _config()
    if config is None:
        return []
    return [
        Error(
            f"AGENTMEMORY[{name!r}] is {_type_name(config[name])}; it must be True or False.",
            hint=f"Remove {name} from AGENTMEMORY (its default is {DEFAULTS[name]}).",
            id="agentmemory.E022",
        )
        for name in ("CAUSAL_READS", "CACHE_PROTECTION", "OPENTELEMETRY", "TELEMETRY_RAW_IDS")
        if not isinstance(config[name], bool)
    ]


@register()
def check_search(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E019: the semantic index can be built."""
    config = _config()
    return [] if config is None else search_errors(config["SEARCH"])


@register()
def check_search_numpy(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E020: numpy, which scores the vectors, is installed when there is a semantic index."""
    config = _config()
    if config is None or not config["SEARCH"] or importlib.util.find_spec("numpy"):
        return []
    return [
        Error(
            "AGENTMEMORY['SEARCH'] is set, but numpy, which scores the vectors, is not installed.",
            hint="pip install 'django-agentmemory[search]'",
            id="agentmemory.E020",
        )
    ]


#: The settings checks, in the order ``check_settings`` runs them.
SETTINGS_CHECKS = (
    check_settings_dict,
    check_unknown_settings,
    check_retry,
    check_retry_values,
    check_history_retention,
    check_database_alias,
    check_cache_alias,
    check_cache_backend,
    check_cache_not_sharded,
    check_cache_seconds,
    check_cache_protection,
    check_causal_reads_setting,
    check_default_ttl,
    check_async_threads,
    check_search,
    check_search_numpy,
    check_max_value_bytes,
)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Every check of the ``AGENTMEMORY`` dict (each is also registered on its own)."""
    return [error for check in SETTINGS_CHECKS for error in check(app_configs, **kwargs)]


def search_errors(search: Any) -> list[Error]:
    """``AGENTMEMORY["SEARCH"]``: None, or a semantic index that can be built (E019)."""
    if search is None:
        return []
    hint = (
        'None, or {"EMBED": "myproject.embeddings.embed", "DIMS": 384, "FIELDS": ["$"], '
        '"TIMEOUT": 30, "CACHE_MB": 256, "MODEL": "all-MiniLM-L6-v2"}.'
    )
    if not isinstance(search, dict):
        return [Error(f"AGENTMEMORY['SEARCH'] is {search!r}.", hint=hint, id="agentmemory.E019")]
    problems = [f"unknown setting {name!r}" for name in sorted(set(search) - SEARCH_KEYS)]
    problems += [f"{name} is missing" for name in ("EMBED", "DIMS") if name not in search]
    if not problems:
        problems = index_problems(
            search["EMBED"],
            search["DIMS"],
            search.get("FIELDS", SEARCH_DEFAULTS["FIELDS"]),
            search.get("TIMEOUT", SEARCH_DEFAULTS["TIMEOUT"]),
        )
        megabytes = search.get("CACHE_MB", SEARCH_DEFAULTS["CACHE_MB"])
        if (
            isinstance(megabytes, bool)
            or not isinstance(megabytes, int | float)
            or not 0 <= megabytes < 1024 * 1024
        ):
            problems.append(f"CACHE_MB must be megabytes >= 0, got {megabytes!r}")
        model = search.get("MODEL")
        if model is not None and (not isinstance(model, str) or not 1 <= len(model) <= 200):
            problems.append(
                f"MODEL must be the model's name, a str of 1-200 characters, got {model!r}"
            )
    return [
        Error(f"AGENTMEMORY['SEARCH']: {problem}.", hint=hint, id="agentmemory.E019")
        for problem in problems
    ]


@register()
def check_database_options(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    config = _config()
    alias = None if config is None else config["DATABASE"]
    if not isinstance(alias, str) or alias not in settings.DATABASES:
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


@register(Tags.database)
def check_exact_columns(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Error]:
    """E023: on the MySQL family, every column that must compare byte for byte (session ids,
    keys, idempotency keys: :class:`~agentmemory.fields.ExactCharField`) has the binary NO PAD
    collation the migrations give it. A table created by hand, or converted by ``ALTER TABLE ...
    CONVERT TO CHARACTER SET``, compares ``"Req-A"``, ``"req-a"`` and ``"req-a "`` as one: two
    sessions share rows, and a write is answered with another's result."""
    messages: list[Error] = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor != "mysql":
            continue
        expected = exact_collation(connection)
        wrong = [
            (table, column, collation)
            for table, column, collation in exact_column_collations(connection)
            if collation != expected
        ]
        messages.extend(exact_column_errors(alias, expected, wrong))
    return messages


def exact_column_collations(connection: Any) -> list[tuple[str, str, str]]:
    """``(table, column, collation)`` of each exact column of the app's tables that exist on
    this MySQL-family database (none before ``migrate``)."""
    from django.apps import apps

    from .fields import ExactCharField

    wanted = {
        (model._meta.db_table, field.column)
        for model in apps.get_app_config("agentmemory").get_models()
        for field in model._meta.local_fields
        if isinstance(field, ExactCharField)
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name LIKE %s",
            ["agentmemory\\_%"],
        )
        found = cursor.fetchall()
    return sorted((t, c, coll or "") for t, c, coll in found if (t, c) in wanted)


def exact_column_errors(
    alias: str, expected: str | None, wrong: list[tuple[str, str, str]]
) -> list[Error]:
    if not wrong:
        return []
    columns = ", ".join(f"{table}.{column} ({collation})" for table, column, collation in wrong)
    statements = "; ".join(
        f"ALTER TABLE {table} MODIFY {column} ... COLLATE {expected}" for table, column, _ in wrong
    )
    return [
        Error(
            f"Database {alias!r}: columns that must compare byte for byte have a collation that "
            f"does not: {columns}. Ids and idempotency keys that differ only by case, accents "
            "or trailing spaces would be taken for one (one session reading another's memories, "
            "a write answered with another's result and never stored).",
            hint=f"Give each the collation {expected}: {statements} (the column's type and "
            "NULL-ness as they are), or create the tables with manage.py migrate.",
            id="agentmemory.E023",
        )
    ]


@register(Tags.database)
def check_packet_size(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """W008: a MySQL-family server whose ``max_allowed_packet`` is smaller than a value the
    settings allow, as sent (``MAX_VALUE_BYTES``, each byte escaped at worst to two)."""
    messages: list[Warning] = []
    for alias in databases or ():
        connection = connections[alias]
        limit = packet_limit(connection)
        if limit is not None:
            messages.extend(packet_size_warnings(alias, limit, get_config()["MAX_VALUE_BYTES"]))
    return messages


def packet_size_warnings(alias: str, limit: int, max_value_bytes: int) -> list[Warning]:
    worst = 2 * max_value_bytes + PACKET_MARGIN
    if worst <= limit:
        return []
    return [
        Warning(
            f"MySQL-family database {alias!r} takes statements of at most {limit} bytes "
            f"(max_allowed_packet), and AGENTMEMORY['MAX_VALUE_BYTES'] allows values of "
            f"{max_value_bytes} bytes, up to {worst} as sent (escaped): such a value is refused "
            "with InvalidMemory naming max_allowed_packet.",
            hint=f"Raise the server's max_allowed_packet to at least {worst}, or lower "
            "MAX_VALUE_BYTES.",
            id="agentmemory.W008",
        )
    ]


@register(Tags.database)
def check_durable_commits(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """W005-W007: server settings under which a COMMIT is acknowledged before it is durable --
    on a crash of the server, or on a failover to a standby that had not received it."""
    messages: list[Warning] = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor == "postgresql":
            synchronous_commit, standbys = postgres_durability(connection)
            multi_host = "," in str(connection.settings_dict.get("HOST") or "")
            messages.extend(
                postgres_durability_warnings(alias, synchronous_commit, multi_host, standbys)
            )
        elif flavor(connection) in ("mysql", "mariadb") and not is_galera(connection):
            messages.extend(mysql_durability_warnings(alias, *mysql_durability(connection)))
    return messages


def postgres_durability(connection: Any) -> tuple[str, list[str]]:
    """The server's ``synchronous_commit`` for new sessions (the store's own are raised at
    connect), and the ``sync_state`` of each standby streaming from it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit'")
        synchronous_commit = cursor.fetchone()[0]
        cursor.execute("SELECT sync_state FROM pg_stat_replication")
        standbys = [row[0] for row in cursor.fetchall()]
    return synchronous_commit, standbys


def postgres_durability_warnings(
    alias: str, synchronous_commit: str, multi_host: bool, standbys: list[str]
) -> list[Warning]:
    messages = []
    if synchronous_commit in ("off", "local"):
        loses = (
            "a server crash can lose the last acknowledged COMMITs"
            if synchronous_commit == "off"
            else "a failover to a synchronous standby can lose acknowledged COMMITs"
        )
        messages.append(
            Warning(
                f"PostgreSQL database {alias!r} runs synchronous_commit={synchronous_commit}: "
                f"{loses}. The store's own transactions set it to on (SET LOCAL), so memories "
                "are safe; your application's other writes on this alias are not.",
                hint="Set synchronous_commit = on (postgresql.conf, ALTER DATABASE or ALTER ROLE),"
                " or silence agentmemory.W005 if those other writes may be lost.",
                id="agentmemory.W005",
            )
        )
    if multi_host and any(state in ("async", "potential") for state in standbys):
        messages.append(
            Warning(
                f"PostgreSQL database {alias!r} lists several hosts and its primary replicates "
                f"asynchronously ({', '.join(standbys)}): a failover to a standby loses the "
                "acknowledged writes it had not received yet (Patroni bounds them by "
                "maximum_lag_on_failover). The cache tier never serves them afterwards; "
                "manage.py memcheck reports them as the database's loss.",
                hint="Replicate synchronously: Patroni's synchronous_mode: true (with "
                "synchronous_mode_strict: true to never fall back to asynchronous), or "
                "synchronous_standby_names on the primary.",
                id="agentmemory.W007",
            )
        )
    return messages


def mysql_durability(connection: Any) -> tuple[str, str, str]:
    """``innodb_flush_log_at_trx_commit``, ``sync_binlog`` and ``log_bin`` of the server."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin")
        return tuple(str(value) for value in cursor.fetchone())  # type: ignore[return-value]


def mysql_durability_warnings(
    alias: str, flush_log: str, sync_binlog: str, log_bin: str
) -> list[Warning]:
    problems = []
    if flush_log != "1":
        problems.append(
            f"innodb_flush_log_at_trx_commit={flush_log} (a crash loses up to a second of "
            "acknowledged COMMITs)"
        )
    if log_bin.upper() in ("1", "ON") and sync_binlog != "1":
        problems.append(
            f"sync_binlog={sync_binlog} (a crash can lose acknowledged COMMITs from the binary "
            "log: replicas and point-in-time recovery miss them)"
        )
    if not problems:
        return []
    return [
        Warning(
            f"MySQL-family database {alias!r} runs {'; '.join(problems)}.",
            hint="Set innodb_flush_log_at_trx_commit = 1 and sync_binlog = 1 (the servers' "
            "durable defaults).",
            id="agentmemory.W006",
        )
    ]
