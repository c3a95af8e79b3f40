"""One memcheck run: workload (threads, optionally in several processes) under optional faults,
healing and final reads, then the checks."""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from django.conf import settings
from django.db import connections
from django.db.models import Q
from django.test.utils import override_settings

from .. import clock
from ..cache import is_cluster_alias
from ..conf import get_config
from ..defects import NONE as NO_DEFECTS
from ..defects import Defect, Defects
from ..models import Memory
from ..store import MemoryStore
from . import semantic, traces
from .adk import delete_apps, load_apps
from .bootstrap import setup_process
from .checker import Anomaly
from .checkpoints import delete_threads, load_chains
from .faults import (
    CLIENT_TIMEOUT_SECONDS,
    LOCAL_FAULTS,
    NODE_FAULTS,
    FaultsUnavailable,
    Nemesis,
    fault_kinds,
)
from .history import History, Operation
from .logs import load_logs
from .nodes import client_timeouts
from .pg_failover import Failover, TimelineWatch
from .recorded import Final
from .redis_servers import ClusterGroup, SentinelGroup
from .state import cached_entries, duplicate_keys, load_state
from .workloads import (
    WorkloadConfig,
    final_reads,
    new_run_id,
    run_workload,
    session_ids,
    warm_up,
)


@dataclass(kw_only=True)
class RunResult:
    run_id: str
    database: str
    vendor: str
    unsafe: bool
    config: WorkloadConfig
    history: History
    anomalies: list[Anomaly]
    seconds: float
    #: What the checks compared the history with (saved with it: ``memcheck --check``).
    final: Final = field(default_factory=Final)
    retries: dict[str, int] = field(default_factory=dict)
    cache_stats: dict[str, int] = field(default_factory=dict)
    faults: str = "none"
    faults_injected: dict[str, int] = field(default_factory=dict)
    #: Judged with ``--strict``: refusals no injected fault explains are anomalies (``refusal``).
    strict: bool = False
    #: Each fault injected: (kind, started, ended), POSIX seconds in the history's clock.
    fault_windows: list[tuple[str, float, float]] = field(default_factory=list)
    fault_errors: list[str] = field(default_factory=list)
    #: With cache faults: the Redis memcheck started for the run (the project's was not touched).
    redis: str = ""

    @property
    def latencies(self) -> dict[str, dict[str, float]]:
        """Milliseconds per completed operation, by kind: p50/p95/p99/max."""
        spans: dict[str, list[float]] = {}
        for op in self.history.operations:
            if op.completed_at is not None and op.client != "final":
                spans.setdefault(op.kind, []).append((op.completed_at - op.invoked_at) * 1000)
        return {kind: percentiles(values) for kind, values in sorted(spans.items())}

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        """Per node (database alias) of a cluster run: its operations by status, and the
        milliseconds per completed operation (p50/p95/p99/max over every kind)."""
        by_node: dict[str, dict[str, Any]] = {}
        spans: dict[str, list[float]] = {}
        for op in self.history.operations:
            if op.node is None:
                continue
            entry = by_node.setdefault(op.node, {"ok": 0, "fail": 0, "info": 0})
            entry[op.status or "info"] = entry.get(op.status or "info", 0) + 1
            if op.completed_at is not None and op.client != "final":
                spans.setdefault(op.node, []).append((op.completed_at - op.invoked_at) * 1000)
        for node, entry in by_node.items():
            entry["latency_ms"] = percentiles(spans.get(node, [0.0]))
        return dict(sorted(by_node.items()))

    @property
    def counts(self) -> dict[str, Counter[str]]:
        counts: dict[str, Counter[str]] = {}
        for op in self.history.operations:
            counts.setdefault(op.kind, Counter())[op.status or "?"] += 1
        return counts

    @property
    def raised(self) -> Counter[str]:
        """The calls that raised to their caller without an answer (MemoryUnavailable, a
        database error): by error class and cause. Not anomalies -- the store said it could not
        -- but a run where many did proves little, so the report says how many and why."""
        causes: Counter[str] = Counter()
        for op in self.history.operations:
            if op.status == "info" and op.error and op.client != "final":
                kind = op.error.split(":", 1)[0]
                cause = op.error.rsplit(": ", 1)[-1].strip()
                causes[f"{kind}: {cause[:100]}"] += 1
        return causes

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "database": self.database,
            "vendor": self.vendor,
            "unsafe": self.unsafe,
            "config": asdict(self.config),
            "seconds": round(self.seconds, 3),
            "operations": len(self.history.operations),
            "ops_per_second": round(len(self.history.operations) / self.seconds, 1)
            if self.seconds
            else None,
            "counts": {kind: dict(c) for kind, c in sorted(self.counts.items())},
            "latency_ms": self.latencies,
            "nodes": self.nodes,
            "retries": self.retries,
            "raised": dict(self.raised.most_common()),
            "strict": self.strict,
            "cache": self.cache_stats,
            "faults": {
                "mode": self.faults,
                "injected": self.faults_injected,
                "errors": self.fault_errors,
                "redis": self.redis,
                # Every failover of the database during the run, injected or not (POSIX times).
                "failovers": [asdict(f) for f in self.final.failovers],
            },
            "anomalies": [a.as_dict() for a in self.anomalies],
        }


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": at(1.0)}


