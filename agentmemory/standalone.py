"""agentmemory without a Django project: one line from a database URL to a store.

    import agentmemory

    store = agentmemory.setup("sqlite:///memory.db")                   # or postgres://, mysql://
    store = agentmemory.setup("postgres://app@db/agents", cache="redis://cache:6379/0")

The first call in a process without Django settings configures a minimal Django (this app only,
``USE_TZ``), so that a LangGraph, OpenAI Agents SDK or ADK user needs no project; every call
gives its URL a database alias of its own (the same URL: the same alias), migrates it once per
process and returns a :class:`~agentmemory.MemoryStore` on it. In a Django project (settings
configured, ``DJANGO_SETTINGS_MODULE``) nothing of the project's changes: the URL's alias is
added beside its ``DATABASES``. The framework adapters take the same URLs as their peers do:
``AgentMemorySaver.from_conn_string(url)``, ``AgentMemorySession(session_id, url)``,
``AgentMemorySessionService(db_url=url)``.

URLs: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` (a file: SQLite's
``:memory:`` is a database per connection, and the store's threads each have one),
``postgres://`` or ``postgresql://`` (psycopg), ``mysql://`` or ``mariadb://`` (mysqlclient):
``scheme://user:password@host:port/name?option=value``, the query's options passed to the
driver as Django's ``OPTIONS``. Cache: ``redis://host:port/db`` or ``rediss://`` (django-redis).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from .semantic import Index
    from .store import MemoryStore

ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "mariadb": "django.db.backends.mysql",
}
#: What a SQLite database of agentmemory needs (system check W-series: BEGIN IMMEDIATE, WAL).
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL;",
}
_lock = threading.Lock()
_migrated: set[str] = set()


def setup(database: str, *, cache: str | None = None, index: Index | None = None) -> MemoryStore:
    """A :class:`~agentmemory.MemoryStore` on the database of the URL ``database`` (and the
    Redis tier of ``cache``, a ``redis://`` URL; default: none; ``index``: its semantic index),
    configuring Django first where nothing has (see the module's documentation).

    Raises ``ImproperlyConfigured`` naming what was wrong -- a URL of another scheme, without a
    database name, a driver not installed (``pip install "django-agentmemory[postgres]"``), a
    ``:memory:`` SQLite database -- before anything is configured.

    Called from a coroutine (a session made inside ``async def main()``), the configuration and
    the migration run on a thread of their own, as Django wants its database calls outside an
    event loop; the loop waits for them, once per URL and process."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _setup(database, cache, index)
    with ThreadPoolExecutor(1, thread_name_prefix="agentmemory-setup") as pool:
        return pool.submit(_setup, database, cache, index).result()


def _setup(database: str, cache: str | None, index: Index | None) -> MemoryStore:
    from django.conf import settings

    config = database_settings(database)
    cache_config = None if cache is None else cache_settings(cache)
    with _lock:
        if not settings.configured:
            settings.configure(
                INSTALLED_APPS=["agentmemory"],
                DATABASES={"default": config},
                CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
                USE_TZ=True,
                AGENTMEMORY={"DATABASE": "default", "CACHE": None},
            )
        _django_ready()
        alias = _database_alias(config)
        cache_alias = None if cache_config is None else _cache_alias(cache_config)
        if alias not in _migrated:
            from django.core.management import call_command

            call_command("migrate", "agentmemory", database=alias, verbosity=0)
            _migrated.add(alias)
    from .store import MemoryStore

    return MemoryStore(using=alias, cache=cache_alias, index=index)


def store_for(db_url: str | None, store: MemoryStore | None, **default: Any) -> MemoryStore:
    """An adapter's store: ``store``, or the one :func:`setup` gives for ``db_url``, or (neither)
    ``MemoryStore(**default)`` on the settings' database. Both given: ``InvalidMemory`` (field
    ``db_url``). The store's modules are imported after the set-up, which configures Django
    where nothing has."""
    from .errors import InvalidMemory

    if db_url is not None and store is not None:
        raise InvalidMemory("db_url", "pass a database URL or a store, not both")
    if db_url is not None:
        return setup(db_url)
    if store is not None:
        return store
    from .store import MemoryStore

    return MemoryStore(**default)


def database_settings(url: str) -> dict[str, Any]:
    """Django's settings of one database from its URL (see the module's documentation)."""
    if not isinstance(url, str):
        raise ImproperlyConfigured(
            f"database must be a URL such as 'sqlite:///memory.db', got {type(url).__name__}"
        )
    parts = urlsplit(url)
    engine = ENGINES.get(parts.scheme)
    if "://" not in url:
        raise ImproperlyConfigured(
            f"database URL {_shown(url)} has no scheme: a SQLite file is "
            f"'sqlite:///{url}', a server 'postgres://user@host/name' or 'mysql://...'"
        )
    if engine is None:
        raise ImproperlyConfigured(
            f"database URL {_shown(url)}: unknown scheme {parts.scheme!r} "
            f"(known: {', '.join(ENGINES)})"
        )
    options: dict[str, Any] = {k: _option(v) for k, v in parse_qsl(parts.query)}
    if parts.scheme == "sqlite":
        path = unquote(url.split("://", 1)[1].split("?", 1)[0])
        name = path[1:] if path.startswith("/") else path
        if name in ("", ":memory:") or "mode=memory" in parts.query:
            raise ImproperlyConfigured(
                f"database URL {_shown(url)}: a SQLite file is needed (sqlite:///memory.db); "
                "an in-memory database is one per connection, and the store's threads each "
                "open theirs"
            )
        return {"ENGINE": engine, "NAME": name, "OPTIONS": {**SQLITE_OPTIONS, **options}}
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured(f"database URL {_shown(url)}: no database name after the host")
    _driver(parts.scheme)
    if engine.endswith("mysql"):
        options = {"charset": "utf8mb4", "isolation_level": "read committed", **options}
    return {
        "ENGINE": engine,
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        "CONN_HEALTH_CHECKS": True,
    }


def cache_settings(url: str) -> dict[str, Any]:
    """django-redis' settings of the Redis tier from its URL."""
    if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss"):
        got = _shown(url) if isinstance(url, str) else type(url).__name__
        raise ImproperlyConfigured(f"cache must be a redis:// or rediss:// URL, got {got}")
    try:
        import django_redis  # noqa: F401
    except ImportError as exc:
        raise ImproperlyConfigured(
            'the Redis tier needs django-redis: pip install "django-agentmemory[redis]"'
        ) from exc
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": url,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25},
        "KEY_PREFIX": "agentmemory",
    }


def _django_ready() -> None:
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()
    if not apps.is_installed("agentmemory"):
        raise ImproperlyConfigured(
            'agentmemory is not in INSTALLED_APPS: add "agentmemory" to the project\'s settings'
        )


def _database_alias(config: dict[str, Any]) -> str:
    """The alias of these settings: one already configured with them, or a new one."""
    from django.db import DEFAULT_DB_ALIAS, connections

    wanted = _identity(config)
    for alias in connections:
        if _identity(connections.settings[alias]) == wanted:
            return alias
    alias = "agentmemory_" + hashlib.sha256(repr(wanted).encode()).hexdigest()[:10]
    # Django's defaults for the keys the URL does not set (configure_settings wants a default).
    filled = connections.configure_settings({DEFAULT_DB_ALIAS: {}, alias: dict(config)})[alias]
    connections.settings[alias] = filled
    return alias


def _cache_alias(config: dict[str, Any]) -> str:
    from django.core.cache import caches

    for alias, existing in caches.settings.items():
        if existing.get("LOCATION") == config["LOCATION"] and "redis" in existing["BACKEND"]:
            return alias
    alias = "agentmemory_" + hashlib.sha256(config["LOCATION"].encode()).hexdigest()[:10]
    caches.settings[alias] = config
    return alias


def _identity(config: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(str(config.get(k, "")) for k in ("ENGINE", "NAME", "USER", "HOST", "PORT"))


def _driver(scheme: str) -> None:
    postgres = scheme.startswith("postgres")
    module, extra = ("psycopg", "postgres") if postgres else ("MySQLdb", "mysql")
    try:
        __import__(module)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f'a {scheme}:// database needs its driver: pip install "django-agentmemory[{extra}]"'
        ) from exc


def _option(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return int(text) if text.isdigit() else text


def _shown(url: str) -> str:
    """The URL without its password, for an error message."""
    parts = urlsplit(url)
    if parts.password:
        url = url.replace(f":{parts.password}@", ":***@", 1)
    return repr(url)
