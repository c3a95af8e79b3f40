"""A tiny agent backend that keeps its agents' memory in agentmemory.

The database comes from DATABASE_URL (default: SQLite next to this file), the Redis tier from
REDIS_URL (default: none) -- so the same tests run on SQLite locally and on MySQL/MariaDB, TiDB or
PostgreSQL in CI.
"""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "agentmemory",
    "agent",
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'agent_backend.sqlite3'}")
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Writers queue on BEGIN IMMEDIATE instead of failing (agentmemory check W001).
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
    # A test database file of this run's own: a run never meets another run's file or journal.
    DATABASES["default"]["TEST"] = {
        "NAME": str(BASE_DIR / f"test_agent_backend_{os.getpid()}.sqlite3")
    }
elif DATABASES["default"]["ENGINE"].endswith("mysql"):
    # READ COMMITTED, as agentmemory recommends (check W002); utf8mb4 for any text.
    DATABASES["default"]["OPTIONS"] = {"isolation_level": "read committed", "charset": "utf8mb4"}

AGENTMEMORY = {"DATABASE": "default"}
if os.environ.get("REDIS_URL"):
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "memory": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ["REDIS_URL"],
            "KEY_PREFIX": "agent_backend",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25},
        },
    }
    AGENTMEMORY["CACHE"] = "memory"