def make_store(database: str, unsafe: bool, defects: Iterable[Defect] = ()) -> MemoryStore:
    # The configured cache tier included: memcheck checks what the application will run. The
    # unlocked demo path runs without it, so what it finds is the missing lock alone. ``defects``:
    # a self-test variant (agentmemory.defects).
    # The search workload's index is memcheck's own (semantic.memcheck_index), not the project's.
    index = semantic.memcheck_index() if semantic.available() else None
    if unsafe:
        return MemoryStore(using=database, cache=None, row_lock=False, index=index)
    return MemoryStore(using=database, defects=defects, index=index)


OWN_REDIS_ALIAS = "memcheck-redis"
#: Options of the project's cache that name its servers: memcheck's own Redis replaces them.
SERVER_OPTIONS = ("CLIENT_CLASS", "CONNECTION_FACTORY", "SENTINELS", "SENTINEL_KWARGS")


@contextmanager
def own_redis(kinds: tuple[str, ...]) -> Iterator[SentinelGroup | ClusterGroup | None]:
    """With cache faults: a Redis of memcheck's own for the run (a primary, a replica, three
    sentinels on free loopback ports, in a temporary folder; a Redis Cluster of three primaries
    and three replicas when the project's cache is a cluster), and the cache tier pointed at it
    with the project's cache options -- so that no fault ever touches the project's Redis."""
    if not any(kind.startswith("cache-") for kind in kinds):
        yield None
        return
    alias = get_config()["CACHE"]
    user = settings.CACHES[alias]
    options = {k: v for k, v in (user.get("OPTIONS") or {}).items() if k not in SERVER_OPTIONS}
    with tempfile.TemporaryDirectory(prefix="memcheck-redis-") as folder:
        group: SentinelGroup | ClusterGroup
        if is_cluster_alias(alias):
            group = ClusterGroup(Path(folder))
            options.update(CLIENT_CLASS="agentmemory.redis_cluster.ClusterClient")
        else:
            group = SentinelGroup(Path(folder), down_after_ms=3000)
        with group:
            if isinstance(group, ClusterGroup):
                location = group.url
            else:
                location = f"redis://{group.NAME}/0"
                options.update(
                    CLIENT_CLASS="django_redis.client.SentinelClient",
                    CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
                    SENTINELS=group.addresses,
                )
            cache = {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": location,
                "OPTIONS": options,
                "KEY_PREFIX": "memcheck",
            }
            with override_settings(
                CACHES={**settings.CACHES, OWN_REDIS_ALIAS: cache},
                AGENTMEMORY={**getattr(settings, "AGENTMEMORY", {}), "CACHE": OWN_REDIS_ALIAS},
            ):
                yield group


