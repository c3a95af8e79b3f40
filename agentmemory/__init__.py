"""agentmemory: versioned, concurrency-safe key-value memory for Django-based AI agents."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.5.0"

from .errors import (
    AgentMemoryError,
    CheckpointConflict,
    EmbeddingFailed,
    IdempotencyKeyReused,
    InvalidMemory,
    MemoryUnavailable,
    ReentrantWrite,
    SessionMoved,
    VersionConflict,
    VersionPruned,
)
from .records import (
    LogEventRecord,
    LogItemRecord,
    LogOp,
    MemoryRecord,
    MemoryVersionRecord,
    ScoredMemory,
)
from .semantic import Index

if TYPE_CHECKING:
    from .sharding import ShardedStore
    from .store import MemoryStore

__all__ = [
    "AgentMemoryError",
    "CheckpointConflict",
    "EmbeddingFailed",
    "IdempotencyKeyReused",
    "Index",
    "InvalidMemory",
    "LogEventRecord",
    "LogItemRecord",
    "LogOp",
    "MemoryRecord",
    "MemoryStore",
    "MemoryUnavailable",
    "MemoryVersionRecord",
    "ReentrantWrite",
    "ScoredMemory",
    "SessionMoved",
    "ShardedStore",
    "VersionConflict",
    "VersionPruned",
    "setup",
]


def setup(database: str, *, cache: str | None = None, index: Index | None = None) -> MemoryStore:
    """A store from a database URL, without a Django project: :func:`agentmemory.standalone.setup`
    (``agentmemory.setup("sqlite:///memory.db")``)."""
    from .standalone import setup as configured

    return configured(database, cache=cache, index=index)


def __getattr__(name: str) -> Any:
    # MemoryStore imports the models, which need the app registry: import it on first use so
    # that `import agentmemory` works in settings files too.
    if name == "MemoryStore":
        from .store import MemoryStore

        return MemoryStore
    if name == "ShardedStore":
        from .sharding import ShardedStore

        return ShardedStore
    raise AttributeError(f"module 'agentmemory' has no attribute {name!r}")
