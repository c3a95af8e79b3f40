"""A django-redis client for Redis Cluster, through redis-py's own cluster client.

django-redis has no cluster client (django-redis #208); its clients are pluggable, and this one
is django-redis' ``DefaultClient`` with the connection made by redis-py's
:class:`redis.cluster.RedisCluster` (which follows ``MOVED``/``ASK`` redirections, learns the
slots from any node and again after a failover). The cache tier keeps every name of one session
in one hash slot (:mod:`agentmemory.cache`), so its scripts and its warm ``MGET`` never cross
slots::

    CACHES["agentmemory"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        # Any nodes (more than one: the client starts while one is down); rediss-cluster:// for TLS.
        "LOCATION": "redis-cluster://10.0.0.1:6379,10.0.0.2:6379",
        "OPTIONS": {"CLIENT_CLASS": "agentmemory.redis_cluster.ClusterClient"},
    }

Django's own cache calls work too; those of several keys (``get_many``, ``delete_many``) are
split by slot, so they are not atomic across slots. A cluster has one database: no ``/db`` in
the location.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from django_redis.client import DefaultClient

SCHEMES = {"redis-cluster": "redis", "rediss-cluster": "rediss"}


def cluster_url(location: str) -> str:
    """``redis-cluster://host:port`` as the ``redis://`` URL redis-py's cluster client takes.
    Raises ``ImproperlyConfigured`` naming what is wrong: another scheme, no port, a database
    index (a cluster has database 0 only)."""
    parts = urlsplit(location.strip())
    if parts.scheme not in SCHEMES:
        raise ImproperlyConfigured(
            f"Redis Cluster location {location!r}: the scheme must be one of "
            f"{', '.join(s + '://' for s in SCHEMES)}"
        )
    if not parts.hostname or parts.port is None:
        raise ImproperlyConfigured(
            f"Redis Cluster location {location!r}: name one node as host:port"
        )
    if parts.path not in ("", "/", "/0"):
        raise ImproperlyConfigured(
            f"Redis Cluster location {location!r}: a cluster has database 0 only "
            f"(drop {parts.path!r})"
        )
    return parts._replace(scheme=SCHEMES[parts.scheme], path="").geturl()


def startup_nodes(locations: list[str]) -> tuple[str, list[tuple[str, int]]]:
    """The first location as redis-py's URL, and every node named (``host:port`` after the
    first: django-redis splits ``LOCATION`` on commas)."""
    first = cluster_url(locations[0])
    nodes = []
    for location in locations:
        location = location.strip()
        if "://" not in location:
            location = f"{urlsplit(locations[0].strip()).scheme}://{location}"
        parts = urlsplit(cluster_url(location))
        nodes.append((parts.hostname or "", int(parts.port or 0)))
    return first, nodes


class ClusterClient(DefaultClient):
    """django-redis' client on Redis Cluster (``OPTIONS["CLIENT_CLASS"]``). Takes
    ``SOCKET_CONNECT_TIMEOUT``, ``SOCKET_TIMEOUT`` and ``PASSWORD`` from ``OPTIONS`` (or the
    password from the location); ``CLUSTER_OPTIONS``, a dict, goes to ``RedisCluster`` as it
    is. Every node of ``LOCATION`` is a startup node: the client starts while one of them is
    down."""

    def get_client(self, write: bool = True, tried: Any = None) -> Any:
        if self._clients[0] is None:
            self._clients[0] = self.connect(0)
        return self._clients[0]

    def get_client_with_index(self, write: bool = True, tried: Any = None) -> tuple[Any, int]:
        return self.get_client(write), 0

    def connect(self, index: int = 0) -> Any:
        from redis.cluster import ClusterNode, RedisCluster

        options = self._options
        kwargs: dict[str, Any] = {}
        for setting, name in (
            ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout"),
            ("SOCKET_TIMEOUT", "socket_timeout"),
            ("PASSWORD", "password"),
        ):
            if options.get(setting) is not None:
                kwargs[name] = options[setting]
        kwargs.update(options.get("CLUSTER_OPTIONS") or {})
        url, nodes = startup_nodes(list(self._server))
        kwargs.setdefault("startup_nodes", [ClusterNode(host, port) for host, port in nodes])
        return RedisCluster.from_url(url, **kwargs)

    def disconnect(self, index: int = 0, client: Any = None) -> None:
        if client is None:
            client = self._clients[index]
        if client is not None:
            client.close()

    def get_many(self, keys: Any, version: int | None = None, client: Any = None) -> dict:
        """Django's ``get_many``, split by slot (``MGET`` of one slot per node)."""
        if client is None:
            client = self.get_client(write=False)
        if not keys:
            return {}
        names = {self.make_key(k, version=version): k for k in keys}
        values = client.mget_nonatomic(list(names))
        return {
            names[name]: self.decode(value)
            for name, value in zip(names, values, strict=True)
            if value is not None
        }
