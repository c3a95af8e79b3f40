"""Checkpoint chains: per ``(thread_id, checkpoint_ns)`` the checkpoints of a LangGraph thread, their
channel values and the pending writes of their tasks -- the storage of
:class:`~agentmemory.integrations.langgraph.AgentMemorySaver`, which translates LangGraph's calls
(and its serializer's output) to these.

Stored as LangGraph's ``PostgresSaver`` stores them: a checkpoint without its channel values; one
blob per ``(channel, version)``, written by the first checkpoint that has it and shared by those
that follow without changing it; one row per pending write, unique by ``(checkpoint, task_id,
idx)``. What agentmemory adds is the head of each chain (:class:`~agentmemory.models
.CheckpointThread`), locked by every mutation of the chain as a log's head is:

- **no silent fork.** A put names its parent. A writer that loaded the chain's latest checkpoint
  and extends it (``expect`` given) is refused with :class:`~agentmemory.CheckpointConflict` when
  another put extended it first -- instead of both committing children of one parent, of which a
  reader would see only the newer (langgraph #8796). A fork asked for -- a put from the checkpoint
  ``expect`` names, LangGraph's time travel -- is made;
- **exactly once.** A put of a checkpoint id already stored rewrites it (a retry after a lost
  acknowledgement, as LangGraph's savers upsert) and is never taken for a fork; a pending write
  saved twice (same task and index) is stored once, and concurrent ``put_writes`` of one
  checkpoint never lose each other (langgraph #8115): each is one transaction under the lock.

Each mutation runs with the store's retry policy (:class:`~agentmemory.retries.Retrier`) as one
transaction; reads are answered by the database (the Redis tier does not serve checkpoints).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from copy import copy as copy_of
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.models import Q

from . import clock, sql
from .defects import NONE as NO_DEFECTS
from .defects import (
    Defect,
    Defects,
    failpoint_autocommit_answer,
    failpoint_before_checkpoint,
    failpoint_between_checkpoint_reads,
)
from .errors import CheckpointConflict, MemoryUnavailable
from .models import Checkpoint, CheckpointBlob, CheckpointThread, CheckpointWrite
from .records import (
    CHECKPOINT_PAGE,
    ChannelHistory,
    NewBlob,
    StoredCheckpoint,
    StoredWrite,
    Typed,
)
from .retries import Retrier
from .telemetry import THREAD, instrumented
from .vendors import (
    CREATE_ATTEMPTS,
    locked_or_created,
    raises_synchronous_commit,
    statement_batches,
)
from .writes import one_write_at_a_time

PAGE = CHECKPOINT_PAGE
#: How many times the MySQL family's two-statement read of checkpoints is made when threads it
#: read were deleted between its statements (each next read no longer finds them).
FRACTURED_READ_ATTEMPTS = 3
#: The unsafe seam's gap between reading the latest checkpoint and putting the next: a graph's
#: node runs there (an LLM call takes seconds; 0.2 s here), so the window in which two runs of
#: a thread race is wide -- wider than a memory write's (``writes.UNLOCKED_GAP_SECONDS``). At
#: 0.05 s, 600-call self-test runs caught the unlocked put in 3 of 5; at 0.2 s, in 8 of 8.
UNLOCKED_GAP_SECONDS = 0.2
#: The most keys of each kind (blobs, checkpoints' writes) one read of their rows asks for.
BRANCHES = 100
#: The SQLSTATEs of PostgreSQL's put functions (migration 0012): a conflict (the message is the
#: chain's latest checkpoint id), a head erased each time the write created it.
CONFLICT_STATE, ERASED_STATE = "AMCP1", "AMCP2"
PUT_CALL = (
    "SELECT agentmemory_put_checkpoint(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, "
    "%s::text[], %s::text[], %s::text[], %s::bytea[])"
)
#: A shard's gate, as the first part of a put's statement (migration 0016).
GATE_CALL = "agentmemory_pass_gate(%s::bigint[], %s::text[])"
PUT_WRITES_CALL = (
    "SELECT agentmemory_put_writes(%s, %s, %s, %s, %s, %s, %s::bigint[], %s::text[], "
    "%s::text[], %s::bytea[])"
)


T = TypeVar("T")


class CheckpointPath:
    """Mutations and reads of the checkpoint chains of one database alias, with its retries.

    ``row_lock=False`` is the store's declared unsafe seam here too: a put compares its parent
    with the latest checkpoint it read *before* taking the lock, then writes -- two writers
    that loaded one latest checkpoint both extend it (a silent fork). For the tests and
    memcheck that show the checks catch it; never for real data. ``defects``: the planted bugs of
    :mod:`agentmemory.defects` that live here (memcheck's self-test only)."""

    def __init__(
        self, using: str, retrier: Retrier, *, row_lock: bool = True, defects: Defects = NO_DEFECTS
    ) -> None:
        self.using = using
        self.retrier = retrier
        self.row_lock = row_lock and Defect.UNLOCKED_CHECKPOINT not in defects
        self.defects = defects

    # ------------------------------------------------------------------ mutations

    @instrumented("checkpoint.put", THREAD)
    def put(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        parent_checkpoint_id: str | None,
        *,
        expect: str | None,
        checkpoint: Typed,
        metadata: Typed,
        run_id: str | None,
        versions: dict[str, str],
        blobs: Sequence[NewBlob],
    ) -> None:
        """Store a checkpoint (rewrite it, if its id is stored) with its new blobs.

        ``expect``: None stores it wherever its parent is (LangGraph's own rule). A string: the
        caller loaded the chain's latest checkpoint, or asked for the checkpoint this string
        names (a fork from there is what it wants): the put must extend the latest checkpoint
        or start from the one named, else :class:`CheckpointConflict` and nothing is written.
        A parentless put is a new root and never conflicts."""
        failpoint_before_checkpoint()
        if self._by_function():
            now = clock.now()
            at = connections[self.using].ops.adapt_datetimefield_value(now)
            params = [thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, expect]
            params += [*checkpoint, *metadata, run_id, sql.encode_json(versions), at]
            params += _columns(
                [(b.channel, b.version, *(b.value or ("empty", None))) for b in blobs], 4
            )
            call = PUT_CALL
            if Defect.PUT_FUNCTION_FORKS in self.defects:  # its declared seam: a broken copy
                call = call.replace("put_checkpoint(", "put_checkpoint_selftest_forks(")
                # The same window as the unsafe seam's: a node's run between the caller's load
                # and its put, in which another run of the thread puts first (a fork, here).
                time.sleep(UNLOCKED_GAP_SECONDS)
            with one_write_at_a_time(self.using):
                self._call(call, params, thread_id, checkpoint_ns, parent_checkpoint_id)
            return
        observed = None if self.row_lock else self._latest_unlocked(thread_id, checkpoint_ns)

        def attempt(_retry: bool) -> None:
            now = clock.now()
            head = self._lock(thread_id, checkpoint_ns, now)
            statements = self._statements()
            ((stored, latest),) = self._run(statements.probe, [head, checkpoint_id, head])
            encoded = sql.encode_json(versions)
            fields = [parent_checkpoint_id, *checkpoint, *metadata, run_id, encoded]
            if stored:  # the same checkpoint again: a retry, or LangGraph saving it anew
                self._run(statements.rewrite, [*fields, head, checkpoint_id])
                self._insert_blobs(head, blobs)
                return
            if expect is not None and parent_checkpoint_id is not None:
                latest = observed if observed is not None else latest
                if parent_checkpoint_id not in (latest, expect):
                    raise CheckpointConflict(
                        thread_id, checkpoint_ns, parent=parent_checkpoint_id, latest=latest
                    )
            self._insert_blobs(head, blobs)
            at = connections[self.using].ops.adapt_datetimefield_value(now)
            self._run(statements.insert, [head, checkpoint_id, *fields, at])

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt, sessions=(thread_id,))

    @instrumented("checkpoint.put_writes", THREAD)
    def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        task_path: str,
        writes: Sequence[tuple[int, str, Typed]],
    ) -> None:
        """Store a task's pending writes, ``(idx, channel, value)``, all or none: a write of an
        ``(idx)`` the task already stored is skipped, except the special ones (negative
        indexes: an error, an interrupt, a resume), which replace it, as in LangGraph's savers."""
        if not writes:
            return

        if len(writes) > 1 and Defect.LOST_PENDING_WRITE in self.defects:
            writes = writes[:-1]
        plain = [w for w in writes if w[0] >= 0]
        # A special write replaces the one of its index: of two in one call, the last (as
        # PostgresSaver's one upsert per write); one statement cannot update a row twice.
        special = list({w[0]: w for w in writes if w[0] < 0}.values())
        if self._by_function():
            at = connections[self.using].ops.adapt_datetimefield_value(clock.now())
            rows = [(idx, channel, kind, data) for idx, channel, (kind, data) in plain + special]
            params = [thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, at]
            with one_write_at_a_time(self.using):
                self._call(PUT_WRITES_CALL, params + _columns(rows, 4), thread_id, checkpoint_ns)
            return

        def attempt(_retry: bool) -> None:
            head = self._lock(thread_id, checkpoint_ns, clock.now())
            statements = self._statements()
            for batch, statement in (
                (plain, statements.add_writes),
                (special, statements.set_writes),
            ):
                for part in self._batches([(f"writes[{w[0]}]", w[2][1]) for w in batch], batch):
                    params: list[Any] = []
                    for idx, channel, (kind, data) in part:
                        params += [head, checkpoint_id, task_id, idx, task_path, channel, kind]
                        params.append(data)
                    rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * len(part))
                    self._run(statement.format(rows=rows), params)

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt, sessions=(thread_id,))

    @instrumented("checkpoint.delete_threads", ())
    def delete_threads(self, thread_ids: Iterable[str]) -> None:
        """Delete every chain of these threads with its checkpoints, blobs and writes."""
        thread_ids = list(thread_ids)
        self._delete(Q(thread_id__in=thread_ids), thread_ids)

    @instrumented("checkpoint.delete_runs", ())
    def delete_runs(self, run_ids: Iterable[str]) -> None:
        """Delete the checkpoints these runs made (by their metadata's ``run_id``) and their
        pending writes; the blobs stay (a checkpoint of another run may share them)."""
        run_ids = list(run_ids)
        if not run_ids:
            return

        def attempt(_retry: bool) -> None:
            doomed = Checkpoint.objects.using(self.using).filter(run_id__in=run_ids)
            self.retrier.pass_gates(
                connections[self.using],
                CheckpointThread.objects.using(self.using)
                .filter(id__in=doomed.values("thread_id"))
                .values_list("thread_id", flat=True),
            )
            for head_id, checkpoint_id in doomed.values_list("thread_id", "checkpoint_id"):
                CheckpointWrite.objects.using(self.using).filter(
                    thread_id=head_id, checkpoint_id=checkpoint_id
                ).delete()
            doomed.delete()

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt)

    @instrumented("checkpoint.copy_thread", THREAD)
    def copy_thread(self, source: str, target: str, *, source_using: str | None = None) -> None:
        """Copy every chain of ``source`` -- checkpoints, blobs, writes -- to ``target``, all or
        nothing; what ``target`` already has of the same ids is kept. ``source_using``: the
        source's database when it is another (a shard's): read there, in one transaction of
        its own, before the copy's."""
        origin = source_using or self.using
        rows_of: dict[Any, dict[Any, list[Any]]] = {}
        if origin != self.using:
            with transaction.atomic(using=origin):  # one snapshot of the source's chains
                for head in CheckpointThread.objects.using(origin).filter(thread_id=source):
                    rows_of[head.checkpoint_ns] = {
                        model: list(model.objects.using(origin).filter(thread_id=head.id))
                        for model in (Checkpoint, CheckpointBlob, CheckpointWrite)
                    }

        def attempt(_retry: bool) -> None:
            now = clock.now()
            db = self.using
            heads = (
                [
                    (head.checkpoint_ns, head.id)
                    for head in CheckpointThread.objects.using(db).filter(thread_id=source)
                ]
                if origin == db
                else [(ns, None) for ns in rows_of]
            )
            for checkpoint_ns, head_id in heads:
                copy = self._lock(target, checkpoint_ns, now)
                for model, unique in (
                    (Checkpoint, ("checkpoint_id",)),
                    (CheckpointBlob, ("channel", "version")),
                    (CheckpointWrite, ("checkpoint_id", "task_id", "idx")),
                ):
                    have = set(model.objects.using(db).filter(thread_id=copy).values_list(*unique))
                    rows = []
                    source_rows = (
                        model.objects.using(db).filter(thread_id=head_id).iterator()
                        if head_id is not None
                        else [copy_of(row) for row in rows_of[checkpoint_ns][model]]
                    )
                    for row in source_rows:
                        if tuple(getattr(row, name) for name in unique) in have:
                            continue
                        row.pk, row.thread_id = None, copy
                        rows.append(row)
                    model.objects.using(db).bulk_create(rows, batch_size=500)

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt, sessions=(target,))

    @instrumented("checkpoint.prune", ())
    def prune(
        self,
        thread_ids: Iterable[str],
        *,
        keep_latest: bool,
        needs_history: Callable[[Typed], bool] | None = None,
    ) -> None:
        """Keep only the latest checkpoint of each chain of these threads, with its pending
        writes and the blobs it reads (``keep_latest=False``: delete the threads).

        ``needs_history``: given a checkpoint's metadata, whether its thread's values are rebuilt
        from its ancestors (LangGraph's ``DeltaChannel``): such a thread is not pruned -- its
        latest checkpoint alone would load with those channels empty -- and nothing is, the
        call raising ``NotImplementedError`` that names them (as LangGraph's ``PostgresSaver``
        does)."""
        thread_ids = list(thread_ids)
        if not keep_latest:
            self.delete_threads(thread_ids)
            return

        def attempt(_retry: bool) -> None:
            db = self.using
            heads = list(CheckpointThread.objects.using(db).filter(thread_id__in=thread_ids))
            if needs_history is not None:
                refuse_delta_threads(self.delta_threads(heads, needs_history))
            for head in heads:
                latest = (
                    Checkpoint.objects.using(db)
                    .filter(thread_id=head.id)
                    .order_by("-checkpoint_id")
                    .values_list("checkpoint_id", "channel_versions")
                    .first()
                )
                if latest is None:
                    continue
                kept, versions = latest
                Checkpoint.objects.using(db).filter(thread_id=head.id).exclude(
                    checkpoint_id=kept
                ).delete()
                CheckpointWrite.objects.using(db).filter(thread_id=head.id).exclude(
                    checkpoint_id=kept
                ).delete()
                read = Q()
                for channel, version in versions.items():
                    read |= Q(channel=channel, version=version)
                CheckpointBlob.objects.using(db).filter(thread_id=head.id).exclude(read).delete()

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt, sessions=thread_ids)

    def delta_threads(
        self, threads: Iterable[Any], needs_history: Callable[[Typed], bool]
    ) -> set[str]:
        """Which of ``threads`` (ids, or their head rows) hold a checkpoint whose metadata
        ``needs_history`` says is rebuilt from its ancestors: the threads ``prune`` refuses."""
        threads = list(threads)
        if threads and isinstance(threads[0], str):
            threads = list(CheckpointThread.objects.using(self.using).filter(thread_id__in=threads))
        metadata = Checkpoint.objects.using(self.using).filter(thread__in=threads)
        return {
            name
            for name, kind, data in metadata.values_list(
                "thread__thread_id", "metadata_type", "metadata"
            )
            if needs_history((kind, bytes(data)))
        }

    # ------------------------------------------------------------------ reads

    @instrumented("checkpoint.get_tuple", THREAD)
    def get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        """The checkpoint ``checkpoint_id`` of the chain, or its latest (None: no such one)."""

        def work() -> StoredCheckpoint | None:
            statement = _get_statement(connections[self.using].vendor, checkpoint_id is not None)
            if checkpoint_id is None and Defect.STALE_CHECKPOINT_READ in self.defects:
                statement = statement.replace("LIMIT 1", "LIMIT 1 OFFSET 1")
            params = [thread_id, checkpoint_ns]
            if checkpoint_id is not None:
                params.append(checkpoint_id)
            found = self._read(statement, params, (thread_id, checkpoint_ns), 0)
            return found[0] if found else None

        return self.retrier.read(work)

    @instrumented("checkpoint.list", THREAD)
    def page(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        after: tuple[str, int] | None,
        size: int = PAGE,
    ) -> list[StoredCheckpoint]:
        """Checkpoints newest first (by id, across chains too): of one thread or all
        (``thread_id=None``), one namespace or all, one id or all, ``before`` an id; the page
        that follows ``after`` (a checkpoint's ``cursor``)."""

        one_chain = thread_id is not None and checkpoint_ns is not None
        params: list[Any] = [name for name in (thread_id, checkpoint_ns) if name is not None]
        params += [bound for bound in (checkpoint_id, before) if bound is not None]
        if after is not None:
            params += [after[0]] if one_chain else [after[0], after[0], after[1]]
        statement = _page_statement(
            connections[self.using].vendor,
            thread_id is not None,
            checkpoint_ns is not None,
            checkpoint_id is not None,
            before is not None,
            after is not None,
        )

        skip = after is None and Defect.LIST_SKIPS_NEWEST in self.defects

        def work() -> list[StoredCheckpoint]:
            chain = (thread_id, checkpoint_ns) if one_chain else None
            return self._read(statement, [*params, size + skip], chain, skip)

        return self.retrier.read(work)

    @instrumented("checkpoint.delta_history", THREAD)
    def delta_history(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str | None,
        channels: Sequence[str],
    ) -> dict[str, ChannelHistory]:
        """What LangGraph's ``DeltaChannel`` rebuilds a channel from, for each of ``channels``:
        walking the parents of the checkpoint ``checkpoint_id`` (None: the chain's latest),
        nearest first, the pending writes to the channel of each ancestor, until the nearest
        ancestor that holds a value of the channel (its ``seed``; its own writes included); no
        seed if the walk reaches the chain's root (or a parent no longer stored) first.

        :data:`DELTA_FIRST_PAGE`, then :data:`DELTA_PAGE` ancestors a statement (a recursive
        one, the values found by the server on PostgreSQL and SQLite; then lookups of them on
        the MySQL family), then one statement for the writes of every ancestor walked: a
        1,000-step thread is read in a few statements instead of a ``get_tuple`` per ancestor.
        A chain whose parents loop (a checkpoint put again under a descendant) ends where an
        ancestor comes back."""
        wanted = list(dict.fromkeys(channels))

        def work() -> dict[str, ChannelHistory]:
            chains: dict[str, list[str]] = {channel: [] for channel in wanted}
            seeds: dict[str, Typed] = {}
            remaining = list(wanted)
            seen: set[str] = set()
            head_id: int | None = None
            anchor, start = checkpoint_id, 1  # the checkpoint named is not its own ancestor
            while remaining:
                size = DELTA_FIRST_PAGE if start else DELTA_PAGE
                head, ancestors, nearest = self._ancestors(
                    thread_id, checkpoint_ns, anchor, start, remaining, size
                )
                if head is None:
                    break
                head_id = head
                seen.update(ancestor_id for ancestor_id, _parent in ancestors[:start])
                walk = ancestors[start:]
                end = len(walk)
                for depth, (ancestor_id, _parent) in enumerate(walk):
                    if ancestor_id in seen:  # the parents loop: the walk ends here
                        end = depth
                        break
                    seen.add(ancestor_id)
                for channel in list(remaining):
                    depth, value = nearest.get(channel, (None, None))
                    if depth is not None and depth - start < end:
                        chains[channel] += [i for i, _p in walk[: depth - start + 1]]
                        seeds[channel] = value
                        remaining.remove(channel)
                    else:
                        chains[channel] += [i for i, _p in walk[:end]]
                if end < len(walk) or len(ancestors) <= size or ancestors[-1][1] is None:
                    break
                anchor, start = ancestors[-1][1], 0
            walked = list(dict.fromkeys(i for chain in chains.values() for i in chain))
            failpoint_between_checkpoint_reads(thread_id)
            writes = self._channel_writes(head_id, walked, wanted) if walked else {}
            # Each statement read the database as it was then: a thread deleted since the walk
            # began would give its seeds without their writes. Its head (never reused) still
            # there now means it was there all along; gone, the thread is read as deleted.
            if head_id is not None and not self._head_exists(head_id):
                return {channel: ChannelHistory([], None) for channel in wanted}
            return {
                channel: ChannelHistory(
                    [w for i in reversed(chains[channel]) for w in writes.get((i, channel), [])],
                    seeds.get(channel),
                )
                for channel in wanted
            }

        return self.retrier.read(work)

    # ------------------------------------------------------------------ helpers

    def _run(self, statement: str, params: Sequence[Any]) -> list[Any]:
        return list(sql.run(connections[self.using], statement, params))

    def _head_exists(self, head_id: int) -> bool:
        return CheckpointThread.objects.using(self.using).filter(id=head_id).exists()

    def _ancestors(
        self,
        thread_id: str,
        checkpoint_ns: str,
        anchor: str | None,
        start: int,
        channels: list[str],
        size: int,
    ) -> tuple[int | None, list[tuple[str, str | None]], dict[str, tuple[int, Typed]]]:
        """One page of :meth:`delta_history`'s walk: the chain's head id; the checkpoint
        ``anchor`` (None: the chain's latest) and up to ``size`` of its ancestors,
        nearest first, as (id, parent id); and for each of ``channels`` stored at a checkpoint
        of the page from the ``start``-th on, the nearest such: its place in the page, and the
        value."""
        vendor = connections[self.using].vendor
        params: list[Any] = [thread_id, checkpoint_ns, anchor, size]
        if vendor in WHOLE_READS:
            params += [channels if vendor == "postgresql" else sql.encode_json(channels), start]
        head: int | None = None
        rows: list[tuple[int, str, str | None, Any]] = []
        nearest: dict[str, tuple[int, Typed]] = {}
        for source, depth, a, b, head_id, versions, kind, data in self._run(
            _delta_statement(vendor), params
        ):
            if source == "c":
                head = head_id
                rows.append((depth, a, b, versions))
            else:
                nearest[a] = (depth, (kind, bytes(data)))
        rows.sort(key=lambda row: row[0])
        if vendor not in WHOLE_READS and head is not None:
            nearest = self._nearest_values(head, rows, start, channels)
        return head, [(i, parent) for _depth, i, parent, _versions in rows], nearest

    def _nearest_values(
        self,
        head: int,
        rows: list[tuple[int, str, str | None, Any]],
        start: int,
        channels: list[str],
    ) -> dict[str, tuple[int, Typed]]:
        """:meth:`_ancestors`' stored values on the MySQL family (TiDB has no ``JSON_TABLE`` to
        expand the versions with): the page's versions of ``channels`` looked up,
        :data:`BRANCHES` a statement."""
        versions = [(depth, sql.decode_json(raw)) for depth, _i, _p, raw in rows[start:]]
        keys = {(c, found[c]) for _depth, found in versions for c in channels if c in found}
        flat = [part for channel, version in sorted(keys) for part in (head, channel, version)]
        values: dict[tuple[str, str], Typed] = {}
        for first in range(0, len(flat), 3 * BRANCHES):
            some = flat[first : first + 3 * BRANCHES]
            statement = _parts_statement(connections[self.using].vendor, len(some) // 3, 0)
            for _s, _head, channel, version, *_rest, kind, data in self._run(statement, some):
                if kind != "empty":  # written empty: no value here
                    values[(channel, version)] = (kind, bytes(data))
        nearest: dict[str, tuple[int, Typed]] = {}
        for depth, found in versions:
            for channel in channels:
                value = values.get((channel, found.get(channel)))
                if value is not None and channel not in nearest:
                    nearest[channel] = (depth, value)
        return nearest

    def _channel_writes(
        self, head_id: int | None, checkpoint_ids: list[str], channels: list[str]
    ) -> dict[tuple[str, str], list[StoredWrite]]:
        """The pending writes to ``channels`` of these checkpoints of a chain, by (checkpoint
        id, channel), each list in LangGraph's ``writes_sort_key`` order."""
        vendor = connections[self.using].vendor
        if vendor == "postgresql":
            params: list[Any] = [head_id, checkpoint_ids, channels]
        elif vendor == "sqlite":
            params = [head_id, sql.encode_json(checkpoint_ids), sql.encode_json(channels)]
        else:
            params = [head_id, *checkpoint_ids, *channels]
        statement = _delta_writes_statement(vendor, len(checkpoint_ids), len(channels))
        writes: dict[tuple[str, str], list[StoredWrite]] = {}
        for checkpoint_id, task_id, channel, task_path, idx, kind, data in self._run(
            statement, params
        ):
            writes.setdefault((checkpoint_id, channel), []).append(
                StoredWrite(task_id, channel, (kind, bytes(data)), task_path or "", idx)
            )
        for found in writes.values():
            found.sort(key=_writes_order)
        return writes

    def _by_function(self) -> bool:
        """Whether a put goes by PostgreSQL's function (migration 0012): one round trip. Not
        with the unsafe seam (its unlocked read must come before the write)."""
        return self.row_lock and connections[self.using].vendor == "postgresql"

    def _call(
        self,
        call: str,
        params: list[Any],
        thread_id: str,
        checkpoint_ns: str,
        parent: str | None = None,
    ) -> None:
        """One call of a put function: in autocommit, a statement that commits by itself (one
        round trip); inside a caller's transaction or with a durable COMMIT to ask for (``SET
        LOCAL``), in a transaction (a savepoint in the caller's) that a conflict rolls back."""
        connection = connections[self.using]
        connection.ensure_connection()
        gated = self.retrier.gated
        transactional = connection.in_atomic_block or raises_synchronous_commit(connection)
        if gated and not transactional:
            # A shard's put in autocommit: the thread's gate first, in the same statement
            # (migration 0016's function, then the put's, in a snapshot taken after its lock).
            from .moves import lock_key

            call = f"WITH gate AS (SELECT {GATE_CALL}) {call} FROM gate"
            params = [[lock_key(thread_id)], [thread_id], *params]

        def attempt(_retry: bool) -> None:
            try:
                self._run(call, params)
            except DatabaseError as error:
                state = getattr(error.__cause__, "sqlstate", None)
                if state == CONFLICT_STATE:
                    latest = error.__cause__.diag.message_primary or None  # type: ignore[union-attr]
                    assert parent is not None
                    raise CheckpointConflict(
                        thread_id, checkpoint_ns, parent=parent, latest=latest
                    ) from None
                if state == ERASED_STATE:
                    raise MemoryUnavailable(
                        f"a checkpoint thread row was erased {CREATE_ATTEMPTS} times while this "
                        "write created it; nothing was written",
                        attempts=CREATE_ATTEMPTS,
                    ) from None
                raise

        def autocommitted(retry: bool) -> None:
            attempt(retry)
            failpoint_autocommit_answer()  # stored, and the answer lost (a retry rewrites it)

        if transactional:
            self.retrier.atomic(attempt, connection, sessions=(thread_id,))
        elif gated:
            from . import moves

            def gate_passed(retry: bool) -> None:
                with moves.gate_raised([thread_id]):
                    autocommitted(retry)

            # A put done again rewrites what it stored: followed wherever the thread moved.
            moves.through_gates(
                lambda: self.retrier.run(gate_passed, connection), self.using, lambda: False, False
            )
        else:
            self.retrier.run(autocommitted, connection)

    def _statements(self) -> _Statements:
        return _statements(connections[self.using].vendor)

    def _lock(self, thread_id: str, checkpoint_ns: str, now: datetime) -> int:
        """The id of the chain's head, locked by writing it (created first: two writers racing
        to start a chain never make two heads, and neither sees an IntegrityError). Written,
        not only locked: a Galera node's row lock does not reach the other nodes, but two
        transactions that wrote one row conflict at certification (without it, steps from
        three nodes forked a thread: 45 parents for 60 children)."""
        statements = self._statements()
        at = connections[self.using].ops.adapt_datetimefield_value(now)

        def claim() -> list[Any]:
            rows = self._run(statements.touch, [at, thread_id, checkpoint_ns])
            if statements.touch_returns:
                return rows
            return self._run(statements.lock, [thread_id, checkpoint_ns])  # held already

        values = {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "version": 0,
            "created_at": now,
            "updated_at": now,
        }
        return locked_or_created(connections[self.using], CheckpointThread, values, claim)[0][0]

    def _latest_unlocked(self, thread_id: str, checkpoint_ns: str) -> str:
        """The unsafe seam's read: the chain's latest checkpoint as it is now, without a lock,
        outside the transaction; then the gap before the write (as a log's unlocked pop)."""
        latest = (
            Checkpoint.objects.using(self.using)
            .filter(thread__thread_id=thread_id, thread__checkpoint_ns=checkpoint_ns)
            .order_by("-checkpoint_id")
            .values_list("checkpoint_id", flat=True)
            .first()
        )
        time.sleep(UNLOCKED_GAP_SECONDS)
        return latest or ""

    def _insert_blobs(self, head: int, blobs: Sequence[NewBlob]) -> None:
        """Each blob once, in one statement: a version already stored is kept (a version never
        changes its value)."""
        sized = [(f"channel {b.channel!r}", None if b.value is None else b.value[1]) for b in blobs]
        for part in self._batches(sized, blobs):
            params: list[Any] = []
            for blob in part:
                kind, data = ("empty", None) if blob.value is None else blob.value
                params += [head, blob.channel, blob.version, kind, data]
            rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(part))
            self._run(self._statements().add_blobs.format(rows=rows), params)

    def _batches(self, sized: list[tuple[str, bytes | None]], rows: Sequence[T]) -> list[list[T]]:
        """``rows`` in multi-row INSERTs the server takes (:func:`statement_batches`; ``sized``:
        each row's ``(name, data)``)."""
        batches = statement_batches(connections[self.using], sized, row_overhead=512)
        return [list(rows[a:b]) for a, b in batches if b > a]

    def _read(
        self,
        statement: str,
        params: list[Any],
        chain: tuple[str, str] | None,
        skip: int,
    ) -> list[StoredCheckpoint]:
        """The checkpoints ``statement`` selects (:data:`ROW`; across chains, then each one's
        thread id and namespace as ``thread_name`` and ``ns``), newest first, ``skip`` of them
        left out, with their blobs and pending writes.

        PostgreSQL and SQLite: one statement (:func:`_whole_statement`), whose text does not
        depend on the checkpoints read. The MySQL family: that statement, then one for the
        blobs and writes of all its rows (:meth:`_parts`)."""
        vendor = connections[self.using].vendor
        if vendor not in WHOLE_READS:
            for _attempt in range(FRACTURED_READ_ATTEMPTS):
                rows = self._run(statement, params)[skip:]
                failpoint_between_checkpoint_reads(chain[0] if chain else None)
                chains = [chain] * len(rows) if chain is not None else [r[-2:] for r in rows]
                rows = rows if chain is not None else [row[:-2] for row in rows]
                found, whole = self._complete(rows, chains)
                if whole:
                    return found
            raise MemoryUnavailable(
                f"checkpoints read {FRACTURED_READ_ATTEMPTS} times while their threads were "
                "being deleted or pruned; retry"
            )
        rows, chains = [], []
        blobs: dict[tuple[int, str, str], Typed | None] = {}
        writes: dict[tuple[int, str], list[StoredWrite]] = {}
        found = self._run(_whole_statement(vendor, statement, chain is None), params)
        for source, head_id, a, b, c, d, idx, kind, data, *rest in found:
            if source == "c":
                mkind, mdata, versions, thread, namespace, row_id = rest
                rows.append((row_id, head_id, a, b, kind, data, mkind, mdata, versions))
                chains.append(chain or (thread, namespace))
            else:
                self._part(blobs, writes, source, head_id, a, b, c, d, idx, kind, data)
        # The page's order (a CTE's rows need not keep it through the UNION).
        order = sorted(range(len(rows)), key=lambda i: (rows[i][2], rows[i][1]), reverse=True)
        order = order[skip:]
        return self._assemble([rows[i] for i in order], [chains[i] for i in order], blobs, writes)

    @staticmethod
    def _part(
        blobs: dict[tuple[int, str, str], Typed | None],
        writes: dict[tuple[int, str], list[StoredWrite]],
        source: str,
        head_id: int,
        a: str,
        b: str,
        c: str | None,
        d: str | None,
        idx: int | None,
        kind: str,
        data: Any,
    ) -> None:
        """One row of :meth:`_parts` into ``blobs`` or ``writes``; a channel written empty into
        ``blobs`` as None (its row is there, with no value)."""
        if source == "b":
            blobs[(head_id, a, b)] = None if kind == "empty" else (kind, bytes(data))
        else:
            assert c is not None and idx is not None
            writes.setdefault((head_id, a), []).append(
                StoredWrite(b, c, (kind, bytes(data)), d or "", idx)
            )

    def _complete(
        self, rows: list[tuple[Any, ...]], chains: Sequence[Sequence[str]]
    ) -> tuple[list[StoredCheckpoint], bool]:
        """The checkpoints of these rows (:data:`ROW`) with their blobs and pending writes, read
        in one more statement for all of them. ``chains``: each row's (thread id, namespace).

        And whether they are whole: each statement reads the database as it is then, so a
        thread deleted (or pruned) between the two leaves rows without their blobs -- a
        checkpoint whose channels are silently empty. Every version a checkpoint names has a
        row (a channel written empty too), so a missing one is such a delete -- or a put that
        named a version it never stored: only then are the rows looked up again (one statement,
        by primary key); each still there was there all along (ids are never reused), with its
        blobs. One gone: False, and the caller reads again."""
        if not rows:
            return [], True
        blobs: dict[tuple[int, str, str], Typed | None] = {}
        writes: dict[tuple[int, str], list[StoredWrite]] = {}
        for part in self._parts(rows):
            self._part(blobs, writes, *part)
        missing = any(
            (row[1], channel, version) not in blobs
            for row in rows
            for channel, version in sql.decode_json(row[8]).items()
        )
        ids = [row[0] for row in rows]
        whole = not missing or Checkpoint.objects.using(self.using).filter(
            id__in=ids
        ).count() == len(ids)
        return self._assemble(rows, chains, blobs, writes), whole

    @staticmethod
    def _assemble(
        rows: list[tuple[Any, ...]],
        chains: Sequence[Sequence[str]],
        blobs: dict[tuple[int, str, str], Typed | None],
        writes: dict[tuple[int, str], list[StoredWrite]],
    ) -> list[StoredCheckpoint]:
        """The checkpoints of these rows (:data:`ROW`) with their blobs and pending writes."""
        result = []
        for (thread, namespace), row in zip(chains, rows, strict=True):
            _row_id, head_id, checkpoint_id, parent, kind, data, mkind, mdata, raw = row
            versions = sql.decode_json(raw)
            own = writes.get((head_id, checkpoint_id), [])
            own.sort(key=_writes_order)
            result.append(
                StoredCheckpoint(
                    thread,
                    namespace,
                    checkpoint_id,
                    parent,
                    (kind, bytes(data)),
                    (mkind, bytes(mdata)),
                    {
                        channel: value
                        for channel, version in versions.items()
                        if (value := blobs.get((head_id, channel, version))) is not None
                    },
                    own,
                    (checkpoint_id, head_id),
                )
            )
        return result

    def _parts(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The blobs and pending writes of these checkpoint rows (:data:`ROW`), on the MySQL
        family (TiDB has no ``JSON_TABLE`` to expand the channel versions with): rows of
        (source ``b`` or ``w``, thread, channel or checkpoint id, version or task id, channel,
        task path, idx, type, blob), by a branch per key, :data:`BRANCHES` at most per
        statement."""
        vendor = connections[self.using].vendor
        blob_keys: list[Any] = []
        write_keys: list[Any] = []
        for row in rows:
            head_id, checkpoint_id, versions = row[1], row[2], sql.decode_json(row[8])
            write_keys += [head_id, checkpoint_id]
            for channel, version in versions.items():
                blob_keys += [head_id, channel, version]
        parts: list[tuple[Any, ...]] = []
        for start in range(0, max(len(write_keys) // 2, len(blob_keys) // 3), BRANCHES):
            some_writes = write_keys[2 * start : 2 * (start + BRANCHES)]
            some_blobs = blob_keys[3 * start : 3 * (start + BRANCHES)]
            statement = _parts_statement(vendor, len(some_blobs) // 3, len(some_writes) // 2)
            parts += self._run(statement, [*some_writes, *some_blobs])
        return parts

    def _delete(self, heads: Q, thread_ids: Sequence[str] = ()) -> None:
        """Delete the chains ``heads`` selects; ``thread_ids``: the threads asked for, whose
        gates the delete passes (on a shard, one that moved away raises ``SessionMoved``
        instead of deleting nothing here)."""

        def attempt(_retry: bool) -> None:
            # The threads' gates before any row lock, as every write passes them.
            self.retrier.pass_gates(
                connections[self.using],
                CheckpointThread.objects.using(self.using)
                .filter(heads)
                .values_list("thread_id", flat=True),
            )
            # Locked first (sql.lock_for_delete): a put racing the delete waits, and lands
            # after it on a new head, instead of adding a checkpoint between two DELETEs.
            ids = sql.lock_for_delete(
                connections[self.using],
                CheckpointThread.objects.using(self.using)
                .filter(heads)
                .order_by("thread_id", "checkpoint_ns")
                .values_list("id", flat=True),
            )
            if not ids:
                return
            if Defect.DELETE_LEAVES_LATEST in self.defects:
                for head_id in ids:
                    rows = Checkpoint.objects.using(self.using).filter(thread_id=head_id)
                    latest = rows.order_by("-checkpoint_id").values_list("id", flat=True)[:1]
                    rows.exclude(id__in=list(latest)).delete()
                return
            for model in (CheckpointWrite, CheckpointBlob, Checkpoint):
                model.objects.using(self.using).filter(thread_id__in=ids).delete()
            CheckpointThread.objects.using(self.using).filter(id__in=ids).delete()

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt, sessions=thread_ids)


#: How many ancestors one statement of :meth:`CheckpointPath.delta_history` walks: first (a
#: ``DeltaChannel`` stores its value every 100 writes by default, so most walks end there), then
#: (MySQL and TiDB stop a recursive statement at 1,000 by default: ``cte_max_recursion_depth``).
DELTA_FIRST_PAGE, DELTA_PAGE = 128, 900


@functools.lru_cache(maxsize=8)
def _delta_statement(vendor: str) -> str:
    """A page of :meth:`CheckpointPath.delta_history`'s walk: the checkpoint named (or the
    chain's latest) and its ancestors by a recursive statement, each row (``c``, depth, id,
    parent id, head id, then the MySQL family's channel versions, NULL, NULL); on PostgreSQL and
    SQLite, then for each channel asked for, the nearest checkpoint from a depth on that holds
    its value (``b``, depth, channel, version, NULL, NULL, type, blob) -- the server expands the
    versions and looks their values up, and sends the one that matters. Parameters: thread id,
    namespace, checkpoint id or None, the page's size, then (PostgreSQL, SQLite) the channels
    and the depth."""
    quote, head, checkpoint, blob, _write = _tables(vendor)
    data = quote.format("blob")
    latest = (
        f"(SELECT l.checkpoint_id FROM {checkpoint} l WHERE l.thread_id = c.thread_id "
        "ORDER BY l.thread_id DESC, l.checkpoint_id DESC LIMIT 1)"
    )
    walk = (
        "WITH RECURSIVE chain (depth, checkpoint_id, parent_checkpoint_id, channel_versions, "
        "thread_id) AS (SELECT 0, c.checkpoint_id, c.parent_checkpoint_id, c.channel_versions, "
        f"c.thread_id FROM {checkpoint} c WHERE c.thread_id = (SELECT id FROM {head} "
        f"WHERE thread_id = %s AND checkpoint_ns = %s) "
        f"AND c.checkpoint_id = COALESCE(%s, {latest}) "
        "UNION ALL SELECT chain.depth + 1, c.checkpoint_id, c.parent_checkpoint_id, "
        f"c.channel_versions, c.thread_id FROM chain JOIN {checkpoint} c "
        "ON c.thread_id = chain.thread_id AND c.checkpoint_id = chain.parent_checkpoint_id "
        "WHERE chain.depth < %s) "
    )
    if vendor not in WHOLE_READS:
        return (
            walk + "SELECT 'c', depth, checkpoint_id, parent_checkpoint_id, thread_id, "
            "channel_versions, NULL, NULL FROM chain"
        )
    rows = (
        "SELECT 'c', depth, checkpoint_id, parent_checkpoint_id, thread_id, NULL, NULL, NULL "
        "FROM chain"
    )
    if vendor == "postgresql":
        expanded = (
            "CROSS JOIN LATERAL jsonb_each_text(chain.channel_versions) v WHERE v.key = ANY(%s)"
        )
        value = (
            f"CROSS JOIN LATERAL (SELECT b.type, b.{data} FROM {blob} b WHERE b.thread_id = "
            "s.thread_id AND b.channel = s.key AND b.version = s.value LIMIT 1) b"
        )
    else:
        expanded = (
            "CROSS JOIN json_each(chain.channel_versions) v "
            "WHERE v.key IN (SELECT value FROM json_each(%s))"
        )
        value = (
            f"CROSS JOIN {blob} b ON b.thread_id = s.thread_id AND b.channel = s.key "
            "AND b.version = s.value"
        )
    pairs = (
        f"SELECT chain.thread_id, v.key, v.value, MIN(chain.depth) AS depth FROM chain {expanded} "
        "AND chain.depth >= %s GROUP BY chain.thread_id, v.key, v.value"
    )
    stored = (
        "SELECT p.thread_id, p.key, p.value, p.depth, ROW_NUMBER() OVER (PARTITION BY p.key "
        f"ORDER BY p.depth) AS nearest FROM pairs p WHERE EXISTS (SELECT 1 FROM {blob} b "
        "WHERE b.thread_id = p.thread_id AND b.channel = p.key AND b.version = p.value "
        "AND b.type <> 'empty')"
    )
    found = (
        f"SELECT 'b', s.depth, s.key, s.value, NULL, NULL, b.type, b.{data} FROM stored s "
        f"{value} WHERE s.nearest = 1"
    )
    return f"{walk}, pairs AS ({pairs}), stored AS ({stored}) {rows} UNION ALL {found}"


@functools.lru_cache(maxsize=64)
def _delta_writes_statement(vendor: str, checkpoints: int, channels: int) -> str:
    """The pending writes to some channels of some checkpoints of a chain: rows of (checkpoint
    id, task id, channel, task path, idx, type, blob). Parameters: the head's id, the
    checkpoint ids, the channels (PostgreSQL: two arrays; SQLite: two JSON arrays; the MySQL
    family: a placeholder each -- its text then depends on the counts)."""
    quote, _head, _checkpoint, _blob, write = _tables(vendor)
    data = quote.format("blob")
    if vendor == "postgresql":
        among = "checkpoint_id = ANY(%s) AND channel = ANY(%s)"
    elif vendor == "sqlite":
        among = (
            "checkpoint_id IN (SELECT value FROM json_each(%s)) "
            "AND channel IN (SELECT value FROM json_each(%s))"
        )
    else:
        among = (
            f"checkpoint_id IN ({', '.join(['%s'] * checkpoints)}) "
            f"AND channel IN ({', '.join(['%s'] * channels)})"
        )
    return (
        f"SELECT checkpoint_id, task_id, channel, task_path, idx, type, {data} FROM {write} "
        f"WHERE thread_id = %s AND {among}"
    )


def _writes_order(write: StoredWrite) -> tuple[str, str, int]:
    """LangGraph's ``writes_sort_key``: the order in which a super-step applies its tasks'
    writes (task path, task id, index)."""
    return (write.task_path, write.task_id, write.idx)


#: The name of the ``(thread, checkpoint_id)`` unique index (the constraint's).
BY_ID = "agentmemory_one_checkpoint_per_id"

#: The columns of a checkpoint row, in this order, wherever one is read.
ROW = (
    "id",
    "thread_id",
    "checkpoint_id",
    "parent_checkpoint_id",
    "type",
    "checkpoint",
    "metadata_type",
    "metadata",
    "channel_versions",
)


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """``rows`` as ``width`` parallel lists: a function's array parameters (``unnest``)."""
    return [[row[i] for row in rows] for i in range(width)]


@dataclass(frozen=True)
class _Statements:
    touch: str  # the head's UPDATE: its lock, and a write of it
    touch_returns: bool  # ... which returns the head's id (else: lock, to read it)
    lock: str
    # (stored?, latest id) of a chain. Not MAX(checkpoint_id): on a table grown since its last
    # ANALYZE, PostgreSQL aggregated every checkpoint of the chain for it (9 ms at 11,000)
    # where the index walked from its end reads one.
    probe: str
    rewrite: str
    insert: str
    add_blobs: str  # .format(rows=...)
    add_writes: str  # .format(rows=...): new ones only
    set_writes: str  # .format(rows=...): new ones, or replacing


def _tables(vendor: str) -> tuple[str, str, str, str, str]:
    """The quote format and the quoted tables: heads, checkpoints, blobs, writes."""
    quote = "`{}`" if vendor == "mysql" else '"{}"'  # as each backend's ops.quote_name
    return (
        quote,
        *(
            quote.format(m._meta.db_table)
            for m in (CheckpointThread, Checkpoint, CheckpointBlob, CheckpointWrite)
        ),
    )


@functools.lru_cache(maxsize=8)
def _statements(vendor: str) -> _Statements:
    """A mutation's statements, hand-written as the logs' are (:mod:`agentmemory.logs`): the
    ORM's query building was most of a call's time (a ``get_tuple`` 3.5 ms on SQLite, a
    ``put`` 6 ms)."""
    quote, head, checkpoint, blob, write = _tables(vendor)
    data = quote.format("blob")  # a reserved word in the MySQL family
    for_update = "" if vendor == "sqlite" else " FOR UPDATE"  # SQLite: BEGIN IMMEDIATE
    json = "%s::jsonb" if vendor == "postgresql" else "%s"
    fields = (
        "parent_checkpoint_id, type, checkpoint, metadata_type, metadata, run_id, channel_versions"
    )
    write_columns = f"(thread_id, checkpoint_id, task_id, idx, task_path, channel, type, {data})"
    if vendor == "mysql":
        keep = " ON DUPLICATE KEY UPDATE id = id"  # not INSERT IGNORE: see insert_if_missing
        replace = (
            " ON DUPLICATE KEY UPDATE task_path = VALUES(task_path), channel = VALUES(channel), "
            f"type = VALUES(type), {data} = VALUES({data})"
        )
    else:
        keep = " ON CONFLICT DO NOTHING"
        replace = (
            " ON CONFLICT (thread_id, checkpoint_id, task_id, idx) DO UPDATE SET task_path = "
            "excluded.task_path, channel = excluded.channel, type = excluded.type, "
            f"{data} = excluded.{data}"
        )
    returns = sql.updates_return_rows(vendor)
    return _Statements(
        touch=f"UPDATE {head} SET version = version + 1, updated_at = %s "
        "WHERE thread_id = %s AND checkpoint_ns = %s" + (" RETURNING id" if returns else ""),
        touch_returns=returns,
        lock=f"SELECT id FROM {head} WHERE thread_id = %s AND checkpoint_ns = %s{for_update}",
        probe=f"SELECT (SELECT 1 FROM {checkpoint} WHERE thread_id = %s AND checkpoint_id = %s), "
        f"(SELECT checkpoint_id FROM {checkpoint} WHERE thread_id = %s "
        "ORDER BY thread_id DESC, checkpoint_id DESC LIMIT 1)",
        rewrite=f"UPDATE {checkpoint} SET parent_checkpoint_id = %s, type = %s, checkpoint = %s, "
        f"metadata_type = %s, metadata = %s, run_id = %s, channel_versions = {json} "
        "WHERE thread_id = %s AND checkpoint_id = %s",
        insert=f"INSERT INTO {checkpoint} (thread_id, checkpoint_id, {fields}, created_at) "
        f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, {json}, %s)",
        add_blobs=f"INSERT INTO {blob} (thread_id, channel, version, type, {data}) VALUES {{rows}}"
        + keep,
        add_writes=f"INSERT INTO {write} {write_columns} VALUES {{rows}}" + keep,
        set_writes=f"INSERT INTO {write} {write_columns} VALUES {{rows}}" + replace,
    )


