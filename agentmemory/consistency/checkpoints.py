"""memcheck's ``checkpoint`` workload, what it left in the database, and the checks of it.

Threads ``<session>:cp-N`` of the run's sessions are checkpoint chains (:mod:`agentmemory.checkpoints`,
the storage of LangGraph's ``AgentMemorySaver``), driven as LangGraph's loop drives them, from
every client: a step loads the chain's latest checkpoint and puts its child (``cp-put``); a fork
loads an older checkpoint by its id and puts a child of it, as time travel does (``cp-fork``); a
task saves one to three pending writes for the latest checkpoint, a third of them twice
(``cp-writes``); reads of the latest checkpoint with its pending writes (``cp-read``) and listings
of the latest five (``cp-list``). And in a thread of the client's own: two steps, a
``delete_thread``, a read (``cp-delete``). Every checkpoint and write embeds the op's id, so each
stored row maps to its call.

The checks, per chain, against the stored checkpoints and writes:

- ``checkpoint-fork``: no checkpoint has two children made by steps that loaded it as the latest
  (a silent fork); forks asked for are children of the checkpoint they asked for;
- ``checkpoint-write``: every acknowledged step and write is stored once, as it was given; a
  failed one not at all; every stored one was made by a call that did not fail;
- ``checkpoint-read``: a read returns a stored checkpoint with its own channel value, not older
  than one acknowledged before the read began, with every write acknowledged for it before then;
- ``checkpoint-list``: a listing is newest first and leaves out no checkpoint acknowledged
  before it began that is newer than the oldest one it shows;
- ``checkpoint-delete``: after ``delete_thread``, the thread holds nothing.

After a database failover (an asynchronous standby promoted), an acknowledged step or write the
database lost is ``lost-by-database``.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..checkpoints import NewBlob
from ..models import Checkpoint, CheckpointBlob, CheckpointWrite
from ..store import MemoryStore
from .checker import Anomaly, brief
from .history import CHECKPOINT_KINDS as KINDS
from .history import Operation

MUTATIONS = frozenset({"cp-put", "cp-fork", "cp-writes", "cp-delete"})
#: The channel every step writes, and the size of a listing.
CHANNEL = "v"
PAGE = 5


class DeletedThreadRead(Exception):
    """A read after ``delete_thread`` found a checkpoint of the deleted thread."""


def thread_of(session_id: str, key: str) -> str:
    return f"{session_id}:{key}"


def delete_thread_of(session_id: str, client: str) -> str:
    """The thread of one client's ``cp-delete`` calls (written and deleted by it only)."""
    return f"{session_id}:cp-del-{client}"


def choose_kind(rng: random.Random) -> str:
    return rng.choices(
        ["cp-read", "cp-put", "cp-writes", "cp-list", "cp-fork", "cp-delete"],
        weights=[19, 38, 22, 8, 5, 8],
    )[0]


def _typed(text: str) -> tuple[str, bytes]:
    return ("json", text.encode())


def _new_id(after: str | None) -> str:
    """A checkpoint id after ``after`` and after every id of an earlier time (LangGraph's ids
    increase with time: uuid6)."""
    now = time.time_ns()
    if after is not None:
        now = max(now, int(after.split(".", 1)[0]) + 1)
    return f"{now:020d}"


