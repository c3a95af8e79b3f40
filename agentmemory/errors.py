"""Errors raised by the store. All derive from :class:`AgentMemoryError`."""

from __future__ import annotations


class AgentMemoryError(Exception):
    """Base class of every error agentmemory raises on purpose."""


class VersionConflict(AgentMemoryError):
    """A compare-and-set write found another version than the one it expected; nothing was written."""

    def __init__(self, session_id: str, key: str, *, expected: int, actual: int) -> None:
        self.session_id = session_id
        self.key = key
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"version conflict on ({session_id!r}, {key!r}): expected version {expected}, "
            f"current version is {actual}"
        )


class CheckpointConflict(AgentMemoryError):
    """A checkpoint was put as the child of ``parent`` by a writer that had loaded the chain's
    latest checkpoint, but another writer extended the chain first (its latest is now
    ``latest``): storing it would fork the chain silently. Nothing was written. Reload the
    thread's state and run the step again -- or, to branch on purpose, put from a checkpoint
    asked for by its id (LangGraph's time travel)."""

    def __init__(
        self, thread_id: str, checkpoint_ns: str, *, parent: str, latest: str | None
    ) -> None:
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.parent = parent
        self.latest = latest
        chain = f"thread {thread_id!r}" + (f" namespace {checkpoint_ns!r}" if checkpoint_ns else "")
        super().__init__(
            f"checkpoint conflict on {chain}: this writer extends checkpoint {parent!r}, but "
            f"another writer extended the chain first (its latest checkpoint is {latest!r}); "
            "nothing was written"
        )


class InvalidMemory(AgentMemoryError, ValueError):
    """An argument broke a rule of the contract; the message names the field and the limit."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        #: What was wrong, without the field's name.
        self.message = message
        super().__init__(f"{field}: {message}")


class ReentrantWrite(InvalidMemory):
    """A write to the store was called from inside a write of the same database -- from the
    ``fn`` of :meth:`~agentmemory.MemoryStore.update` (or the LangGraph adapter's ``modify``),
    which runs under a row lock inside the outer write's transaction. Raised before the inner
    call sends any statement; the outer write then fails too, and nothing of either is written.
    Compute the value in ``fn``; write other keys after ``update`` returns, or together with
    ``remember_many``."""

    def __init__(self, using: str) -> None:
        super().__init__(
            "fn",
            f"a store write on database {using!r} was called inside a write of the same "
            "database (update's fn runs under the row lock: it must only compute the new "
            "value); nothing was written",
        )


class IdempotencyKeyReused(InvalidMemory):
    """An idempotency key came back with a different request: another operation (an append
    after a pop), another value, other items. A key identifies one request -- a retry repeats
    it exactly -- so the store refuses, writes nothing, and does not answer as if the new
    request had happened (as Stripe's API and the IETF idempotency-key draft do). ``field`` is
    ``"idempotency_key"``; ``key`` is the idempotency key; ``stored`` says what it was used
    for."""

    def __init__(self, idempotency_key: str, stored: str, asked: str) -> None:
        self.key = idempotency_key
        self.stored = stored
        super().__init__(
            "idempotency_key",
            f"{idempotency_key!r} was already used for another request ({stored}); this call "
            f"asks for {asked}. Use a new key for a new request; nothing was written",
        )


class VersionPruned(AgentMemoryError, LookupError):
    """The version asked for was removed by the history retention policy (``prune_history``);
    the history is kept from ``kept_from`` on."""

    def __init__(self, session_id: str, key: str, *, version: int, kept_from: int) -> None:
        self.session_id = session_id
        self.key = key
        self.version = version
        self.kept_from = kept_from
        super().__init__(
            f"version {version} of ({session_id!r}, {key!r}) was pruned: the history is kept "
            f"from version {kept_from}"
        )


class MemoryUnavailable(AgentMemoryError):
    """The database stayed unreachable (or kept failing transiently) after every retry, or the
    outcome of a write is unknown: on PostgreSQL, a COMMIT that came back with the warning that
    its wait for the synchronous standby was cancelled (committed on the primary only; ``cause``
    is None). Retry with the same ``idempotency_key``."""

    def __init__(
        self, message: str, *, cause: BaseException | None = None, attempts: int = 0
    ) -> None:
        self.cause = cause
        self.attempts = attempts
        super().__init__(message)


class SessionMoved(AgentMemoryError):
    """A write reached a shard that ``session_id`` has been moved away from (``manage.py
    move_sessions``); it lives on ``shard`` now and nothing was written. A
    :class:`~agentmemory.ShardedStore` follows it by itself: only a shard's own store, called
    directly, raises it."""

    def __init__(self, session_id: str, left: str, shard: str) -> None:
        self.session_id = session_id
        self.left = left
        self.shard = shard
        super().__init__(
            f"session {session_id!r} moved from shard {left!r} to shard {shard!r}: nothing was "
            "written here"
        )


class EmbeddingFailed(AgentMemoryError):
    """The semantic index's embedder raised, timed out, or returned something other than one
    vector of ``dims`` finite numbers per text. Nothing was written."""

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        self.cause = cause
        super().__init__(message)
