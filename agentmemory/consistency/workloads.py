"""Concurrent workloads that record a :class:`History` while they hammer a few hot keys.

Five workloads, all on by default (``WorkloadConfig.workloads``):

- ``register``: keys ``reg-N`` -- remember, compare-and-set, forget, recall;
- ``list``: keys ``list-N`` -- appends through ``update(fn)``; every read reveals the whole order;
- ``ttl``: keys ``ttl-N`` -- writes with short TTLs, reads around expiry;
- ``isolation``: every key in three look-alike sessions (``…-a``, ``…-a%``, ``…-a_``) at once;
- ``idempotent``: a register write sent twice with one idempotency key, as after a timeout.

Every value written embeds its op id, session and key, so every read maps to one write.

On a cluster (several stores, one per node) each client is pinned to one node, and every write it
gets acknowledged is followed at once by a read of that key on the next node -- a request served
by one application server, the next one by another: read-after-write across nodes.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections

from .. import clock
from ..errors import InvalidMemory, MemoryUnavailable, VersionConflict
from ..store import MemoryStore
from .faults import WORKER_THREAD_PREFIX
from .history import History, Operation

SESSION_SUFFIXES = ("a", "a%", "a_")
WORKLOADS = ("register", "list", "ttl", "isolation", "idempotent")
#: Key families and their share of the operations.
FAMILIES = {"register": ("reg", 5), "list": ("list", 3), "ttl": ("ttl", 2)}


@dataclass
class WorkloadConfig:
    workers: int = 8
    keys: int = 3
    ops: int | None = 2000
    seconds: float | None = None
    seed: int = 0
    ttl: float = 0.15  # seconds: short enough that reads land on both sides of expiry
    workloads: tuple[str, ...] = WORKLOADS

    def __post_init__(self) -> None:
        self.workloads = tuple(self.workloads)
        unknown = sorted(set(self.workloads) - set(WORKLOADS))
        if unknown:
            raise ValueError(
                f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}"
            )
        if not set(self.workloads) & set(FAMILIES):
            raise ValueError("choose at least one of the workloads register, list, ttl")

    @property
    def families(self) -> tuple[list[str], list[int]]:
        chosen = [FAMILIES[w] for w in WORKLOADS if w in FAMILIES and w in self.workloads]
        return [name for name, _ in chosen], [weight for _, weight in chosen]


class IdempotencyBroken(Exception):
    """An idempotent retry answered differently from the first call."""


def new_run_id() -> str:
    return uuid.uuid4().hex[:10]


def session_ids(run_id: str, config: WorkloadConfig | None = None) -> list[str]:
    suffixes = SESSION_SUFFIXES
    if config is not None and "isolation" not in config.workloads:
        suffixes = suffixes[:1]
    return [f"memcheck-{run_id}-{suffix}" for suffix in suffixes]


def _stamp() -> float:
    return clock.now().timestamp()


class _Budget:
    """Shared op counter and deadline for the workers of one process. A timed run goes on past
    its deadline until ``until`` is set (the nemesis's first round of faults, so that every kind
    is injected at least once)."""

    def __init__(
        self, ops: int | None, seconds: float | None, until: threading.Event | None = None
    ) -> None:
        self._left = itertools.count()
        self.ops = ops
        self.deadline = time.monotonic() + seconds if seconds else None
        self.until = until

    def take(self) -> bool:
        past = self.deadline is not None and time.monotonic() >= self.deadline
        if past and (self.until is None or self.until.is_set()):
            return False
        return self.ops is None or next(self._left) < self.ops


def _client(
    store: MemoryStore,
    peer: MemoryStore | None,
    run_id: str,
    name: str,
    config: WorkloadConfig,
    budget: _Budget,
    out: list[Operation],
    start: threading.Barrier,
    progress: Callable[[], None] | None,
) -> None:
    rng = random.Random(f"{config.seed}-{name}")
    sessions = session_ids(run_id, config)
    families, weights = config.families
    start.wait()
    counter = 0
    try:
        while budget.take():
            counter += 1
            op_id = f"{name}-{counter}"
            session_id = rng.choice(sessions)
            family = rng.choices(families, weights=weights)[0]
            key = f"{family}-{rng.randrange(config.keys)}"
            op = _one_op(store, rng, op_id, name, session_id, family, key, config)
            out.append(op)
            if peer is not None and op.is_write and op.status == "ok":
                out.append(
                    _one_op(
                        peer, rng, f"{op_id}-next", name, session_id, family, key, config, "recall"
                    )
                )
            if progress:
                progress()
    finally:
        connections.close_all()


def _one_op(
    store: MemoryStore,
    rng: random.Random,
    op_id: str,
    client: str,
    session_id: str,
    family: str,
    key: str,
    config: WorkloadConfig,
    kind: str | None = None,
) -> Operation:
    token = {"op": op_id, "s": session_id, "k": key}
    roll = rng.random()
    if kind is not None:
        pass
    elif roll < 0.4:
        kind = "recall"
    elif family in ("list", "ttl"):
        kind = "append" if family == "list" else "ttl-write"
    else:
        kind = "remember" if roll < 0.65 else "cas" if roll < 0.85 else "retry"
        if roll >= 0.95:
            kind = "forget"
        elif kind == "retry" and "idempotent" not in config.workloads:
            kind = "remember"
    op = Operation(op_id, client, kind, session_id, key, invoked_at=0.0, node=store.using)
    if kind != "recall" and kind != "forget":
        op.value = token
    call: Callable[[], Any]
    if kind == "recall":

        def call() -> Any:
            found = store.recall(session_id, key)
            op.source = store.last_read_source
            return found

    elif kind == "append":
        call = lambda: store.update(
            session_id, key, lambda items: [*(items or []), token], default=[]
        )
    elif kind == "ttl-write":
        call = lambda: store.remember(session_id, key, token, ttl=config.ttl)
    elif kind == "remember":
        call = lambda: store.remember(session_id, key, token)
    elif kind == "cas":

        def call() -> Any:
            seen = store.recall(session_id, key)
            op.expected_version = seen.version if seen else 0
            return store.remember(session_id, key, token, expected_version=op.expected_version)

    elif kind == "retry":
        # The same write sent twice, as a client does after a timeout: one version, not two.
        op.idempotency_key = op_id

        def call() -> Any:
            first = store.remember(session_id, key, token, idempotency_key=op_id)
            second = store.remember(session_id, key, token, idempotency_key=op_id)
            if (first.version, first.value) != (second.version, second.value):
                raise IdempotencyBroken(
                    f"the retry returned v{second.version}, the first call v{first.version}"
                )
            return first

    else:
        call = lambda: store.forget(session_id, key)
    op.invoked_at = _stamp()
    try:
        result = call()
    except VersionConflict as exc:
        op.status, op.error, op.version = "fail", "VersionConflict", exc.actual
    except (InvalidMemory, IdempotencyBroken) as exc:
        op.status, op.error = "fail", f"{type(exc).__name__}: {exc}"
    except MemoryUnavailable as exc:
        op.status, op.error = "info", f"MemoryUnavailable: {exc}"
    except Exception as exc:  # an error that reached the caller: indeterminate, and reported
        op.status, op.error = "info", f"{type(exc).__name__}: {exc}"
    else:
        op.status = "ok"
        if op.kind == "forget":
            op.result = result
        elif result is not None:
            op.version, op.result = result.version, result.value
            op.expires_at = result.expires_at.timestamp() if result.expires_at else None
    op.completed_at = _stamp()
    return op


def run_workload(
    stores: MemoryStore | Sequence[MemoryStore],
    run_id: str,
    config: WorkloadConfig,
    *,
    client_prefix: str = "t",
    progress: Callable[[], None] | None = None,
    until: threading.Event | None = None,
) -> History:
    """Run ``config.workers`` threads; every thread has its own connection, and thread ``i`` is
    pinned to ``stores[i % len(stores)]`` (one store per node of a cluster)."""
    if isinstance(stores, MemoryStore):
        stores = [stores]
    budget = _Budget(config.ops, config.seconds, until)
    outputs: list[list[Operation]] = [[] for _ in range(config.workers)]
    start = threading.Barrier(config.workers)
    threads = [
        threading.Thread(
            target=_client,
            args=(
                stores[i % len(stores)],
                stores[(i + 1) % len(stores)] if len(stores) > 1 else None,
                run_id,
                f"{client_prefix}{i}",
                config,
                budget,
                outputs[i],
                start,
                progress,
            ),
            name=f"{WORKER_THREAD_PREFIX}{client_prefix}{i}",
            daemon=True,
        )
        for i in range(config.workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    history = History(run_id)
    for ops in outputs:
        history.extend(ops)
    return history


def final_reads(
    stores: MemoryStore | Sequence[MemoryStore],
    run_id: str,
    config: WorkloadConfig,
    history: History,
) -> None:
    """Once the workload and the faults have stopped: read every key of every session on every
    node, twice (the first pass lets the cache tier replay what an outage left pending), and
    record the reads in ``history`` -- after healing, every read on every node must see the last
    acknowledged write."""
    if isinstance(stores, MemoryStore):
        stores = [stores]
    for store in stores:
        if store.cache is not None:
            deadline = time.monotonic() + 2 * store.cache.fence_seconds
            while not store.cache.available and time.monotonic() < deadline:
                time.sleep(0.05)
    families, _ = config.families
    rng = random.Random(0)
    for round_ in (1, 2):
        for store in stores:
            for index, session_id in enumerate(session_ids(run_id, config)):
                for family in families:
                    for n in range(config.keys):
                        key = f"{family}-{n}"
                        op_id = f"final{round_}-{store.using}-{index}-{key}"
                        op = _one_op(
                            store, rng, op_id, "final", session_id, family, key, config, "recall"
                        )
                        history.extend([op])