@functools.lru_cache(maxsize=8)
def _get_statement(vendor: str, by_id: bool) -> str:
    """A chain's latest checkpoint, or the one of an id: one statement that finds the head
    and walks the ``(thread, checkpoint_id)`` index from its end (the MySQL family: a join, the
    head a constant table; elsewhere a subquery evaluated once -- as the logs' reads)."""
    _quote, head, checkpoint, _blob, _write = _tables(vendor)
    columns = ", ".join(f"c.{column}" for column in ROW)
    of_id = " AND c.checkpoint_id = %s" if by_id else ""
    if vendor == "mysql":
        return (
            f"SELECT {columns} FROM {head} h JOIN {checkpoint} c ON c.thread_id = h.id "
            f"WHERE h.thread_id = %s AND h.checkpoint_ns = %s{of_id} "
            "ORDER BY c.checkpoint_id DESC LIMIT 1"
        )
    return (
        f"SELECT {columns} FROM {checkpoint} c WHERE c.thread_id = (SELECT id FROM {head} "
        f"WHERE thread_id = %s AND checkpoint_ns = %s){of_id} "
        "ORDER BY c.checkpoint_id DESC LIMIT 1"
    )


#: The vendors whose checkpoint reads are one statement (:func:`_whole_statement`).
WHOLE_READS = frozenset({"postgresql", "sqlite"})


