"""Settings of the demo/dev project. One codebase, every backend: see DATABASE_URL and REDIS_URL."""

from __future__ import annotations

import os
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "agentmemory-demo-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "agentmemory",
    "project.demo",  # manage.py demo: a superuser and sample memories for the admin
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "project.wsgi.application"

# tidb://user:password@host:4000/name selects django-tidb (dj-database-url does not know it).
dj_database_url.register("tidb", "django_tidb")(lambda parsed: None)

SQLITE_PATH = BASE_DIR / "agentmemory.sqlite3"


def database_from_url(url: str) -> dict:
    database = dj_database_url.parse(url, conn_health_checks=True)
    engine = database["ENGINE"]
    options = database.setdefault("OPTIONS", {})
    if engine.endswith("sqlite3"):
        # Writers queue on BEGIN IMMEDIATE (waiting up to `timeout` s) instead of failing on a
        # lock upgrade; WAL lets readers run beside the writer.
        options.update(
            transaction_mode="IMMEDIATE", timeout=20, init_command="PRAGMA journal_mode=WAL;"
        )
        # Tests run on a file too: threads of the concurrency tests each need their connection.
        name = Path(database["NAME"])
        database["TEST"] = {"NAME": str(name.with_name(f"test_{name.name}"))}
    elif engine.endswith("mysql") or engine == "django_tidb":
        options.update(charset="utf8mb4", isolation_level="read committed")
        database["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
    return database


def cluster_urls(url: str) -> list[str]:
    """``scheme://user@host1:port1,host2:port2,.../name?options`` (the hosts of one cluster, as
    libpq writes them) -> one URL per host, with the same user, name and options."""
    scheme, sep, rest = url.partition("://")
    if not sep or "," not in rest.split("/", 1)[0]:
        return [url]
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    return [f"{scheme}://{userinfo}{at}{host}{slash}{tail}" for host in hosts.split(",") if host]


def postgres_hosts_database(url: str) -> dict:
    """``postgres://user@h1:p1,h2:p2/name?target_session_attrs=read-write`` -> ONE alias whose
    HOST and PORT are libpq's host and port lists: psycopg tries the hosts in order and keeps the
    first that matches ``target_session_attrs`` (read-write: the primary), so after a failover a
    reconnect lands on the new primary (the local Patroni cluster: scripts/pg-ha.sh)."""
    urls = cluster_urls(url)
    database = database_from_url(urls[0])
    hosts = [dj_database_url.parse(one) for one in urls]
    database["HOST"] = ",".join(str(one["HOST"]) for one in hosts)
    database["PORT"] = ",".join(str(one["PORT"] or 5432) for one in hosts)
    return database


def databases_from_url(url: str) -> dict[str, dict]:
    """Alias ``default`` for the first host, ``node2``, ``node3``, ... for the others; a
    PostgreSQL URL of several hosts is one alias over all of them (``postgres_hosts_database``)."""
    if url.startswith(("postgres://", "postgresql://")) and len(cluster_urls(url)) > 1:
        return {"default": postgres_hosts_database(url)}
    urls = cluster_urls(url)
    aliases = ["default", *(f"node{n}" for n in range(2, len(urls) + 1))]
    databases = {alias: database_from_url(one) for alias, one in zip(aliases, urls, strict=True)}
    for alias in aliases[1:]:
        # One cluster, one test database: every node's tests run on the database the suite
        # creates through default (the cluster replicates it to every node).
        databases[alias]["TEST"] = {**databases[alias].get("TEST", {}), "MIRROR": "default"}
    return databases


DATABASES = {
    **databases_from_url(os.environ.get("DATABASE_URL") or f"sqlite:///{SQLITE_PATH}"),
    # A second database, for the tests of a store (and the admin) on another alias than default:
    # a SQLite file, OTHER_DATABASE_URL where two runs share this folder (the matrix's sessions:
    # their own, so that no run meets another's test file -- "disk I/O error").
    "other": database_from_url(
        os.environ.get("OTHER_DATABASE_URL")
        or f"sqlite:///{BASE_DIR / 'agentmemory-other.sqlite3'}"
    ),
}


def shard_urls(value: str) -> list[str]:
    """``SHARD_DATABASE_URLS``: database URLs separated by commas. A comma followed by a scheme
    (``,mysql://``) starts the next URL; the commas of a PostgreSQL URL's host list do not."""
    return [
        url.strip() for url in re.split(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)", value) if url.strip()
    ]


def shard_databases(value: str) -> dict[str, dict]:
    """One alias per shard URL: ``shard0``, ``shard1``, ... A PostgreSQL URL of several hosts is
    one alias that follows the primary (an HA cluster is one shard); a MySQL-family URL names
    one server -- of a Galera cluster, any node (each takes writes)."""
    databases = {}
    for n, url in enumerate(shard_urls(value)):
        if len(cluster_urls(url)) > 1 and not url.startswith(("postgres://", "postgresql://")):
            raise ImproperlyConfigured(
                f"SHARD_DATABASE_URLS: shard {n} ({url}) names several hosts; a MySQL-family "
                "shard is one server's URL (of a Galera cluster, one node's)"
            )
        databases[f"shard{n}"] = (
            postgres_hosts_database(url) if len(cluster_urls(url)) > 1 else database_from_url(url)
        )
    return databases


def redis_cache(url: str, sentinels: str | None = None) -> dict:
    """The cache tier's django-redis settings. ``url``: ``redis://host:port/db``; with
    ``sentinels`` (``host:port,host:port``), ``redis://<service name>/db`` of a primary that
    those Sentinels manage (django-redis' SentinelClient: it asks them where the primary is, and
    asks again after a failover)."""
    # Short timeouts: a hung Redis costs a recall at most this, then the store reads the
    # database and stops calling Redis for a moment.
    options: dict = {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25}
    if url.startswith(("redis-cluster://", "rediss-cluster://")):
        # Any node of a Redis Cluster (agentmemory.redis_cluster: redis-py's cluster client).
        options["CLIENT_CLASS"] = "agentmemory.redis_cluster.ClusterClient"
    elif sentinels:
        options.update(
            CLIENT_CLASS="django_redis.client.SentinelClient",
            CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
            SENTINELS=[
                (host, int(port))
                for host, _, port in (item.strip().rpartition(":") for item in sentinels.split(","))
            ],
        )
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": url,
        "OPTIONS": options,
        "KEY_PREFIX": "demo",
    }


# REDIS_URL=redis://127.0.0.1:6379/0, or with REDIS_SENTINELS=127.0.0.1:26379,127.0.0.1:26380
# REDIS_URL=redis://mymaster/0 (the service name the Sentinels monitor), or
# REDIS_URL=redis-cluster://127.0.0.1:7000 (any node of a Redis Cluster).
REDIS_URL = os.environ.get("REDIS_URL")
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if REDIS_URL:
    CACHES["agentmemory"] = redis_cache(REDIS_URL, os.environ.get("REDIS_SENTINELS"))

# SHARD_DATABASE_URLS=URL0,URL1,...: sessions sharded over these databases (aliases shard0,
# shard1, ...; agentmemory.ShardedStore, docs/scaling.md). Each is migrated on its own:
# `manage.py migrate --database shard0`, and so on.
SHARDS = shard_databases(os.environ.get("SHARD_DATABASE_URLS", ""))
DATABASES.update(SHARDS)

AGENTMEMORY = {
    "DATABASE": "default",
    "CACHE": "agentmemory" if REDIS_URL else None,
    "SHARDS": list(SHARDS) or None,
}

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"agentmemory": {"handlers": ["console"], "level": "WARNING"}},
}
