"""Concurrent workloads that record a :class:`History` while they hammer a few hot keys.

Keys come in three families in each of three look-alike sessions (``…-a``, ``…-a%``, ``…-a_``):
``reg-N`` (remember, compare-and-set, idempotent retries, forget, recall), ``list-N`` (appends
through ``update(fn)``: every read reveals the whole order) and ``ttl-N`` (short TTLs, reads around
expiry). Every value written embeds its op id, session and key, so every read maps to one write.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from .. import clock
from ..errors import InvalidMemory, MemoryUnavailable, VersionConflict
from ..store import MemoryStore
from .history import History, Operation

SESSION_SUFFIXES = ("a", "a%", "a_")


@dataclass
class WorkloadConfig:
    workers: int = 8
    keys: int = 3
    ops: int | None = 2000
    seconds: float | None = None
    seed: int = 0
    ttl: float = 0.15  # seconds: short enough that reads land on both sides of expiry


def new_run_id() -> str:
    return uuid.uuid4().hex[:10]


def session_ids(run_id: str) -> list[str]:
    return [f"memcheck-{run_id}-{suffix}" for suffix in SESSION_SUFFIXES]


def _stamp() -> float:
    return clock.now().timestamp()


class _Budget:
    """Shared op counter and deadline for the workers of one process."""

    def __init__(self, ops: int | None, seconds: float | None) -> None:
        self._left = itertools.count()
        self.ops = ops
        self.deadline = time.monotonic() + seconds if seconds else None

    def take(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return False
        return self.ops is None or next(self._left) < self.ops


def _client(
    store: MemoryStore,
    run_id: str,
    name: str,
    config: WorkloadConfig,
    budget: _Budget,
    out: list[Operation],
    start: threading.Barrier,
    progress: Callable[[], None] | None,
) -> None:
    rng = random.Random(f"{config.seed}-{name}")
    sessions = session_ids(run_id)
    start.wait()
    counter = 0
    try:
        while budget.take():
            counter += 1
            op_id = f"{name}-{counter}"
            session_id = rng.choice(sessions)
            family = rng.choices(("reg", "list", "ttl"), weights=(5, 3, 2))[0]
            key = f"{family}-{rng.randrange(config.keys)}"
            out.append(_one_op(store, rng, op_id, name, session_id, family, key, config))
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
) -> Operation:
    token = {"op": op_id, "s": session_id, "k": key}
    roll = rng.random()
    op = Operation(op_id, client, "recall", session_id, key, invoked_at=0.0)
    call: Callable[[], Any]
    if roll < 0.4:
        call = lambda: store.recall(session_id, key)
    elif family == "list":
        op.kind, op.value = "append", token
        call = lambda: store.update(
            session_id, key, lambda items: [*(items or []), token], default=[]
        )
    elif family == "ttl":
        op.kind, op.value = "ttl-write", token
        call = lambda: store.remember(session_id, key, token, ttl=config.ttl)
    elif roll < 0.65:
        op.kind, op.value = "remember", token
        call = lambda: store.remember(session_id, key, token)
    elif roll < 0.85:
        op.kind, op.value = "cas", token

        def call() -> Any:
            seen = store.recall(session_id, key)
            op.expected_version = seen.version if seen else 0
            return store.remember(session_id, key, token, expected_version=op.expected_version)

    elif roll < 0.95:
        # The same write sent twice, as a client does after a timeout: one version, not two.
        op.kind, op.value, op.idempotency_key = "retry", token, op_id

        def call() -> Any:
            first = store.remember(session_id, key, token, idempotency_key=op_id)
            second = store.remember(session_id, key, token, idempotency_key=op_id)
            if (first.version, first.value) != (second.version, second.value):
                raise AssertionError(
                    f"idempotent retry returned v{second.version}, first call v{first.version}"
                )
            return first
    else:
        op.kind = "forget"
        call = lambda: store.forget(session_id, key)
    op.invoked_at = _stamp()
    try:
        result = call()
    except VersionConflict as exc:
        op.status, op.error, op.version = "fail", "VersionConflict", exc.actual
    except (InvalidMemory, AssertionError) as exc:
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
    store: MemoryStore,
    run_id: str,
    config: WorkloadConfig,
    *,
    client_prefix: str = "t",
    progress: Callable[[], None] | None = None,
) -> History:
    """Run ``config.workers`` threads against ``store``; every thread has its own connection."""
    budget = _Budget(config.ops, config.seconds)
    outputs: list[list[Operation]] = [[] for _ in range(config.workers)]
    start = threading.Barrier(config.workers)
    threads = [
        threading.Thread(
            target=_client,
            args=(
                store,
                run_id,
                f"{client_prefix}{i}",
                config,
                budget,
                outputs[i],
                start,
                progress,
            ),
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
