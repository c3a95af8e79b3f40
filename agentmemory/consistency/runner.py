"""One memcheck run: workload (threads, optionally in several processes), then the checks."""

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
from .checker import Anomaly, cache_divergence, check_history, duplicate_rows, load_state
from .history import History, Operation
from .unsafe import UnlockedMemoryStore
from .workloads import WorkloadConfig, new_run_id, run_workload, session_ids


@dataclass
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
            "retries": self.retries,
            "cache": self.cache_stats,
            "anomalies": [a.as_dict() for a in self.anomalies],
        }


def make_store(database: str, unsafe: bool) -> MemoryStore:
    # The configured cache tier included: memcheck checks what the application will run. The
    # unlocked demo path runs without it, so what it finds is the missing lock alone.
    if unsafe:
        return UnlockedMemoryStore(using=database, cache=None)
    return MemoryStore(using=database)


def _process_main(
    database: str, unsafe: bool, run_id: str, config: WorkloadConfig, index: int
) -> tuple[list[dict], dict]:
    store = make_store(database, unsafe)
    history = run_workload(store, run_id, config, client_prefix=f"p{index}-t")
    return [asdict(op) for op in history.operations], dict(store.retries)


class Progress:
    """A line on stderr every ``every`` seconds: operations done and the rate."""

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
        self._total, self._seconds, self._stream, self._every = total, seconds, stream, every
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def tick(self) -> None:
        with self._lock:
            self.done += 1

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            elapsed = time.monotonic() - self._started
            goal = (
                f"/{self._total}"
                if self._total
                else (f" ({elapsed:.0f}/{self._seconds:.0f}s)" if self._seconds else "")
            )
            rate = self.done / elapsed if elapsed else 0
            print(
                f"memcheck: {self.done}{goal} operations, {rate:.0f}/s",
                file=self._stream,
                flush=True,
            )

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def run_memcheck(
    database: str,
    config: WorkloadConfig,
    *,
    processes: int = 0,
    unsafe: bool = False,
    keep: bool = False,
    progress: Progress | None = None,
) -> RunResult:
    """Run the workload in throw-away sessions, check it, remove the sessions (unless ``keep``)."""
    run_id = new_run_id()
    store = make_store(database, unsafe)
    sessions = session_ids(run_id)
    started = time.monotonic()
    retries: Counter[str] = Counter()
    try:
        if processes:
            history = History(run_id)
            per_process = WorkloadConfig(
                **{**asdict(config), "ops": (config.ops // processes) if config.ops else None}
            )
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(
                processes,
                mp_context=context,
                initializer=setup_process,
                initargs=(database, connections[database].settings_dict["NAME"]),
            ) as pool:
                futures = [
                    pool.submit(_process_main, database, unsafe, run_id, per_process, i)
                    for i in range(processes)
                ]
                results = [future.result() for future in futures]
            for ops, counts in results:
                history.extend([Operation(**op) for op in ops])
                retries.update(counts)
        else:
            history = run_workload(
                store, run_id, config, progress=progress.tick if progress else None
            )
        seconds = time.monotonic() - started
        retries.update(store.retries)
        state = load_state(database, sessions)
        anomalies = duplicate_rows(database, sessions) + check_history(history, state)
        anomalies += cache_divergence(store.cache, state)
    finally:
        if not keep:
            cleaner = MemoryStore(using=database)
            for session_id in sessions:
                cleaner.erase_session(session_id)
        connections[database].close()
    return RunResult(
        run_id,
        database,
        connections[database].display_name,
        unsafe,
        config,
        history,
        anomalies,
        seconds,
        dict(retries),
        dict(store.cache.stats) if store.cache is not None else {},
    )
