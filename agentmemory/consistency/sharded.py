"""memcheck across shards: one run whose sessions (and checkpoint threads) live on the shards of
``AGENTMEMORY["SHARDS"]`` -- through a :class:`~agentmemory.ShardedStore`, as an application
calls them -- while a mover moves them from shard to shard under the workload (the
``session-move`` fault, :mod:`agentmemory.moves`). After the run every key is read once more
through the router, and the history is checked against what each session's shard holds; a
session with rows left on a shard it does not live on is an anomaly of its own
(``split-session``): a move that left a copy behind, or a write that landed behind one."""

from __future__ import annotations

import random
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.db import connections

from ..conf import get_config
from ..defects import Defect, Defects
from ..errors import AgentMemoryError
from ..models import CheckpointThread, Log, Memory, SessionGate, ShardMap
from ..moves import delete_rows, session_rows
from ..sharding import ShardedStore, forget_checked, recorded_shards
from . import semantic, traces
from .checker import Anomaly
from .checkpoints import load_chains
from .faults import FaultsUnavailable
from .logs import load_logs
from .recorded import Final
from .runner import RunResult
from .state import cached_entries, duplicate_keys, load_state
from .workloads import WorkloadConfig, final_reads, new_run_id, run_workload, warm_up

__all__ = ["SHARDED_WORKLOADS", "Mover", "run_across_shards", "shards_for_moves"]

#: The alias of the SQLite shard memcheck makes for itself when only one database is configured.
SCRATCH_ALIAS = "memcheck-scratch-shard"

#: The workloads a run across shards runs: all but ADK's (its session service keeps an app's
#: sessions on one shard, and refuses a ShardedStore).
SHARDED_WORKLOADS = ("adk",)

#: Seconds between two moves: drawn from this range (the mover paces itself; no test waits on it).
MOVE_PAUSE = (0.01, 0.06)


def routing_keys(shards: Iterable[str], run_id: str) -> list[str]:
    """Every session id and checkpoint thread id of the run, on any shard: what a move moves."""
    prefix = f"memcheck-{run_id}-"
    found: set[str] = set()
    for alias in shards:
        found.update(
            Memory.objects.using(alias)
            .filter(session_id__startswith=prefix)
            .values_list("session_id", flat=True)
            .distinct()
        )
        found.update(
            Log.objects.using(alias)
            .filter(session_id__startswith=prefix)
            .values_list("session_id", flat=True)
            .distinct()
        )
        found.update(
            CheckpointThread.objects.using(alias)
            .filter(thread_id__startswith=prefix)
            .values_list("thread_id", flat=True)
            .distinct()
        )
    return sorted(found)


class Mover(threading.Thread):
    """The ``session-move`` fault: until stopped, a session or thread of the run moved to another
    shard, then another, a few tens of milliseconds apart."""

    def __init__(self, store: ShardedStore, run_id: str, seed: int) -> None:
        super().__init__(name="memcheck-mover", daemon=True)
        self.store, self.run_id = store, run_id
        self.rng = random.Random(seed)
        self.stopped = threading.Event()
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.windows: list[tuple[str, float, float]] = []

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.rng.uniform(*MOVE_PAUSE)):
                keys = routing_keys(self.store.shards, self.run_id)
                if not keys:
                    continue
                key = self.rng.choice(keys)
                here = self.store.locate(key)
                target = self.rng.choice([a for a in self.store.shards if a != here])
                started = time.time()
                try:
                    self.store.move(key, target)
                except AgentMemoryError as error:
                    self.errors.append(f"session-move {key!r} -> {target!r}: {error}")
                    continue
                self.counts["session-move"] += 1
                self.windows.append(("session-move", started, time.time()))
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def split_sessions(
    shards: Sequence[str], keys: Iterable[str], where: Callable[[str], str]
) -> list[Anomaly]:
    """Each session or thread with rows on a shard other than the one it lives on."""
    found = []
    for key in keys:
        home = where(key)
        for alias in shards:
            if alias == home:
                continue
            left = {name: len(rows) for name, rows in session_rows(alias, key).items() if rows}
            if left:
                found.append(
                    Anomaly(
                        "split-session",
                        key,
                        "*",
                        f"lives on shard {home!r}, yet shard {alias!r} still holds "
                        + ", ".join(f"{n} {name}" for name, n in sorted(left.items())),
                    )
                )
    return found


