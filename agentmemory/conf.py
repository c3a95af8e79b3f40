"""The ``AGENTMEMORY`` settings dict, merged over documented defaults.

Read it through :func:`get_config`; the result is cached and cleared whenever Django's
``setting_changed`` signal fires for ``AGENTMEMORY`` (so ``override_settings`` works in tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # Database alias the store uses unless MemoryStore(using=...) says otherwise.
    "DATABASE": "default",
    # The database aliases ShardedStore places sessions over (agentmemory.sharding), or None.
    "SHARDS": None,
    # Cache alias of the cache tier (django-redis), or None for no cache tier.
    "CACHE": None,
    # TTL applied when a write passes ttl=None: None means "never expires".
    "DEFAULT_TTL": None,
    # Cache tier: how long readers trust Redis without re-checking the database for writes that
    # could not reach it (a writer that could not update Redis waits this long before it
    # acknowledges), and the longest an entry lives in Redis.
    "CACHE_FENCE_SECONDS": 1.0,
    "CACHE_MAX_ENTRY_SECONDS": 3600,
    # On a MariaDB Galera Cluster node, make the reads of the store's connections causal
    # (wsrep_sync_wait): a write acknowledged by another node is never missed. Turning it off
    # breaks read-after-write across nodes (system check E013); it exists for memcheck's tests.
    "CAUSAL_READS": True,
    # The Redis tier's protection against serving an older version than an acknowledged write:
    # entries bound to the Redis server process that stored them, tombstones before a commit,
    # pending invalidations and the fence wait. Off only to show that memcheck catches what it
    # prevents (system check E014).
    "CACHE_PROTECTION": True,
    # History retention, applied by `manage.py prunehistory` / `store.prune_history()`: keep the
    # newest KEEP_LAST versions of each memory and/or those younger than KEEP_DAYS days (a
    # version is kept if either rule keeps it; the newest is always kept). None: keep everything.
    "HISTORY_RETENTION": {"KEEP_LAST": None, "KEEP_DAYS": None},
    # Largest encoded JSON value accepted, in bytes.
    "MAX_VALUE_BYTES": 1024 * 1024,
    # Deadlocks, serialization failures, lock timeouts and lost connections are retried
    # with jittered exponential backoff: attempt n waits random(0, min(MAX_DELAY, BASE_DELAY*2**n)).
    # RECONNECT: a lost connection is reopened and the call retried (False: it fails at once;
    # memcheck's tests use it to show that the connection-kill fault bites). DEADLINE: seconds
    # one call may spend, lock waits and retries included, before MemoryUnavailable (None: no
    # limit but ATTEMPTS). With a deadline, conflicts (deadlocks, serialization failures, Galera
    # certification conflicts: contention) are retried until it passes, whatever ATTEMPTS
    # says; ATTEMPTS bounds lost connections. A connection's lock wait is bounded by it at connect (SQLite's busy
    # timeout, MySQL's innodb_lock_wait_timeout, PostgreSQL's lock_timeout, unless already
    # shorter), and each retry's lock wait by what is left of it.
    "RETRY": {
        "ATTEMPTS": 12,
        "BASE_DELAY": 0.005,
        "MAX_DELAY": 0.5,
        "RECONNECT": True,
        "DEADLINE": 30.0,
    },
    # The async twins (aremember, arecall, ..., the LangGraph adapter's abatch) run the store's
    # calls on a pool of this many threads, each with its own database connections: at most
    # this many connections per database for all async callers of the process together.
    "ASYNC_THREADS": 16,
    # Semantic recall (MemoryStore.search): None, or {"EMBED": a callable list[str] ->
    # list[list[float]], a LangChain Embeddings or the dotted path of one, "DIMS": the vectors'
    # length, "FIELDS": JSON paths of a value to embed (default ["$"], the whole value),
    # "TIMEOUT": seconds an embedder call may take (default 30; None: no limit), "CACHE_MB": the
    # process's cache of vectors by name (default 256; 0: none), "MODEL": the embedding model's
    # name (default: the embedder's own), stored with every vector: a search compares only
    # vectors of its own model, and `manage.py reindex` embeds the others again}.
    "SEARCH": None,
    # OpenTelemetry spans and metrics of every store call, where opentelemetry-api is installed
    # and a tracer or meter provider is set (agentmemory.telemetry); False: none.
    "OPENTELEMETRY": True,
    # Spans show session ids and keys as keyed hashes (they are personal data in most agent
    # products); True: as they are.
    "TELEMETRY_RAW_IDS": False,
}

#: What an ``AGENTMEMORY["SEARCH"]`` dict that names an embedder gets for the keys it leaves out
#: (``EMBED`` and ``DIMS`` have no default: they are the index).
SEARCH_DEFAULTS: dict[str, Any] = {"FIELDS": ["$"], "TIMEOUT": 30.0, "CACHE_MB": 256, "MODEL": None}
SEARCH_KEYS = frozenset({"EMBED", "DIMS", *SEARCH_DEFAULTS})
RETRY_KEYS = frozenset(DEFAULTS["RETRY"])
RETENTION_KEYS = frozenset(DEFAULTS["HISTORY_RETENTION"])


@cache
def get_config() -> dict[str, Any]:
    """The settings, merged over :data:`DEFAULTS` (``RETRY``, ``HISTORY_RETENTION`` over theirs,
    and a ``SEARCH`` dict over :data:`SEARCH_DEFAULTS`). Settings of the wrong type are not read here: the system checks name each one
    (agentmemory.E021, E008, E016...), and this never raises."""
    user = getattr(settings, "AGENTMEMORY", {}) or {}
    if not isinstance(user, Mapping):
        user = {}
    config = {**DEFAULTS, **user}
    for name in ("RETRY", "HISTORY_RETENTION"):
        given = user.get(name) or {}
        config[name] = {**DEFAULTS[name], **(given if isinstance(given, Mapping) else {})}
    search = config["SEARCH"]
    if isinstance(search, Mapping) and search:
        config["SEARCH"] = {**SEARCH_DEFAULTS, **search}
    return config


@receiver(setting_changed)
def _reset_config(*, setting: str, **kwargs: Any) -> None:
    if setting == "AGENTMEMORY":
        get_config.cache_clear()