def run_op(
    store: MemoryStore, rng: random.Random, op: Operation, call: Any, *, whole: bool = False
) -> Operation:
    """One call of the checkpoint workload on ``store``, recorded into ``op`` (``call``: the
    workload's recorder). ``whole``: a listing of every checkpoint (the final reads)."""
    chains = store.checkpoints
    thread = thread_of(op.session_id, op.key)

    def put(parent: str | None, expect: str, thread_id: str = thread) -> str:
        checkpoint_id = f"{_new_id(parent)}.{op.id}"
        op.value = {"id": checkpoint_id, "parent": parent, "op": op.id}
        chains.put(
            thread_id,
            "",
            checkpoint_id,
            parent,
            expect=expect,
            checkpoint=_typed(op.id),
            metadata=_typed(op.id),
            run_id=op.id,
            versions={CHANNEL: checkpoint_id},
            blobs=[NewBlob(CHANNEL, checkpoint_id, _typed(op.id))],
        )
        return checkpoint_id

    if op.kind == "cp-put":

        def step() -> str:
            latest = chains.get(thread, "", None)
            return put(None if latest is None else latest.checkpoint_id, "")

        call(op, step)
    elif op.kind == "cp-fork":

        def fork() -> str | None:
            page = chains.page(thread, "", None, None, None, PAGE)
            if len(page) < 2:
                return None  # nothing older to fork from: a no-op
            older = rng.choice(page[1:]).checkpoint_id
            return put(older, older)

        call(op, fork)
    elif op.kind == "cp-writes":
        count = rng.choice((1, 2, 3))
        twice = rng.random() < 0.33

        def writes() -> str | None:
            latest = chains.get(thread, "", None)
            if latest is None:
                return None
            rows = [(i, CHANNEL, _typed(f"{op.id}.{i}")) for i in range(count)]
            op.value = {"checkpoint": latest.checkpoint_id, "count": count, "op": op.id}
            for _ in range(2 if twice else 1):
                chains.put_writes(thread, "", latest.checkpoint_id, op.id, "", rows)
            return latest.checkpoint_id

        call(op, writes)
    elif op.kind == "cp-list":
        size = 10_000 if whole else PAGE

        def listing() -> list[str]:
            return [
                found.checkpoint_id for found in chains.page(thread, "", None, None, None, size)
            ]

        call(op, listing)
    elif op.kind == "cp-delete":
        own = delete_thread_of(op.session_id, op.client)

        def delete() -> None:
            first = put(None, "", own)
            latest = chains.get(own, "", None)
            put(latest.checkpoint_id if latest else first, "", own)
            chains.delete_threads([own])
            left = chains.get(own, "", None)
            if left is not None:
                raise DeletedThreadRead(
                    f"after delete_thread, the thread's latest checkpoint is {left.checkpoint_id}"
                )

        call(op, delete)
    else:

        def read() -> list[Any] | None:
            found = chains.get(thread, "", None)
            if found is None:
                return None
            value = found.blobs.get(CHANNEL)
            return [
                found.checkpoint_id,
                found.parent_checkpoint_id,
                None if value is None else value[1].decode(),
                sorted([w.task_id, w.idx] for w in found.writes),
            ]

        call(op, read)
    return op


# ---------------------------------------------------------------------------- what was stored


@dataclass
class StoredChain:
    #: checkpoint id -> (parent id, the op id in its checkpoint, the op id in its blob)
    checkpoints: dict[str, tuple[str | None, str, str | None]] = field(default_factory=dict)
    #: (checkpoint id, task id, idx) -> the token written
    writes: dict[str, str] = field(default_factory=dict)


def load_chains(using: str, session_ids: Iterable[str]) -> dict[str, StoredChain]:
    """Every checkpoint chain of the threads of these sessions (read-only), by thread id."""
    chains: dict[str, StoredChain] = defaultdict(StoredChain)
    prefixes = [f"{session}:" for session in session_ids]
    if not prefixes:
        return {}
    from django.db.models import Q

    mine = Q()
    for prefix in prefixes:
        mine |= Q(thread__thread_id__startswith=prefix)
    blobs = {
        (head, version): bytes(data).decode()
        for head, version, data in CheckpointBlob.objects.using(using)
        .filter(mine, channel=CHANNEL)
        .exclude(type="empty")
        .values_list("thread_id", "version", "blob")
    }
    for head, thread, checkpoint_id, parent, data in (
        Checkpoint.objects.using(using)
        .filter(mine)
        .values_list(
            "thread_id", "thread__thread_id", "checkpoint_id", "parent_checkpoint_id", "checkpoint"
        )
    ):
        chains[thread].checkpoints[checkpoint_id] = (
            parent,
            bytes(data).decode(),
            blobs.get((head, checkpoint_id)),
        )
    for thread, checkpoint_id, task_id, idx, data in (
        CheckpointWrite.objects.using(using)
        .filter(mine)
        .values_list("thread__thread_id", "checkpoint_id", "task_id", "idx", "blob")
    ):
        chains[thread].writes[f"{checkpoint_id}|{task_id}|{idx}"] = bytes(data).decode()
    return dict(chains)


def delete_threads(store: MemoryStore, session_ids: Iterable[str]) -> None:
    """Delete the chains of these sessions' threads (a run's clean-up)."""
    from ..models import CheckpointThread

    threads = set()
    for session in session_ids:
        rows = CheckpointThread.objects.using(store.using).filter(
            thread_id__startswith=f"{session}:"
        )
        threads.update(rows.values_list("thread_id", flat=True))
    if threads:
        store.checkpoints.delete_threads(sorted(threads))


# ---------------------------------------------------------------------------- the checks