def run_across_shards(
    shards: Sequence[str],
    config: WorkloadConfig,
    *,
    defects: Iterable[Defect] = (),
    unsafe: bool = False,
    keep: bool = False,
    progress: Callable[[], None] | None = None,
) -> RunResult:
    """One run through a ShardedStore over ``shards`` with the session-move fault (see the
    module); the sessions are removed afterwards unless ``keep``. ``unsafe``: the unlocked
    write path, without the cache tier (``memcheck --unsafe``)."""
    shards = list(shards)
    config = replace(
        config, workloads=tuple(w for w in config.workloads if w not in SHARDED_WORKLOADS)
    )
    index = semantic.memcheck_index() if semantic.available() else None
    if unsafe:
        store = ShardedStore(shards, cache=None, row_lock=False, index=index)
    else:
        store = ShardedStore(shards, defects=Defects(defects), index=index)
    run_id = new_run_id()
    warm_up(config)
    mover = Mover(store, run_id, config.seed)
    started = time.monotonic()
    try:
        mover.start()
        try:
            history = run_workload([store], run_id, config, progress=progress)
        finally:
            mover.stop()
        seconds = time.monotonic() - started
        keys = routing_keys(shards, run_id)
        final_reads([store], run_id, config, history)
        keys = sorted({*keys, *routing_keys(shards, run_id)})
        where = {key: store.locate(key) for key in keys}
        state: dict = {}
        duplicates: dict = {}
        logs: dict = {}
        chains: dict = {}
        cached: dict = {}
        for alias in shards:
            mine = [key for key in keys if where[key] == alias]
            shard_state = load_state(alias, mine)
            state.update(shard_state)
            duplicates.update(duplicate_keys(alias, mine))
            logs.update(load_logs(alias, mine))
            sessions = [key for key in keys if ":" not in key]  # a thread id is "session:..."
            chains.update(
                (thread, chain)
                for thread, chain in load_chains(alias, sessions).items()
                if where.get(thread) == alias
            )
            cached.update(cached_entries(store.stores[alias].cache, shard_state))
        final = Final(
            state=state,
            duplicates=duplicates,
            logs=logs,
            checkpoints=chains,
            cached=cached,
            looked_at=time.time(),
        )
        anomalies = final.anomalies(history) + split_sessions(shards, keys, where.__getitem__)
    finally:
        if not keep:
            _clean(store, run_id)
        for alias in shards:
            connections[alias].close()
    result = RunResult(
        run_id=run_id,
        database=",".join(shards),
        vendor=" + ".join(connections[alias].display_name for alias in shards),
        unsafe=unsafe,
        config=config,
        history=history,
        anomalies=anomalies,
        final=final,
        seconds=seconds,
        retries=dict(store.retries),
        faults="session-move",
        faults_injected=dict(mover.counts),
        fault_windows=sorted(mover.windows, key=lambda w: w[1]),
        fault_errors=mover.errors,
    )
    traces.export(result)
    return result


@contextmanager
def shards_for_moves(database: str) -> Iterator[list[str]]:
    """The shards a run with moves uses for ``database``: ``AGENTMEMORY["SHARDS"]`` if it names
    it, else ``database`` and a SQLite shard of memcheck's own, in a temporary folder (migrated,
    and gone afterwards with the list of shards recorded for the run). Raises
    :class:`FaultsUnavailable` if ``database`` records another list of shards (a shard of a
    configuration this process does not have)."""
    configured = list(get_config()["SHARDS"] or ())
    if database in configured and len(configured) > 1:
        yield configured
        return
    recorded = recorded_shards(database)
    if recorded is not None:
        raise FaultsUnavailable(
            f"database {database!r} is a shard of {recorded}, which AGENTMEMORY['SHARDS'] does "
            "not name: run memcheck with that setting to move sessions between them"
        )
    with tempfile.TemporaryDirectory(prefix="memcheck-shard-") as folder:
        options = {"transaction_mode": "IMMEDIATE", "timeout": 30}
        entry = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(Path(folder) / "shard.sqlite3"),
            "OPTIONS": options,
        }
        # Django's defaults filled in; the connections' settings are usually the setting's dict.
        configured = connections.configure_settings(
            {"default": connections.settings["default"], SCRATCH_ALIAS: entry}
        )[SCRATCH_ALIAS]
        settings.DATABASES[SCRATCH_ALIAS] = configured
        connections.settings[SCRATCH_ALIAS] = configured
        try:
            call_command("migrate", "agentmemory", database=SCRATCH_ALIAS, verbosity=0)
            yield [database, SCRATCH_ALIAS]
        finally:
            ShardMap.objects.using(database).filter(pk=ShardMap.ONLY).delete()
            forget_checked()
            connections[SCRATCH_ALIAS].close()
            del connections[SCRATCH_ALIAS]
            connections.settings.pop(SCRATCH_ALIAS, None)
            settings.DATABASES.pop(SCRATCH_ALIAS, None)


def _clean(store: ShardedStore, run_id: str) -> None:
    """The run's sessions erased, its threads deleted and its gates removed, on every shard."""
    keys = routing_keys(store.shards, run_id)
    for key in keys:
        store.erase_session(key)
    threads = [
        key
        for key in keys
        if any(
            CheckpointThread.objects.using(alias).filter(thread_id=key).exists()
            for alias in store.shards
        )
    ]
    store.checkpoints.delete_threads(threads)
    for alias in store.shards:
        # What a broken store (the self-test's variant) left behind on a shard it moved from.
        for key in keys:
            delete_rows(alias, key)
        gates = SessionGate.objects.using(alias).filter(
            session_id__startswith=f"memcheck-{run_id}-"
        )
        gates.delete()