@functools.lru_cache(maxsize=64)
def _whole_statement(vendor: str, base: str, across: bool) -> str:
    """The checkpoints ``base`` selects (:data:`ROW`, then ``thread_name`` and ``ns`` if
    ``across`` chains) with their pending writes and blobs, in one statement whose text does
    not depend on how many channels or checkpoints there are: rows of (source ``c``, ``w`` or
    ``b``, head id, then as :meth:`CheckpointPath._read` unpacks them).

    The server expands each checkpoint's ``channel_versions`` and looks each pair up in the
    blobs' unique index (a blob the checkpoints of a page share comes once per checkpoint).
    Before, a branch per key: a ``list(10)`` of a 10-channel thread was 110 branches, 20.8 KB
    of SQL that PostgreSQL planned on every call (9.4 ms, against 2.6 ms of execution) and
    psycopg parsed on every call (its cache stops at 4,096 characters); the lookups now by a
    ``LATERAL`` subquery each, which PostgreSQL cannot turn into a hash of every blob of the
    thread (it did so once per checkpoint when its statistics were behind the table: 2.9 ms
    for that ``list(10)`` of a 200-checkpoint thread), and on SQLite by ``CROSS JOIN``, which
    fixes the join order (as an ``IN`` of row values it searched the index by the thread
    alone: 460 us for a ``get_tuple`` of a 200-checkpoint thread)."""
    quote, _head, _checkpoint, blob, write = _tables(vendor)
    data = quote.format("blob")
    names = "c.thread_name, c.ns" if across else "NULL, NULL"
    checkpoints = (
        "SELECT 'c', c.thread_id, c.checkpoint_id, c.parent_checkpoint_id, NULL, NULL, NULL, "
        "c.type, c.checkpoint, c.metadata_type, c.metadata, c.channel_versions, "
        f"{names}, c.id FROM page c"
    )
    tail = ", NULL, NULL, NULL, NULL, NULL, NULL"
    lookup = (
        "b.thread_id = c.thread_id AND b.channel = v.key AND b.version = v.value "
        "AND b.type <> 'empty'"
    )
    write_columns = (
        f"'w', w.thread_id, w.checkpoint_id, w.task_id, w.channel, w.task_path, w.idx, "
        f"w.type, w.{data}{tail}"
    )
    blob_columns = f"'b', b.thread_id, b.channel, b.version, NULL, NULL, NULL, b.type, b.{data}"
    if vendor == "postgresql":
        # OFFSET 0: a subquery PostgreSQL keeps (a parameterized index scan), not flattened
        # into a join it may hash.
        writes = (
            f"SELECT {write_columns} FROM page c CROSS JOIN LATERAL (SELECT * FROM {write} w "
            "WHERE w.thread_id = c.thread_id AND w.checkpoint_id = c.checkpoint_id OFFSET 0) w"
        )
        blobs = (
            f"SELECT {blob_columns}{tail} FROM page c CROSS JOIN LATERAL "
            f"jsonb_each_text(c.channel_versions) v CROSS JOIN LATERAL (SELECT * FROM {blob} b "
            f"WHERE {lookup} LIMIT 1) b"
        )
    else:
        writes = (
            f"SELECT {write_columns} FROM page c CROSS JOIN {write} w "
            "WHERE w.thread_id = c.thread_id AND w.checkpoint_id = c.checkpoint_id"
        )
        blobs = (
            f"SELECT {blob_columns}{tail} FROM page c CROSS JOIN json_each(c.channel_versions) v "
            f"CROSS JOIN {blob} b WHERE {lookup}"
        )
    # The checkpoints first: their columns name the types of the others' NULLs on PostgreSQL.
    return f"WITH page AS ({base}) {checkpoints} UNION ALL {writes} UNION ALL {blobs}"


