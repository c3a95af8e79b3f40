"""One memcheck run: workload (threads, optionally in several processes) under optional faults,
healing and final reads, then the checks."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from django.db import connections

from ..store import MemoryStore
from .bootstrap import setup_process
from .checker import Anomaly, cache_divergence, check_history, duplicate_rows
from .faults import LOCAL_FAULTS, FaultsUnavailable, Nemesis, fault_kinds
from .history import History, Operation
from .state import cached_versions, duplicate_keys, load_state
from .workloads import WorkloadConfig, final_reads, new_run_id, run_workload, session_ids


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
    retries: dict[str, int] = field(default_factory=dict)
    cache_stats: dict[str, int] = field(default_factory=dict)
    faults: str = "none"
    faults_injected: dict[str, int] = field(default_factory=dict)
    fault_errors: list[str] = field(default_factory=list)

    @property
    def latencies(self) -> dict[str, dict[str, float]]:
        """Milliseconds per completed operation, by kind: p50/p95/p99/max."""
        spans: dict[str, list[float]] = {}
        for op in self.history.operations:
            if op.completed_at is not None and op.client != "final":
                spans.setdefault(op.kind, []).append((op.completed_at - op.invoked_at) * 1000)
        return {kind: percentiles(values) for kind, values in sorted(spans.items())}

    @property
    def counts(self) -> dict[str, Counter[str]]:
        counts: dict[str, Counter[str]] = {}
        for op in self.history.operations:
            counts.setdefault(op.kind, Counter())[op.status or "?"] += 1
        return counts

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
            "retries": self.retries,
            "cache": self.cache_stats,
            "faults": {
                "mode": self.faults,
                "injected": self.faults_injected,
                "errors": self.fault_errors,
            },
            "anomalies": [a.as_dict() for a in self.anomalies],
        }


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": at(1.0)}


def make_store(database: str, unsafe: bool) -> MemoryStore:
    # The configured cache tier included: memcheck checks what the application will run. The
    # unlocked demo path runs without it, so what it finds is the missing lock alone.
    if unsafe:
        return MemoryStore(using=database, cache=None, row_lock=False)
    return MemoryStore(using=database)


def _process_main(
    database: str,
    unsafe: bool,
    run_id: str,
    config: WorkloadConfig,
    index: int,
    kinds: tuple[str, ...],
) -> tuple[list[dict], dict, dict, list[str]]:
    store = make_store(database, unsafe)
    local = [kind for kind in kinds if kind in LOCAL_FAULTS]
    sessions = session_ids(run_id, config)
    with Nemesis(
        database, store.cache, local, sessions=sessions, seed=config.seed + index
    ) as nemesis:
        history = run_workload(store, run_id, config, client_prefix=f"p{index}-t")
    return (
        [asdict(op) for op in history.operations],
        dict(store.retries),
        dict(nemesis.counts),
        nemesis.errors,
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
    database: str,
    config: WorkloadConfig,
    *,
    processes: int = 0,
    unsafe: bool = False,
    keep: bool = False,
    faults: str = "none",
    progress: Progress | None = None,
) -> RunResult:
    """Run the workload in throw-away sessions (under ``faults``), heal, read every key once more,
    check the history against the database and Redis, and remove the sessions (unless ``keep``).

    Raises :class:`FaultsUnavailable` when ``faults`` cannot run against this configuration."""
    run_id = new_run_id()
    store = make_store(database, unsafe)
    if unsafe and faults in ("cache", "all"):
        raise FaultsUnavailable("--unsafe runs without the cache tier: use --faults db or none")
    kinds = fault_kinds(faults, database, store.cache)
    sessions = session_ids(run_id, config)
    started = time.monotonic()
    retries: Counter[str] = Counter()
    injected: Counter[str] = Counter()
    fault_errors: list[str] = []
    try:
        if processes:
            history = History(run_id)
            per_process = WorkloadConfig(
                **{**asdict(config), "ops": (config.ops // processes) if config.ops else None}
            )
            context = multiprocessing.get_context("spawn")
            shared = [kind for kind in kinds if kind not in LOCAL_FAULTS]
            with (
                Nemesis(
                    database, store.cache, shared, sessions=sessions, seed=config.seed
                ) as nemesis,
                ProcessPoolExecutor(
                    processes,
                    mp_context=context,
                    initializer=setup_process,
                    initargs=(database, connections[database].settings_dict["NAME"]),
                ) as pool,
            ):
                futures = [
                    pool.submit(_process_main, database, unsafe, run_id, per_process, i, kinds)
                    for i in range(processes)
                ]
                results = [future.result() for future in futures]
            for ops, counts, their_faults, their_errors in results:
                history.extend([Operation(**op) for op in ops])
                retries.update(counts)
                injected.update(their_faults)
                fault_errors += their_errors
        else:
            with Nemesis(
                database, store.cache, kinds, sessions=sessions, seed=config.seed
            ) as nemesis:
                history = run_workload(
                    store, run_id, config, progress=progress.tick if progress else None
                )
        injected.update(nemesis.counts)
        fault_errors += nemesis.errors
        seconds = time.monotonic() - started
        final_reads(store, run_id, config, history)
        retries.update(store.retries)
        state = load_state(database, sessions)
        anomalies = duplicate_rows(duplicate_keys(database, sessions))
        anomalies += check_history(history, state)
        anomalies += cache_divergence(cached_versions(store.cache, state), state)
    finally:
        if not keep:
            cleaner = MemoryStore(using=database)
            for session_id in sessions:
                cleaner.erase_session(session_id)
        connections[database].close()
    return RunResult(
        run_id=run_id,
        database=database,
        vendor=connections[database].display_name,
        unsafe=unsafe,
        config=config,
        history=history,
        anomalies=anomalies,
        seconds=seconds,
        retries=dict(retries),
        cache_stats=dict(store.cache.stats) if store.cache is not None else {},
        faults=faults,
        faults_injected=dict(injected),
        fault_errors=fault_errors,
    )
