"""Settings of the benchmark process: the demo project's, with one alias per backend (each on a
database of its own, ``agentmemory_bench``) and the Redis tier on database 13."""

import os

import dj_database_url

from project.settings import *  # noqa: F403

from project.settings import BASE_DIR, CACHES  # isort: skip

OUT = BASE_DIR / "out"
OUT.mkdir(exist_ok=True)

URLS = {
    "sqlite": os.environ.get("BENCH_SQLITE_URL", f"sqlite:///{OUT / 'bench.sqlite3'}"),
    "mariadb": os.environ.get("BENCH_MARIADB_URL", "mysql://root@127.0.0.1:3306/agentmemory_bench"),
    "postgres": os.environ.get(
        "BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/agentmemory_bench"
    ),
}
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")

DATABASES = {alias: dj_database_url.parse(url) for alias, url in URLS.items()}
# The same PostgreSQL database with psycopg's prepared statements, as Django enables them
# (server-side binding, then a statement is prepared on its 5th run on a connection); Django's
# default (client-side binding, never prepared) keeps connection poolers in transaction mode
# working, so it is the default alias above.
DATABASES["postgres+prepared"] = {
    **DATABASES["postgres"],
    "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5},
}
DATABASES["default"] = DATABASES["sqlite"]
DATABASES["sqlite"]["OPTIONS"] = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL;",
}
DATABASES["mariadb"]["OPTIONS"] = {"isolation_level": "read committed", "charset": "utf8mb4"}
DEBUG = False
CACHES = {
    **CACHES,
    "agentmemory": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "bench",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25},
    },
}
AGENTMEMORY = {"DATABASE": "sqlite", "CACHE": None}
# Shards for bench/sharding.py: three more databases of each kind (shard 0 is the alias itself).
for _n in range(1, 4):
    DATABASES[f"sqlite-shard{_n}"] = {
        **DATABASES["sqlite"],
        "NAME": str(OUT / f"bench-shard{_n}.sqlite3"),
    }
    DATABASES[f"postgres-shard{_n}"] = {
        **DATABASES["postgres"],
        "NAME": f"agentmemory_bench_shard{_n}",
    }
