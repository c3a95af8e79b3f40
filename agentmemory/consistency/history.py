"""A recorded history: every operation of a run, as invoked and as completed.

Times are the store's clock (``agentmemory.clock``) as POSIX seconds, so they compare with the
``created_at``/``expires_at`` the store wrote, across threads and processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "fail", "info"]  # info: indeterminate, the write may or may not have applied

WRITE_KINDS = frozenset(
    {"remember", "cas", "append", "ttl-write", "retry", "many", "txn-write", "update"}
)
READ_KINDS = frozenset({"recall"})
#: The log workload's kinds (:mod:`agentmemory.consistency.logs`): judged by the log checks only.
#: The SDK session workload's kinds are log kinds: its calls are the log calls they make, judged by
#: the log checks (with the numbers the items were stored at, which the SDK does not return).
SDK_KINDS = frozenset({"sdk-add", "sdk-pop", "sdk-clear", "sdk-get"})
LOG_KINDS = frozenset({"log-append", "log-retry", "log-pop", "log-clear", "log-read"}) | SDK_KINDS
#: The checkpoint workload's kinds (:mod:`agentmemory.consistency.checkpoints`): judged by the
#: checkpoint checks only.
CHECKPOINT_KINDS = frozenset({"cp-put", "cp-fork", "cp-writes", "cp-read", "cp-list", "cp-delete"})
#: The ADK workload's kinds (:mod:`agentmemory.consistency.adk`): judged by the ADK checks only.
ADK_KINDS = frozenset({"adk-append", "adk-get"})
#: The error of a call whose caller's own transaction met a transient error (the store cannot
#: retry inside it): expected -- a conflict rolled it back (fail), a lost connection left its
#: outcome unknown (info).
IN_TRANSACTION = "Transient in the caller's transaction"


def allowed_without_answer(error: str) -> bool:
    """Whether a call may end without an answer with this error, by the contract: the store
    said it could not (``MemoryUnavailable``), or the caller's own transaction met a transient
    error; or memcheck's own fault crashed the writer. Any other error that reaches a caller is
    an anomaly (check ``caller-error``)."""
    return error.startswith(("MemoryUnavailable", IN_TRANSACTION, DATABASE_LOST, WRITER_CRASHED))


#: The error of a write that memcheck's writer-crash fault crashed right after its COMMIT
#: (:class:`~agentmemory.defects.WriterCrashed`): indeterminate, as a dead process's call is.
WRITER_CRASHED = "WriterCrashed"


#: The error a retry is judged with when the database lost its first call (a failover, a
#: restore): it wrote again as a new request -- indeterminate, the database's consequence.
DATABASE_LOST = "DatabaseLostTheFirstCall"


@dataclass
class Operation:
    id: str
    client: str
    # remember | cas | append | ttl-write | retry | many | txn-write | update | recall | forget |
    # erase | bad-input (a recall_many or a search is recorded as one recall per key) | one of
    # LOG_KINDS (key: the stream; value: the items appended; result: the numbers an append was
    # given, a pop's [seq, token], a clear's count, a read's [[seq, token], ...])
    kind: str
    session_id: str
    key: str
    invoked_at: float
    value: Any = None  # the value written (writes embed the op id, so each is unique)
    expected_version: int | None = None
    idempotency_key: str | None = None
    completed_at: float | None = None
    status: Status | None = None
    version: int | None = None  # the version written or read
    result: Any = None  # the value read
    expires_at: float | None = None  # of the record written or read
    error: str | None = None
    source: str | None = None  # of a read: "cache" or "database"
    node: str | None = None  # the database alias the client was pinned to
    ttl: float | None = None  # of a write: the TTL asked for (or the default), seconds
    prefix: str | None = None  # of a read made by recall_many(prefix=)
    query: str | None = None  # of a read made by search(query): the query
    score: float | None = None  # and the score it gave the version read

    @property
    def is_write(self) -> bool:
        return self.kind in WRITE_KINDS

    @property
    def token(self) -> str | None:
        """The unique token of the value this op wrote (for an append, the element appended)."""
        return token_of(self.value)


def token_of(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("op")
    if isinstance(value, list) and value:
        return token_of(value[-1]) if isinstance(value[-1], dict) else str(value[-1])
    if isinstance(value, str):
        return value
    return None


@dataclass
class History:
    run_id: str
    operations: list[Operation] = field(default_factory=list)

    def extend(self, operations: list[Operation]) -> None:
        self.operations.extend(operations)

    def by_key(self) -> dict[tuple[str, str], list[Operation]]:
        keyed: dict[tuple[str, str], list[Operation]] = {}
        for op in sorted(self.operations, key=lambda o: o.invoked_at):
            keyed.setdefault((op.session_id, op.key), []).append(op)
        return keyed
