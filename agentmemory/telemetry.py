"""OpenTelemetry traces and metrics of the store, when ``opentelemetry-api`` is installed and the
application has configured OpenTelemetry (``pip install ".[otel]"``): nothing is imported, and
nothing paid, otherwise.

Each public call of :class:`~agentmemory.MemoryStore` is a span ``agentmemory.<operation>``,
and each call on the checkpoint chains (the LangGraph saver's ``put``, ``put_writes``,
``get_tuple``, ``list``, ``delete_thread``...) a span ``agentmemory.checkpoint.<operation>``
(kind CLIENT, a child of the caller's span -- the async twins' too: their thread runs in a copy
of the caller's context), with OpenTelemetry's database attributes (``db.system.name``,
``db.operation.name``, ``db.namespace``: the alias) and agentmemory's: the session and key as
keyed hashes (``agentmemory.session_id.hash``, ``agentmemory.key.hash``,
``agentmemory.thread_id.hash``; the raw values only with
``AGENTMEMORY["TELEMETRY_RAW_IDS"]``: they are personal data in most agent products), the version
written or read, where a recall was served from (``agentmemory.read.source``: cache or
database), a replay, a conflict.

Metrics (the meter ``agentmemory``):

- ``agentmemory.operation.duration`` (histogram, s): by ``db.operation.name`` and
  ``agentmemory.outcome`` (ok, conflict, error);
- ``agentmemory.conflicts`` (counter): compare-and-set and checkpoint conflicts, by operation;
- ``agentmemory.retries`` (counter): transient errors the store retried, by ``agentmemory.cause``
  (``conflict``: a deadlock, a serialization failure, a lock wait timeout; ``disconnect``);
- ``agentmemory.replays`` (counter): calls answered from an earlier one (an idempotency key);
- ``agentmemory.cache.events`` (counter): the Redis tier's hits, misses, fills, stale
  rejections, fence renewals, pending invalidations, by ``agentmemory.event``;
- ``agentmemory.cache.pending_invalidations`` (gauge, keys) and
  ``agentmemory.cache.pending_invalidations.oldest_age`` (gauge, s): what writers left for the
  tier to replay, read from the database when the metric reader collects.

Spans and metrics are made only while a tracer or meter provider is set (``set_tracer_provider``,
``set_meter_provider``, or the OpenTelemetry distro): with the API installed and nothing set,
each call pays one check. ``AGENTMEMORY["OPENTELEMETRY"] = False`` turns both off."""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

from . import __version__
from .conf import get_config
from .errors import CheckpointConflict, VersionConflict

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.metrics import _internal as _metrics_state
except ImportError:  # the extra is not installed: the store is not wrapped at all
    _trace = None  # type: ignore[assignment]
    _metrics = None  # type: ignore[assignment]
    _metrics_state = None  # type: ignore[assignment]

F = TypeVar("F", bound=Callable[..., Any])
#: What a call's first arguments are, by default (its ids: hashed unless TELEMETRY_RAW_IDS).
SESSION = ("session_id",)
KEYED = ("session_id", "key")
THREAD = ("thread_id",)
_VENDORS = {"sqlite": "sqlite", "postgresql": "postgresql", "mysql": "mysql"}