@dataclass
class _Chain:
    session_id: str
    key: str
    ops: list[Operation]
    stored: StoredChain
    promoted: float
    found: list[Anomaly] = field(default_factory=list)

    def report(self, check: str, message: str, *involved: Operation) -> None:
        self.found.append(
            Anomaly(check, self.session_id, self.key, message, [brief(op) for op in involved])
        )

    def lost(self, check: str, op: Operation) -> str:
        """``check``, or ``lost-by-database`` for a call acknowledged before a failover."""
        return "lost-by-database" if op.invoked_at <= self.promoted else check


def check_checkpoints(
    history: Iterable[Operation], chains: dict[str, StoredChain], failovers: Any = ()
) -> list[Anomaly]:
    """Every checkpoint check over the history's checkpoint operations and what the database
    holds."""
    promoted = max((f.promoted_at for f in failovers), default=float("-inf"))
    keyed: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    deletes: list[Operation] = []
    for op in sorted(history, key=lambda o: o.invoked_at):
        if op.kind == "cp-delete":
            deletes.append(op)
        elif op.kind in KINDS:
            keyed[(op.session_id, op.key)].append(op)
    found: list[Anomaly] = []
    for session_id, key in sorted(keyed):
        chain = _Chain(
            session_id,
            key,
            keyed[(session_id, key)],
            chains.get(thread_of(session_id, key), StoredChain()),
            promoted,
        )
        for op in chain.ops:
            if op.status == "info" and not (op.error or "").startswith("MemoryUnavailable"):
                chain.report("caller-error", f"{op.kind} raised {op.error}", op)
        _check_steps(chain)
        _check_writes(chain)
        _check_reads(chain)
        _check_lists(chain)
        found += chain.found
    found += _check_deletes(deletes, chains, promoted)
    return found


def _check_steps(c: _Chain) -> None:
    by_op = {op.id: op for op in c.ops if op.kind in ("cp-put", "cp-fork")}
    stored_by_op = {token: cid for cid, (_p, token, _b) in c.stored.checkpoints.items()}
    for op in by_op.values():
        stored = stored_by_op.get(op.id)
        if op.status == "ok" and op.result is not None and stored is None:
            c.report(
                c.lost("checkpoint-write", op),
                f"acknowledged {op.kind} {op.result} is not stored",
                op,
            )
        elif op.status == "fail" and stored is not None:
            c.report(
                "checkpoint-write", f"{op.kind} failed ({op.error}) but {stored} is stored", op
            )
        if stored is not None and op.value and stored != op.value["id"]:
            c.report("checkpoint-write", f"{op.kind} put {op.value['id']}, {stored} is stored", op)
    children: dict[str | None, list[tuple[str, Operation | None]]] = defaultdict(list)
    for cid, (parent, token, blob) in sorted(c.stored.checkpoints.items()):
        op = by_op.get(token)
        if op is None:
            c.report("checkpoint-write", f"checkpoint {cid} was put by no call of the history")
        elif op.status == "fail":
            pass  # reported above: a failed call whose checkpoint is stored
        elif parent != op.value["parent"]:
            c.report(
                "checkpoint-fork",
                f"{cid} is stored under {parent}, its call put it under {op.value['parent']}",
                op,
            )
        if blob != token:
            c.report(
                "checkpoint-write",
                f"checkpoint {cid} holds channel value {blob!r}, not its own",
                *([op] if op else []),
            )
        children[parent].append((cid, op))
    for parent, kids in children.items():
        steps = [(cid, op) for cid, op in kids if op is not None and op.kind == "cp-put"]
        if parent is not None and len(steps) > 1:
            c.report(
                "checkpoint-fork",
                f"checkpoint {parent} has {len(steps)} children made by steps that each loaded it "
                f"as the latest ({', '.join(cid for cid, _ in steps)}): a silent fork",
                *[op for _, op in steps if op is not None],
            )


def _check_writes(c: _Chain) -> None:
    ops = {op.id: op for op in c.ops if op.kind == "cp-writes"}
    seen: dict[str, list[str]] = defaultdict(list)
    for where, token in c.stored.writes.items():
        checkpoint_id, task_id, idx = where.split("|")
        seen[task_id].append(idx)
        op = ops.get(task_id)
        if op is None or op.status == "fail":
            c.report(
                "checkpoint-write",
                f"write {where} was made by no call that did not fail",
                *([op] if op else []),
            )
        elif token != f"{task_id}.{idx}" or checkpoint_id != (op.value or {}).get("checkpoint"):
            # The checkpoint the call wrote to, whether or not its answer came back (a call that
            # lost its answer to a failover has no result, yet its writes may be stored).
            c.report("checkpoint-write", f"write {where} holds {token!r}", op)
    for op in ops.values():
        if op.status != "ok" or op.result is None:
            continue
        stored = sorted(seen.get(op.id, []))
        wanted = [str(i) for i in range(op.value["count"])]
        if stored != wanted:
            c.report(
                c.lost("checkpoint-write", op),
                f"acknowledged put_writes of {len(wanted)} writes: {len(stored)} stored",
                op,
            )


