"""The immutable values the store hands back to callers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class Op(StrEnum):
    """What a version did: the one list of operations (the history column's choices too)."""

    WRITE = "write"
    FORGET = "forget"
    EXPIRE = "expire"
    REVERT = "revert"


class LogOp(StrEnum):
    """What an event of a log did: the one list of a log's operations."""

    APPEND = "append"
    POP = "pop"
    CLEAR = "clear"
    EXPIRE = "expire"


#: The operations whose version holds a value (the others retire the memory).
VALUE_OPS = frozenset({Op.WRITE, Op.REVERT})


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """One memory as it is at ``version``. ``value`` is a fresh copy decoded for this caller.

    ``replayed`` (keyword-only, not compared): True when a write returned the version an earlier
    call with the same ``idempotency_key`` wrote, and wrote nothing itself."""

    session_id: str
    key: str
    value: Any
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    replayed: bool = field(default=False, compare=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class ScoredMemory(MemoryRecord):
    """A search result: the memory as it is at ``version``, and ``score``, the cosine similarity
    of the query to that version's vectors (the best of them, if several texts were indexed)."""

    score: float


@dataclass(frozen=True, slots=True)
class MemoryVersionRecord:
    """One entry of a memory's history. ``value`` is None for ``forget`` and ``expire``."""

    version: int
    op: Op
    value: Any
    created_at: datetime
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LogItemRecord:
    """One item of a log: ``seq`` is its number (1, 2, 3, ... with no gap and no reuse, so it
    orders the log). ``value`` is a fresh copy decoded for this caller."""

    session_id: str
    stream: str
    seq: int
    value: Any
    created_at: datetime


@dataclass(frozen=True, slots=True)
class LogEventRecord:
    """One event of a log's history: ``op`` did it to items ``first_seq``..``last_seq`` (an
    append: those it added; a pop: the one it removed; a clear or an expiry: the range it hid),
    changing the live items by ``count``."""

    version: int
    op: LogOp
    first_seq: int
    last_seq: int
    count: int
    created_at: datetime


# ---------------------------------------------------------------------- checkpoint chains

#: A serializer's output: ``(type, bytes)`` as LangGraph's ``dumps_typed`` returns it.
Typed = tuple[str, bytes]
#: How many checkpoints one read of a listing fetches (with their blobs and writes).
CHECKPOINT_PAGE = 100


@dataclass(frozen=True, slots=True)
class StoredWrite:
    task_id: str
    channel: str
    value: Typed
    task_path: str
    idx: int


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as stored, with the blobs of its channel versions and its pending writes
    (in LangGraph's ``writes_sort_key`` order: task path, task id, index)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: Typed
    metadata: Typed
    #: channel -> its value at the checkpoint's version (channels written empty are left out).
    blobs: dict[str, Typed]
    writes: list[StoredWrite] = field(default_factory=list)
    # The order of a listing: (checkpoint id, chain's head id), newest first; over shards
    # (agentmemory.sharding.ShardedCheckpoints) the shard's alias too.
    cursor: tuple[Any, ...] = ("", 0)


@dataclass(frozen=True, slots=True)
class NewBlob:
    channel: str
    version: str
    value: Typed | None  # None: the channel was written empty ("empty" in LangGraph's savers)


@dataclass(frozen=True, slots=True)
class ChannelHistory:
    """One channel's part of :meth:`CheckpointPath.delta_history`."""

    writes: list[StoredWrite]  # oldest first
    seed: Typed | None  # the value at the nearest ancestor that holds one (None: no such)