class _Instruments:
    """The tracer and the meter's instruments, made once per provider pair."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        self.providers = (tracer_provider, meter_provider)
        self.tracer = tracer_provider.get_tracer("agentmemory", __version__)
        meter = meter_provider.get_meter("agentmemory", __version__)
        self.duration = meter.create_histogram(
            "agentmemory.operation.duration", unit="s", description="a store call's duration"
        )
        self.conflicts = meter.create_counter(
            "agentmemory.conflicts", unit="{conflict}", description="compare-and-set conflicts"
        )
        self.retries = meter.create_counter(
            "agentmemory.retries", unit="{retry}", description="transient errors retried"
        )
        self.replays = meter.create_counter(
            "agentmemory.replays", unit="{call}", description="calls answered from an earlier one"
        )
        self.cache_events = meter.create_counter(
            "agentmemory.cache.events", unit="{event}", description="the Redis tier's events"
        )
        meter.create_observable_gauge(
            "agentmemory.cache.pending_invalidations",
            callbacks=[_pending_count],
            unit="{key}",
            description="keys a writer could not update in Redis, to replay before it is trusted",
        )
        meter.create_observable_gauge(
            "agentmemory.cache.pending_invalidations.oldest_age",
            callbacks=[_pending_age],
            unit="s",
            description="the age of the oldest pending invalidation (0 when none)",
        )


def _pending(index: int) -> list[Any]:
    """The pending invalidations of the configured database, read when the metric reader
    collects (its own thread, its own connection): [count, oldest age]'s ``index``. Nothing when
    the tier is off or the database cannot answer -- a gauge reports what it knows."""
    from django.db import DatabaseError

    from .health import pending

    config = get_config()
    if config["CACHE"] is None:
        return []
    using = config["DATABASE"]
    try:
        found = pending(using)
    except DatabaseError:
        return []
    return [_metrics.Observation(found[index], {"db.namespace": using})]


def _pending_count(_options: Any) -> list[Any]:
    return _pending(0)


def _pending_age(_options: Any) -> list[Any]:
    return _pending(1)


_instruments: _Instruments | None = None
_chosen: tuple[Any, Any] | None = None


def configure(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Use these providers instead of OpenTelemetry's global ones (a test's in-memory exporter
    and reader, an application that keeps agentmemory's telemetry apart); with neither, go
    back to the global ones."""
    global _chosen
    if tracer_provider is None and meter_provider is None:
        _chosen = None
        return
    if _trace is None or _metrics is None:
        raise ImportError("opentelemetry-api is not installed: pip install '.[otel]'")
    _chosen = (
        tracer_provider or _trace.NoOpTracerProvider(),
        meter_provider or _metrics.NoOpMeterProvider(),
    )


def _active() -> _Instruments | None:
    """The instruments, if OpenTelemetry is configured and not turned off; else None."""
    global _instruments
    if _trace is None or _metrics is None:
        return None
    if _chosen is not None:
        tracer_provider, meter_provider = _chosen
    else:
        if not _globally_set():
            return None  # nothing configured: no span, no metric
        tracer_provider = _trace.get_tracer_provider()
        meter_provider = _metrics.get_meter_provider()
    if not get_config()["OPENTELEMETRY"]:
        return None
    if _instruments is None or _instruments.providers != (tracer_provider, meter_provider):
        _instruments = _Instruments(tracer_provider, meter_provider)
    return _instruments


def tracer() -> Any:
    """The tracer of agentmemory's spans while OpenTelemetry is configured (None otherwise):
    for what records spans of its own, memcheck's run."""
    found = _active()
    return None if found is None else found.tracer


def _globally_set() -> bool:
    """Whether the application set a global tracer or meter provider. OpenTelemetry's
    ``get_tracer_provider()`` costs 1.7 us a call here (it looks the environment up each time);
    the API's own record of a provider set is a module attribute (a set provider is never
    unset). Where a future API lacks it, the public calls decide."""
    tracer_set = getattr(_trace, "_TRACER_PROVIDER", _MISSING)
    meter_set = getattr(_metrics_state, "_METER_PROVIDER", _MISSING)
    if tracer_set is _MISSING or meter_set is _MISSING:
        return not (
            isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)
            and type(_metrics.get_meter_provider()).__name__.startswith("_Proxy")
        )
    return tracer_set is not None or meter_set is not None


_MISSING = object()


