"""The immutable values the store hands back to callers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class Op(StrEnum):
    """What a version did: the one list of operations (the history column's choices too)."""

    WRITE = "write"
    FORGET = "forget"
    EXPIRE = "expire"
    REVERT = "revert"


#: The operations whose version holds a value (the others retire the memory).
VALUE_OPS = frozenset({Op.WRITE, Op.REVERT})


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """One memory as it is at ``version``. ``value`` is a fresh copy decoded for this caller."""

    session_id: str
    key: str
    value: Any
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None


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