@functools.lru_cache(maxsize=256)
def _parts_statement(vendor: str, blobs: int, checkpoints: int) -> str:
    """The blobs of ``blobs`` (thread, channel, version) keys and the pending writes of
    ``checkpoints`` (thread, checkpoint id) keys, in one statement: rows of (source ``b`` or
    ``w``, thread, channel or checkpoint id, version or task id, channel, task path, idx, type,
    blob).

    A branch per key, each one exact lookup on its unique index: as one ``WHERE`` of OR-ed keys,
    PostgreSQL took the thread id they share as the index condition and filtered every blob of
    the thread by the rest (7.7 ms for a checkpoint's 2 blobs in a thread of 11,000)."""
    quote, _head, _checkpoint, blob, write = _tables(vendor)
    data = quote.format("blob")  # a reserved word in the MySQL family
    blob_branch = (
        f"SELECT 'b', thread_id, channel, version, NULL, NULL, NULL, type, {data} FROM {blob} "
        "WHERE thread_id = %s AND channel = %s AND version = %s"
    )
    write_branch = (
        f"SELECT 'w', thread_id, checkpoint_id, task_id, channel, task_path, idx, type, {data} "
        f"FROM {write} WHERE thread_id = %s AND checkpoint_id = %s"
    )
    # Each branch in parentheses: MySQL then keeps them apart; the first names the columns'
    # types for the NULLs of the blob branches on PostgreSQL.
    branches = [write_branch] * checkpoints + [blob_branch] * blobs
    return " UNION ALL ".join(f"({branch})" if vendor == "mysql" else branch for branch in branches)