def _process_main(
    database: str,
    unsafe: bool,
    run_id: str,
    config: WorkloadConfig,
    index: int,
    kinds: tuple[str, ...],
    defects: tuple[str, ...] = (),
) -> tuple[list[dict], dict, dict, list[str], list[tuple[str, float, float]]]:
    """One ``--processes`` process: its workers all on ``database`` (its node)."""
    store = make_store(database, unsafe, Defects(defects))
    local = [kind for kind in kinds if kind in LOCAL_FAULTS]
    sessions = session_ids(run_id, config)
    warm_up(config)
    with Nemesis(
        database, store.cache, local, sessions=sessions, seed=config.seed + index
    ) as nemesis:
        history = run_workload(store, run_id, config, client_prefix=f"p{index}-t")
    return (
        [asdict(op) for op in history.operations],
        dict(store.retries),
        dict(nemesis.counts),
        nemesis.errors,
        nemesis.windows,
    )


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line every ``every``
    seconds otherwise (CI logs)."""

    WIDTH = 30

    def __init__(
        self,
        total: int | None,
        seconds: float | None,
        stream: TextIO = sys.stderr,
        every: float = 2.0,
    ) -> None:
        self.done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._total, self._seconds, self._stream = total, seconds, stream
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._every = 0.2 if self._tty else every
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def tick(self) -> None:
        with self._lock:
            self.done += 1

    def line(self) -> str:
        elapsed = time.monotonic() - self._started
        if self._total:
            fraction = self.done / self._total
        elif self._seconds:
            fraction = elapsed / self._seconds
        else:
            fraction = 0.0
        fraction = min(1.0, fraction)
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        goal = f"/{self._total}" if self._total else ""
        rate = self.done / elapsed if elapsed else 0
        return (
            f"memcheck [{bar}] {fraction:4.0%} {self.done}{goal} ops, {rate:.0f}/s, {elapsed:.0f}s"
        )

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            self._draw()

    def _draw(self, end: str = "") -> None:
        if self._tty:
            self._stream.write("\r" + self.line() + end)
        else:
            self._stream.write(self.line() + "\n")
        self._stream.flush()

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._draw("\n")


def run_memcheck(
    databases: str | Sequence[str],
    config: WorkloadConfig,
    *,
    processes: int = 0,
    unsafe: bool = False,
    keep: bool = False,
    faults: str = "none",
    progress: Progress | None = None,
    defects: Iterable[Defect] = (),
) -> RunResult:
    """Run the workload in throw-away sessions (under ``faults``), heal, read every key once more
    on every node, check the history against the database and Redis, and remove the sessions
    (unless ``keep``).

    ``databases``: one alias, or the aliases of one cluster's nodes -- the clients are spread
    over them (thread ``i``, or process ``i``, pinned to node ``i % len(databases)``), and the
    state is read through the first. Raises :class:`FaultsUnavailable` when ``faults`` cannot
    run against this configuration. ``defects``: run a deliberately broken store instead (the
    self-test, :mod:`agentmemory.consistency.selftest`)."""
    aliases = [databases] if isinstance(databases, str) else list(databases)
    if unsafe and faults in ("cache", "all"):
        raise FaultsUnavailable("--unsafe runs without the cache tier: use --faults db or none")
    kinds = fault_kinds(faults, aliases[0], make_store(aliases[0], unsafe).cache, aliases[1:])
    with own_redis(kinds) as redis:
        result = _run(
            aliases,
            config,
            kinds,
            redis,
            processes,
            unsafe,
            keep,
            faults,
            progress,
            Defects(defects),
        )
    traces.export(result)  # one trace of the run, where OpenTelemetry is configured
    return result


def _run(
    aliases: list[str],
    config: WorkloadConfig,
    kinds: tuple[str, ...],
    redis: SentinelGroup | None,
    processes: int,
    unsafe: bool,
    keep: bool,
    faults: str,
    progress: Progress | None,
    defects: Defects,
) -> RunResult:
    database, others = aliases[0], aliases[1:]
    run_id = new_run_id()
    stores = [make_store(alias, unsafe, defects) for alias in aliases]
    store = stores[0]
    sessions = session_ids(run_id, config)
    warm_up(config)
    started = time.monotonic()
    retries: Counter[str] = Counter()
    injected: Counter[str] = Counter()
    fault_errors: list[str] = []
    windows: list[tuple[str, float, float]] = []
    # On a cluster under node faults, a client of a stopped node gives up after a few seconds
    # (and the store retries) instead of waiting for the node forever.
    timeouts = (
        client_timeouts(aliases, CLIENT_TIMEOUT_SECONDS)
        if set(kinds) & set(NODE_FAULTS)
        else nullcontext()
    )
    injected_failovers: list[Failover] = []
    watch = (
        TimelineWatch(database, injected_failovers)
        if connections[database].vendor == "postgresql"
        else nullcontext()
    )
    try:
        with timeouts, watch:
            shared = [k for k in kinds if not processes or k not in LOCAL_FAULTS]
            with Nemesis(
                database,
                store.cache,
                shared,
                sessions=sessions,
                seed=config.seed,
                nodes=others,
                redis=redis,
                defects=defects,
            ) as nemesis:
                if processes:
                    results = _run_processes(
                        aliases, unsafe, run_id, config, processes, kinds, defects
                    )
                    history = History(run_id)
                    for ops, counts, their_faults, their_errors, their_windows in results:
                        history.extend([Operation(**op) for op in ops])
                        retries.update(counts)
                        injected.update(their_faults)
                        fault_errors += their_errors
                        windows += [tuple(w) for w in their_windows]
                else:
                    history = run_workload(
                        stores,
                        run_id,
                        config,
                        progress=progress.tick if progress else None,
                        until=nemesis.round_done,
                    )
                nemesis.stop()  # the looped faults healed: the quiet ones run alone
                nemesis.after_workload()
            injected.update(nemesis.counts)
            fault_errors += nemesis.errors
            windows += nemesis.windows
            injected_failovers += nemesis.failovers
            seconds = time.monotonic() - started
            if injected_failovers:  # this thread's connections went with the old primary
                for alias in aliases:
                    connections[alias].close()
            _wait_out_restores(injected_failovers)
            final_reads(stores, run_id, config, history)
        failovers = injected_failovers + (
            watch.failovers if isinstance(watch, TimelineWatch) else []
        )
        for one in stores:
            retries.update(one.retries)
        state = load_state(database, sessions)
        final = Final(
            state=state,
            duplicates=duplicate_keys(database, sessions),
            logs=load_logs(database, sessions),
            checkpoints=load_chains(database, sessions),
            adk=load_apps(database, sessions, config.keys_of("adk"))
            if "adk" in config.workloads
            else {},
            cached=cached_entries(store.cache, state),
            looked_at=time.time(),
            failovers=list(failovers),
        )
        anomalies = final.anomalies(history) + nemesis.findings
    finally:
        if not keep:
            cleaner = MemoryStore(using=database)
            ran = run_sessions(database, run_id, sessions)
            for session_id in ran:
                cleaner.erase_session(session_id)
            delete_threads(cleaner, sessions)
            if "adk" in config.workloads:
                delete_apps(cleaner, sessions, config.keys_of("adk"))
        for alias in aliases:
            connections[alias].close()
    return RunResult(
        run_id=run_id,
        database=",".join(aliases),
        vendor=connections[database].display_name,
        unsafe=unsafe,
        config=config,
        history=history,
        anomalies=anomalies,
        final=final,
        seconds=seconds,
        retries=dict(retries),
        cache_stats=dict(store.cache.stats) if store.cache is not None else {},
        faults=faults,
        faults_injected=dict(injected),
        fault_windows=sorted(windows, key=lambda w: w[1]),
        fault_errors=fault_errors,
        redis=redis.describe() if redis is not None else "",
    )


def _wait_out_restores(failovers: Sequence[Failover]) -> None:
    """Quiescence comes after every fault has healed: a restore (``db-restore``) heals when the
    tier's bound has passed (two fence periods: until then reads, and the entries the final look
    reads, may still show what it took back), and so does a MariaDB replica's promotion (no
    timeline moves). Waits until the last one's bound."""
    healed = max(
        (f.promoted_at for f in failovers if f.kind in ("restore", "promotion")), default=0.0
    )
    wait = healed - clock.now().timestamp()
    if wait > 0:
        time.sleep(wait)