def instrumented(operation: str, ids: tuple[str, ...] = SESSION) -> Callable[[F], F]:
    """A method of an object with a database alias (``using``: the store, the checkpoint
    chains) as the span ``agentmemory.<operation>`` and its duration; ``ids`` names its first
    positional arguments (``agentmemory.<name>.hash`` each). The method itself where
    OpenTelemetry is not installed."""

    def decorate(method: F) -> F:
        if _trace is None:
            return method

        @functools.wraps(method)
        def wrapper(store: Any, *args: Any, **kwargs: Any) -> Any:
            found = _active()
            if found is None:
                return method(store, *args, **kwargs)
            return _traced(found, operation, ids, method, store, args, kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def _traced(
    found: _Instruments,
    operation: str,
    ids: tuple[str, ...],
    method: Callable[..., Any],
    store: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    from django.db import connections

    attributes: dict[str, Any] = {
        "db.system.name": _VENDORS.get(connections[store.using].vendor, "other_sql"),
        "db.operation.name": operation,
        "db.namespace": store.using,
    }
    raw = get_config()["TELEMETRY_RAW_IDS"]
    for name, value in zip(ids, args, strict=False):
        if isinstance(value, str):
            if raw:
                attributes[f"agentmemory.{name}"] = value
            else:
                attributes[f"agentmemory.{name}.hash"] = keyed_hash(value)
    outcome = "ok"
    started = time.perf_counter()
    with found.tracer.start_as_current_span(
        f"agentmemory.{operation}", kind=_trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        try:
            result = method(store, *args, **kwargs)
        except (VersionConflict, CheckpointConflict):
            outcome = "conflict"
            span.set_attribute("agentmemory.conflict", True)
            found.conflicts.add(1, {"db.operation.name": operation})
            raise
        except BaseException:
            outcome = "error"
            raise
        finally:
            found.duration.record(
                time.perf_counter() - started,
                {"db.operation.name": operation, "agentmemory.outcome": outcome},
            )
        described = _described(found, operation, store, result)
        if described:
            span.set_attributes(described)  # at once: each attribute set takes the span's lock
        return result


def _described(found: _Instruments, operation: str, store: Any, result: Any) -> dict[str, Any]:
    """What the call returned, as the span's attributes."""
    described: dict[str, Any] = {}
    version = getattr(result, "version", None)
    if isinstance(version, int):
        described["agentmemory.version"] = version
    if getattr(result, "replayed", False):
        described["agentmemory.replayed"] = True
        found.replays.add(1, {"db.operation.name": operation})
    if isinstance(result, bool):
        described["agentmemory.changed"] = result
    elif isinstance(result, list | dict):
        described["agentmemory.count"] = len(result)
    if operation in ("recall", "recall_many") and hasattr(store, "last_read_source"):
        described["agentmemory.read.source"] = store.last_read_source or "none"
    return described


def keyed_hash(value: str) -> str:
    """A session id or a key as a span shows it: HMAC-SHA256 under the project's
    ``SECRET_KEY``, 16 hex digits -- the same value gives the same hash (a trace can be followed
    across calls), and the hash does not give the value back. Without a ``SECRET_KEY``
    (``agentmemory.setup()`` outside a project), under a random key of the process: the same
    value hashes alike within the process only."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        secret = str(settings.SECRET_KEY)
    except ImproperlyConfigured:  # Django refuses an empty SECRET_KEY when it is read
        secret = ""
    return _keyed_hash(secret or _PROCESS_KEY, value)


#: The key of the hashes where the project has no SECRET_KEY: never a constant, which would let
#: anyone hash candidate ids and match them.
_PROCESS_KEY = secrets.token_hex(32)


@functools.lru_cache(maxsize=4096)
def _keyed_hash(secret: str, value: str) -> str:
    return hmac.new(secret.encode(), value.encode(), hashlib.sha256).hexdigest()[:16]


def retried(cause: str) -> None:
    """A transient error the store retried (retries.Retrier)."""
    found = _active()
    if found is not None:
        found.retries.add(1, {"agentmemory.cause": cause})


def cache_event(event: str, n: int = 1) -> None:
    """An event of the Redis tier (cache.MemoryCache.count)."""
    found = _active()
    if found is not None:
        found.cache_events.add(n, {"agentmemory.event": event})