def refuse_delta_threads(refused: set[str]) -> None:
    """``prune(keep_latest)`` of threads that use a ``DeltaChannel``: refused, naming them, as
    LangGraph's ``PostgresSaver`` does (their latest checkpoint alone would load empty)."""
    if refused:
        raise NotImplementedError(
            "keep_latest can't prune threads that use a DeltaChannel: " + ", ".join(sorted(refused))
        )


@functools.lru_cache(maxsize=64)
def _page_statement(
    vendor: str, thread: bool, ns: bool, by_id: bool, before: bool, after: bool
) -> str:
    """A page of checkpoints newest first.

    Of one chain (a thread and a namespace: every LangGraph listing of a thread's history): the
    statement of :func:`_get_statement` with the page's bounds -- the head found first, the
    ``(thread, checkpoint_id)`` index walked from its end, stopping after the page (joined to
    the head, PostgreSQL read all 3,000 checkpoints of a chain and sorted them for a page of
    10). PostgreSQL picks that walk from its statistics: on a table that grew far beyond what
    its last ANALYZE saw, it may still sort the chain (3.8 ms at 3,000) until autovacuum
    analyzes it. Across chains, with each row's thread id and namespace, in the order (checkpoint id,
    head id), which the keyset ``after`` continues.

    Parameters: thread id, namespace, checkpoint id, ``before``, ``after`` (one chain: its
    checkpoint id; else checkpoint id twice and head id) where given, then the page's size."""
    quote, head, checkpoint, _blob, _write = _tables(vendor)
    columns = ", ".join(f"c.{column}" for column in ROW)
    bounds = [
        *(["c.checkpoint_id = %s"] if by_id else []),
        *(["c.checkpoint_id < %s"] if before else []),
    ]
    if thread and ns:
        if after:
            bounds.append("c.checkpoint_id < %s")
        if vendor == "mysql":
            # As the logs' reads (agentmemory.logs._read_statement): on an equality MariaDB
            # 10.11 reads by `ref` on thread_id alone, from the end, and filters a `before`
            # bound row by row (1,510 rows for a page of 10); two values (0 is no id) and the
            # order of the whole index make it one range over both columns.
            source = f"{head} h JOIN {checkpoint} c FORCE INDEX ({quote.format(BY_ID)})"
            conditions = ["h.thread_id = %s", "h.checkpoint_ns = %s", "c.thread_id IN (h.id, 0)"]
            conditions += bounds
            return (
                f"SELECT {columns} FROM {source} WHERE {' AND '.join(conditions)} "
                "ORDER BY c.thread_id DESC, c.checkpoint_id DESC LIMIT %s"
            )
        else:
            source = f"{checkpoint} c"
            conditions = [
                f"c.thread_id = (SELECT id FROM {head} WHERE thread_id = %s AND checkpoint_ns = %s)",
                *bounds,
            ]
        return (
            f"SELECT {columns} FROM {source} WHERE {' AND '.join(conditions)} "
            "ORDER BY c.checkpoint_id DESC LIMIT %s"
        )
    names = [*(["thread_id = %s"] if thread else []), *(["checkpoint_ns = %s"] if ns else [])]
    conditions = (
        [f"c.thread_id IN (SELECT id FROM {head} WHERE {' AND '.join(names)})"] if names else []
    )
    conditions += bounds
    if after:
        conditions.append("(c.checkpoint_id < %s OR (c.checkpoint_id = %s AND c.thread_id < %s))")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return (
        f"SELECT {columns}, h.thread_id AS thread_name, h.checkpoint_ns AS ns FROM {checkpoint} c "
        f"JOIN {head} h ON h.id = c.thread_id{where} "
        "ORDER BY c.checkpoint_id DESC, c.thread_id DESC LIMIT %s"
    )