def _acknowledged_before(c: _Chain, op: Operation, kinds: tuple[str, ...]) -> list[Operation]:
    return [
        other
        for other in c.ops
        if other.kind in kinds
        and other.status == "ok"
        and other.result is not None
        and other.completed_at is not None
        and other.completed_at < op.invoked_at
        and other.invoked_at > c.promoted
    ]


def _check_reads(c: _Chain) -> None:
    for op in c.ops:
        if op.kind != "cp-read" or op.status != "ok" or op.invoked_at <= c.promoted:
            continue
        steps = _acknowledged_before(c, op, ("cp-put", "cp-fork"))
        newest = max((s.result for s in steps), default=None)
        if op.result is None:
            if newest is not None:
                c.report("checkpoint-read", f"read nothing after {newest} was acknowledged", op)
            continue
        checkpoint_id, parent, blob, writes = op.result
        stored = c.stored.checkpoints.get(checkpoint_id)
        if stored is None:
            c.report("checkpoint-read", f"read {checkpoint_id}, which is not stored", op)
            continue
        if stored[0] != parent or blob != stored[1]:
            c.report(
                "checkpoint-read",
                f"read {checkpoint_id} with parent {parent} and value {blob!r}; stored: {stored}",
                op,
            )
        if newest is not None and checkpoint_id < newest:
            c.report(
                "checkpoint-read",
                f"read {checkpoint_id} as the latest after {newest} was acknowledged",
                op,
                *[s for s in steps if s.result == newest],
            )
        have = {tuple(w) for w in writes}
        for w in _acknowledged_before(c, op, ("cp-writes",)):
            if (
                w.result == checkpoint_id
                and not {(w.id, i) for i in range(w.value["count"])} <= have
            ):
                c.report(
                    "checkpoint-read",
                    f"read {checkpoint_id} without the writes {w.id} made to it before the read began",
                    op,
                    w,
                )


def _check_lists(c: _Chain) -> None:
    for op in c.ops:
        if op.kind != "cp-list" or op.status != "ok" or op.invoked_at <= c.promoted:
            continue
        listed = op.result or []
        if listed != sorted(listed, reverse=True) or len(set(listed)) != len(listed):
            c.report("checkpoint-list", f"listed {listed}: not newest first, each once", op)
            continue
        missing = [cid for cid in listed if cid not in c.stored.checkpoints]
        if missing:
            c.report("checkpoint-list", f"listed {missing}, which are not stored", op)
        oldest = listed[-1] if len(listed) >= PAGE else ""
        for step in _acknowledged_before(c, op, ("cp-put", "cp-fork")):
            if step.result > oldest and step.result not in listed:
                c.report(
                    "checkpoint-list",
                    f"the listing left out {step.result}, acknowledged before it began",
                    op,
                    step,
                )


def _check_deletes(
    deletes: list[Operation], chains: dict[str, StoredChain], promoted: float
) -> list[Anomaly]:
    found = []
    last: dict[str, Operation] = {}
    for op in deletes:
        if op.status == "fail":
            # The thread is its client's alone: a conflict on it means the database lost what
            # the call had written -- a failover's loss, if the call began before the promotion.
            lost = op.invoked_at <= promoted
            found.append(
                Anomaly(
                    "lost-by-database" if lost else "checkpoint-delete",
                    op.session_id,
                    op.key,
                    ("a failover lost what this call wrote first: " if lost else "")
                    + (op.error or ""),
                    [brief(op)],
                )
            )
        last[delete_thread_of(op.session_id, op.client)] = op
    for thread, op in last.items():
        left = chains.get(thread)
        if op.status == "ok" and left is not None and left.checkpoints:
            found.append(
                Anomaly(
                    "lost-by-database" if op.invoked_at <= promoted else "checkpoint-delete",
                    op.session_id,
                    op.key,
                    f"after delete_thread, {thread} still holds {sorted(left.checkpoints)}",
                    [brief(op)],
                )
            )
    return found