def run_sessions(database: str, run_id: str, known: Iterable[str]) -> list[str]:
    """Every session of one run: the workload's, and those the ``erase`` workload left."""
    from .mcp import PRINCIPALS

    # The MCP principals' copies of the run's sessions too (--via mcp).
    owned = Q(session_id__startswith=f"memcheck-{run_id}-")
    for principal in PRINCIPALS:
        owned |= Q(session_id__startswith=f"mcp:{principal}:memcheck-{run_id}-")
    found = (
        Memory.objects.using(database).filter(owned).values_list("session_id", flat=True).distinct()
    )
    return sorted({*known, *found})


def _run_processes(
    aliases: list[str],
    unsafe: bool,
    run_id: str,
    config: WorkloadConfig,
    processes: int,
    kinds: tuple[str, ...],
    defects: Defects = NO_DEFECTS,
) -> list[tuple[list[dict], dict, dict, list[str], list[tuple[str, float, float]]]]:
    """``processes`` spawned processes, process ``i`` pinned to ``aliases[i % len(aliases)]``."""
    per_process = WorkloadConfig(
        **{**asdict(config), "ops": (config.ops // processes) if config.ops else None}
    )
    context = multiprocessing.get_context("spawn")
    futures = []
    pools = []
    try:
        for i in range(processes):
            alias = aliases[i % len(aliases)]
            pool = ProcessPoolExecutor(
                1,
                mp_context=context,
                initializer=setup_process,
                initargs=(
                    alias,
                    connections[alias].settings_dict["NAME"],
                    dict(connections[alias].settings_dict.get("OPTIONS", {})),
                    {"CACHES": settings.CACHES, "AGENTMEMORY": settings.AGENTMEMORY},
                ),
            )
            pools.append(pool)
            futures.append(
                pool.submit(
                    _process_main, alias, unsafe, run_id, per_process, i, kinds, tuple(defects)
                )
            )
        return [future.result() for future in futures]
    finally:
        for pool in pools:
            pool.shutdown()
