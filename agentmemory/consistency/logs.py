"""memcheck's ``log`` workload, what it left in the database, and the checks of it.

Streams ``log-N`` of the run's sessions get appends (one item, or a batch of two or three -- a
quarter of the batches failed after their first item by an injected failure), appends sent twice
with one idempotency key, pops, clears and reads (every item, or the latest three) from every
client. Every item embeds a unique token (``<op id>.<index>``), every mutation carries its op id
as idempotency key, so every stored item maps to the call that appended it and every event to the
call that made it.

The checks judge the history against the stored items and events, per stream, in one pass:

- ``log-append``: every acknowledged append is stored once, at the numbers it was given, in its
  order; one that failed is not stored at all, one of unknown outcome all or nothing; every stored
  item was appended by a call that did not fail;
- ``log-sequence``: items are numbered 1, 2, 3, ... with no gap or reuse, events likewise, and the
  head counts them;
- ``log-pop``: no item is popped twice, and a pop removed exactly the item it returned;
- ``log-read``: a read returns items in order, each as stored, none removed by a call acknowledged
  before the read began, every one acknowledged before it began and not removed before it ended
  (a window of the latest N: every one above its oldest), and never goes back on what the same
  client read before.

The SDK session workload (streams ``sdk-N``) makes its calls through ``AgentMemorySession``, as
the OpenAI Agents SDK makes them: ``add_items`` (``sdk-add``), ``pop_item`` (``sdk-pop``),
``get_items`` (``sdk-get``: every item, or the latest three) and ``clear_session``
(``sdk-clear``), with no idempotency key (the SDK has none) and no item numbers in what they
return. The checks judge each as the log call it makes, with the numbers its items' tokens are
stored at; a pop is tied to the event that removed the item it returned.

After a database failover (an asynchronous standby promoted), an acknowledged append the database
lost is ``lost-by-database``, and what ran before the promotion is judged by order only (an SDK
call's reads not at all: their numbers are found in what the database holds in the end, which may
lack what they saw). An SDK pop is tied to its event preferring a pop after the promotion, so a
pop before it whose item was popped again is taken as lost with the old primary -- the SDK gives
no request id that would tell.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import math
import random
from collections import defaultdict
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..defects import fail_after_first_key
from ..models import Log, LogEvent, LogItem
from ..records import LogOp
from ..store import MemoryStore
from .checker import Anomaly, brief
from .history import DATABASE_LOST, Operation, allowed_without_answer
from .history import LOG_KINDS as KINDS

MUTATIONS = frozenset(
    {"log-append", "log-retry", "log-pop", "log-clear", "sdk-add", "sdk-pop", "sdk-clear"}
)
#: The log call each call of the SDK session makes.
SDK_AS_LOG = {
    "sdk-add": "log-append",
    "sdk-pop": "log-pop",
    "sdk-clear": "log-clear",
    "sdk-get": "log-read",
}
#: The window of a limited read.
WINDOW = 3


class RetryAnsweredDifferently(Exception):
    """An append sent again with its idempotency key answered differently from the first."""


def choose_kind(rng: random.Random) -> str:
    return rng.choices(
        ["log-read", "log-append", "log-retry", "log-pop", "log-clear"],
        weights=[30, 32, 10, 24, 4],
    )[0]


def choose_sdk_kind(rng: random.Random) -> str:
    return rng.choices(["sdk-get", "sdk-add", "sdk-pop", "sdk-clear"], weights=[30, 42, 24, 4])[0]


def run_op(
    store: MemoryStore,
    rng: random.Random,
    op: Operation,
    call: Any,
    *,
    whole: bool = False,
) -> Operation:
    """One call of the log workload on ``store``, recorded into ``op`` (``call``: the
    workload's recorder). A read takes every item, or (a third of them, unless ``whole``) the
    latest :data:`WINDOW`."""
    if op.kind in SDK_AS_LOG:
        return _run_sdk_op(store, rng, op, call, whole=whole)
    session_id, stream = op.session_id, op.key
    if op.kind in ("log-append", "log-retry"):
        size = 1 if op.kind == "log-retry" or rng.random() < 0.6 else rng.choice((2, 3))
        items = [{"op": f"{op.id}.{i}", "s": session_id, "k": stream} for i in range(size)]
        op.value, op.idempotency_key = items, op.id
        failing = size > 1 and rng.random() < 0.25

        def append() -> list[int]:
            with fail_after_first_key() if failing else nullcontext():
                first = store.append(session_id, stream, items, idempotency_key=op.id)
            if op.kind == "log-retry":
                again = store.append(session_id, stream, items, idempotency_key=op.id)
                if [r.seq for r in again] != [r.seq for r in first]:
                    raise RetryAnsweredDifferently(
                        f"the retry returned {[r.seq for r in again]}, the first call "
                        f"{[r.seq for r in first]}"
                    )
            return [r.seq for r in first]

        call(op, append)
    elif op.kind == "log-pop":
        op.idempotency_key = op.id

        def pop() -> list[Any] | None:
            found = store.pop(session_id, stream, idempotency_key=op.id)
            return None if found is None else [found.seq, _token(found.value)]

        call(op, pop)
    elif op.kind == "log-clear":
        op.idempotency_key = op.id
        call(op, lambda: store.clear_log(session_id, stream, idempotency_key=op.id))
    else:
        limit = None if whole or rng.random() >= 0.3 else WINDOW
        op.expected_version = limit  # the window asked for (None: every item)

        def read() -> list[list[Any]]:
            found = store.read_log(session_id, stream, limit=limit)
            return [[r.seq, _token(r.value)] for r in found]

        call(op, read)
    return op


def _run_sdk_op(
    store: MemoryStore, rng: random.Random, op: Operation, call: Any, *, whole: bool
) -> Operation:
    """One call of the SDK session workload, made as the SDK makes it (a coroutine, here run to
    completion by this worker thread). Results are recorded as the log calls' are, with item
    number 0 (unknown: the SDK returns values only) -- the checks find the numbers by token."""
    from ..integrations.openai_agents import AgentMemorySession

    session = AgentMemorySession(op.session_id, store=store, stream=op.key)
    if op.kind == "sdk-add":
        size = 1 if rng.random() < 0.6 else rng.choice((2, 3))
        items = [{"op": f"{op.id}.{i}", "s": op.session_id, "k": op.key} for i in range(size)]
        op.value = items
        call(op, lambda: asyncio.run(session.add_items(items)))
    elif op.kind == "sdk-pop":

        def pop() -> list[Any] | None:
            found = asyncio.run(session.pop_item())
            return None if found is None else [0, _token(found)]

        call(op, pop)
    elif op.kind == "sdk-clear":
        call(op, lambda: asyncio.run(session.clear_session()))
    else:
        limit = None if whole or rng.random() >= 0.3 else WINDOW
        op.expected_version = limit

        def read() -> list[list[Any]]:
            return [[0, _token(item)] for item in asyncio.run(session.get_items(limit))]

        call(op, read)
    return op


def _token(value: Any) -> str | None:
    return value.get("op") if isinstance(value, dict) else None


# ---------------------------------------------------------------------------- what was stored


@dataclass
class StoredLog:
    last_seq: int = 0
    length: int = 0
    cleared_through: int = 0
    version: int = 0
    heads: int = 0
    #: seq -> (token, removed_in)
    items: dict[int, tuple[str | None, int | None]] = field(default_factory=dict)
    #: version -> (op, first_seq, last_seq, count, request_id)
    events: dict[int, tuple[str, int, int, int, str]] = field(default_factory=dict)
    duplicate_seqs: list[int] = field(default_factory=list)


def load_logs(using: str, session_ids: Iterable[str]) -> dict[tuple[str, str], StoredLog]:
    """Every log of these sessions: heads, items and events (read-only)."""
    sessions = list(session_ids)
    logs: dict[tuple[str, str], StoredLog] = defaultdict(StoredLog)
    heads = Log.objects.using(using).filter(session_id__in=sessions)
    for session_id, stream, last, length, cleared, version in heads.values_list(
        "session_id", "stream", "last_seq", "length", "cleared_through", "version"
    ):
        stored = logs[(session_id, stream)]
        stored.heads += 1
        stored.last_seq, stored.length, stored.cleared_through = last, length, cleared
        stored.version = version
    items = LogItem.objects.using(using).filter(log__session_id__in=sessions)
    for session_id, stream, seq, value, removed_in in items.values_list(
        "log__session_id", "log__stream", "seq", "value", "removed_in"
    ):
        stored = logs[(session_id, stream)]
        if seq in stored.items:
            stored.duplicate_seqs.append(seq)
        stored.items[seq] = (_token(value), removed_in)
    events = LogEvent.objects.using(using).filter(log__session_id__in=sessions)
    for session_id, stream, version, op, first, last, count, request_id in events.values_list(
        "log__session_id",
        "log__stream",
        "version",
        "op",
        "first_seq",
        "last_seq",
        "count",
        "request_id",
    ):
        logs[(session_id, stream)].events[version] = (op, first, last, count, request_id)
    return dict(logs)


# ---------------------------------------------------------------------------- the checks


@dataclass
class _Stream:
    """One stream's history and stored state, with the maps the checks share."""

    session_id: str
    stream: str
    ops: list[Operation]
    stored: StoredLog
    promoted: float  # the last failover's promotion (-inf: none)
    found: list[Anomaly] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ops = _numbered(self.ops, self.stored)
        self.appender: dict[str, Operation] = {}
        for op in self.ops:
            if _as_log(op) in ("log-append", "log-retry"):
                for item in op.value or []:
                    self.appender[item["op"]] = op
        self.by_request = {
            f"k:{op.id}": op for op in self.ops if op.kind in MUTATIONS and op.idempotency_key
        }
        # An SDK pop carries no key of ours: it is tied to the pop event that removed its item
        # -- a pop after the last failover's promotion first (one before it may have been lost
        # with the old primary, and its item popped again).
        self.request_of = {op.id: f"k:{op.id}" for op in self.by_request.values()}
        for op in sorted(self.ops, key=lambda op: not self.judged(op)):
            if op.kind == "sdk-pop" and op.status == "ok" and op.result is not None:
                removed_in = self.stored.items.get(op.result[0], (None, None))[1]
                event = self.stored.events.get(removed_in or 0)
                if event is not None and event[0] == LogOp.POP and event[4] not in self.by_request:
                    self.by_request[event[4]] = op
                    self.request_of[op.id] = event[4]
        # seq -> the event that removed it (a pop's, or the clear or expiry that hid it)
        self.removed_by: dict[int, int] = {}
        for version, (kind, first, last, _count, _request) in sorted(self.stored.events.items()):
            if kind in (LogOp.CLEAR, LogOp.EXPIRE):
                for seq in range(first, last + 1):
                    if self.stored.items.get(seq, (None, None))[1] is None:
                        self.removed_by.setdefault(seq, version)
        for seq, (_token, removed_in) in self.stored.items.items():
            if removed_in is not None:
                self.removed_by[seq] = removed_in

    def report(self, check: str, message: str, *involved: Operation) -> None:
        self.found.append(
            Anomaly(check, self.session_id, self.stream, message, [brief(op) for op in involved])
        )

    def remover(self, seq: int) -> tuple[bool, Operation | None]:
        """Whether item ``seq`` was removed, and by which call of the history (None: an expiry,
        or a call whose request id is not the workload's)."""
        version = self.removed_by.get(seq)
        if version is None:
            return False, None
        event = self.stored.events.get(version)
        return True, None if event is None else self.by_request.get(event[4])

    def own_event(self, op: Operation, event: tuple[str, int, int, int, str] | None) -> bool:
        """Whether ``event`` is the one ``op`` made."""
        return event is not None and event[4] == self.request_of.get(op.id)

    def judged(self, op: Operation) -> bool:
        """Whether ``op`` ran after the last failover's promotion (or there was none)."""
        return op.invoked_at > self.promoted


def _as_log(op: Operation) -> str:
    """The log call ``op`` made (an SDK session's call: the log call it makes)."""
    return SDK_AS_LOG.get(op.kind, op.kind)


def _numbered(ops: list[Operation], stored: StoredLog) -> list[Operation]:
    """The calls, each SDK session call that succeeded with the numbers its items are stored at
    (found by token; 0 where none is): what the log calls return, and the SDK's do not."""
    at: dict[str | None, int] = {}
    for seq, (token, _removed) in sorted(stored.items.items()):
        at.setdefault(token, seq)
    numbered = []
    for op in ops:
        if op.kind not in SDK_AS_LOG or op.status != "ok":
            numbered.append(op)
            continue
        result = op.result
        if op.kind == "sdk-add":
            result = [at[item["op"]] for item in op.value or [] if item["op"] in at]
        elif op.kind == "sdk-pop" and result is not None:
            result = [at.get(result[1], 0), result[1]]
        elif op.kind == "sdk-get":
            result = [[at.get(token, 0), token] for _seq, token in result or []]
        numbered.append(dataclasses.replace(op, result=result))
    return numbered


def check_logs(
    history: Iterable[Operation],
    logs: dict[tuple[str, str], StoredLog],
    failovers: Any = (),
) -> list[Anomaly]:
    """Every log check over the history's log operations and what the database holds."""
    promoted = max((f.promoted_at for f in failovers), default=float("-inf"))
    keyed: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for op in sorted(history, key=lambda o: o.invoked_at):
        if op.kind in KINDS:
            if (
                op.kind == "log-retry"
                and op.status == "fail"
                and (op.error or "").startswith(RetryAnsweredDifferently.__name__)
                and op.invoked_at <= promoted
            ):
                # The database lost the first call with the old primary: the retry wrote again,
                # as a new request. Indeterminate, and the database's consequence.
                op = dataclasses.replace(op, status="info", error=f"{DATABASE_LOST}: {op.error}")
            keyed[(op.session_id, op.key)].append(op)
    found: list[Anomaly] = []
    for pair in sorted(set(keyed) | set(logs)):
        stream = _Stream(*pair, keyed.get(pair, []), logs.get(pair, StoredLog()), promoted)
        for op in stream.ops:
            if op.status == "info" and not allowed_without_answer(op.error or ""):
                stream.report("caller-error", f"{op.kind} raised {op.error}", op)
        _check_sequence(stream)
        _check_appends(stream)
        _check_pops(stream)
        _check_reads(stream)
        found += stream.found
    return found


def _check_sequence(s: _Stream) -> None:
    stored = s.stored
    if stored.heads > 1:
        s.report("log-sequence", f"{stored.heads} heads for one (session_id, stream)")
    numbers = sorted(stored.items)
    if numbers != list(range(1, stored.last_seq + 1)) or stored.duplicate_seqs:
        s.report(
            "log-sequence",
            f"items are numbered {_span(numbers)} (the head's last number: {stored.last_seq})"
            + (f", {sorted(set(stored.duplicate_seqs))} twice" if stored.duplicate_seqs else ""),
        )
    live = sum(
        1
        for seq, (_token, removed_in) in stored.items.items()
        if seq > stored.cleared_through and removed_in is None
    )
    if live != stored.length:
        s.report("log-sequence", f"the head counts {stored.length} live items, there are {live}")
    versions = sorted(stored.events)
    if versions != list(range(1, stored.version + 1)):
        s.report(
            "log-sequence",
            f"events are numbered {_span(versions)} (the head's version: {stored.version})",
        )


def _check_appends(s: _Stream) -> None:
    at: dict[str, list[int]] = defaultdict(list)
    for seq, (token, _removed) in sorted(s.stored.items.items()):
        at[token or ""].append(seq)
        writer = s.appender.get(token or "")
        if writer is None or writer.status == "fail":
            why = "no call appended" if writer is None else f"a call that failed ({writer.error})"
            s.report(
                "log-append",
                f"item #{seq} holds {token}, which {why}",
                *([writer] if writer else []),
            )
    for op in s.ops:
        if _as_log(op) not in ("log-append", "log-retry"):
            continue
        tokens = [item["op"] for item in op.value or []]
        stored = [at.get(token, []) for token in tokens]
        if op.status == "fail" and (op.error or "").startswith("RetryAnsweredDifferently"):
            s.report("log-append", f"a retried append answered differently: {op.error}", op)
        if any(len(seqs) > 1 for seqs in stored):
            twice = {t: seqs for t, seqs in zip(tokens, stored, strict=True) if len(seqs) > 1}
            s.report("log-append", f"append {op.id} is stored more than once: {twice}", op)
        kept = [seqs[0] for seqs in stored if seqs]
        if op.status == "ok":
            if len(kept) < len(tokens):
                check = "log-append" if s.judged(op) else "lost-by-database"
                s.report(
                    check,
                    f"acknowledged append {op.id} of {len(tokens)} item(s) is stored as "
                    f"{kept or 'nothing'} (acknowledged as {op.result})",
                    op,
                )
            elif kept != op.result or kept != list(range(kept[0], kept[0] + len(kept))):
                s.report(
                    "log-append",
                    f"append {op.id} was acknowledged as {op.result}, its items are stored "
                    f"at {kept}",
                    op,
                )
        elif kept and (op.status == "fail" or len(kept) < len(tokens)):
            s.report(
                "log-append",
                f"append {op.id} ({op.status}: {op.error}) left {len(kept)} of its "
                f"{len(tokens)} item(s), at {kept}",
                op,
            )


def _check_pops(s: _Stream) -> None:
    popped: dict[str, list[Operation]] = defaultdict(list)
    for op in s.ops:
        if _as_log(op) != "log-pop" or op.status != "ok" or op.result is None:
            continue
        seq, token = op.result
        stored_token, removed_in = s.stored.items.get(seq, (None, None))
        event = s.stored.events.get(removed_in or 0)
        # Before a failover: a pop whose event the database does not hold was lost by it (the
        # item came back, and a later pop may rightly return it again).
        if not s.judged(op) and not s.own_event(op, event):
            if (op.completed_at or 0) <= s.promoted:
                s.report(
                    "lost-by-database",
                    f"acknowledged pop {op.id} of #{seq} was lost by the database: a "
                    "failover promoted a standby that had not received it (asynchronous "
                    "replication)",
                    op,
                )
            continue
        popped[token].append(op)
        if not s.judged(op):
            continue
        if stored_token != token:
            s.report("log-pop", f"pop returned #{seq} = {token}, #{seq} holds {stored_token}", op)
        elif removed_in is None:
            s.report("log-pop", f"pop returned #{seq}, which is still live", op)
        elif event is not None and event[4] in s.by_request and not s.own_event(op, event):
            taker = s.by_request.get(event[4])
            s.report(
                "log-pop",
                f"pop returned #{seq}, which the event of another call removed "
                f"({event[0]} e{removed_in})",
                op,
                *([taker] if taker else []),
            )
    for token, ops in sorted(popped.items()):
        if len(ops) > 1:
            s.report(
                "log-pop",
                f"{len(ops)} pops returned the same item {token} (#{ops[0].result[0]})",
                *ops,
            )


def _check_reads(s: _Stream) -> None:
    last_read: dict[str, Operation] = {}
    due = _Due(s)
    for op in s.ops:
        if _as_log(op) != "log-read" or op.status != "ok":
            continue
        items = [(seq, token) for seq, token in op.result or []]
        seqs = [seq for seq, _ in items]
        if op.kind in SDK_AS_LOG:
            # Numbered by token from what the database holds in the end: before a failover's
            # promotion, what it read may have been lost (no number), and is not judged.
            if not s.judged(op):
                continue
            numbered = [seq for seq in seqs if seq]
        else:
            numbered = seqs
        if numbered != sorted(set(numbered)):
            s.report("log-read", f"read returned items out of order: {_span(seqs)}", op)
            continue
        if not s.judged(op):
            continue
        end = op.completed_at or op.invoked_at
        for seq, token in items:
            stored_token = s.stored.items.get(seq, (None, None))[0]
            writer = s.appender.get(token or "")
            _removed, remover = s.remover(seq)
            if seq == 0:
                s.report("log-read", f"read returned {token}, which the database does not hold", op)
            elif stored_token != token:
                s.report(
                    "log-read", f"read returned #{seq} = {token}, #{seq} holds {stored_token}", op
                )
            elif writer is not None and writer.status == "fail":
                s.report(
                    "log-read",
                    f"read returned #{seq} of append {writer.id}, which failed",
                    op,
                    writer,
                )
            elif writer is not None and writer.invoked_at > end:
                s.report(
                    "log-read", f"read returned #{seq} of an append invoked after it", op, writer
                )
            elif (
                remover is not None
                and remover.status == "ok"
                and (remover.completed_at or end) < op.invoked_at
            ):
                s.report(
                    "log-read",
                    f"read returned #{seq}, removed by {remover.kind} {remover.id} acknowledged "
                    f"{op.invoked_at - (remover.completed_at or 0):.3f}s before the read began",
                    op,
                    remover,
                )
        window = op.expected_version
        floor = seqs[0] if window is not None and len(seqs) >= window else 0
        returned = set(seqs)
        missing = sorted(
            seq
            for seq, gone_at in due.until(op.invoked_at).items()
            if gone_at > end and seq > floor and seq not in returned
        )
        if missing:
            s.report(
                "log-read",
                f"read of {len(seqs)} item(s) left out {_span(missing)}, acknowledged before it "
                "began and not removed before it ended",
                op,
            )
        before = last_read.get(op.client)
        if before is not None and before.expected_version is None and window is None:
            gone = [
                seq
                for seq, _token in before.result or []
                if seq not in seqs and _kept_through(s, seq, end)
            ]
            if gone:
                s.report(
                    "log-read",
                    f"client {op.client} read {_span(gone)}, then a read without them though "
                    "nothing removed them before it ended",
                    before,
                    op,
                )
        last_read[op.client] = op


class _Due:
    """The items a read must return, swept in the order reads begin: those whose append was
    acknowledged before the read began, each with the time its removal was invoked (inf: never
    removed; -inf: removed by no call of the history, an expiry) -- an item removed by a call
    invoked before one read began can be due to no later read, so the set stays near the live
    items and the check near-linear."""

    def __init__(self, s: _Stream) -> None:
        self._acked = sorted(
            (writer.completed_at or 0.0, seq)
            for seq, (token, _removed) in s.stored.items.items()
            if (writer := s.appender.get(token or "")) is not None and writer.status == "ok"
        )
        self._next = 0
        self._stream = s
        self._active: dict[int, float] = {}
        self._by_removal: list[tuple[float, int]] = []

    def until(self, began: float) -> dict[int, float]:
        """The items acknowledged before ``began`` and not removed by a call invoked before it,
        each with when its removal was invoked."""
        while self._next < len(self._acked) and self._acked[self._next][0] < began:
            seq = self._acked[self._next][1]
            removed, remover = self._stream.remover(seq)
            gone_at = math.inf if not removed else (remover.invoked_at if remover else -math.inf)
            self._active[seq] = gone_at
            heapq.heappush(self._by_removal, (gone_at, seq))
            self._next += 1
        while self._by_removal and self._by_removal[0][0] < began:
            self._active.pop(heapq.heappop(self._by_removal)[1], None)
        return self._active


def _kept_through(s: _Stream, seq: int, end: float) -> bool:
    """Whether item ``seq`` was certainly live until ``end``: never removed, or removed by a
    call invoked after it."""
    removed, remover = s.remover(seq)
    return not removed or (remover is not None and remover.invoked_at > end)


def _span(numbers: list[int]) -> str:
    if len(numbers) <= 12:
        return str(numbers)
    return f"{numbers[:6]} ... {numbers[-6:]} ({len(numbers)})"
