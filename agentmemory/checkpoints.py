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

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Q

from . import clock
from .defects import failpoint_before_checkpoint
from .errors import CheckpointConflict
from .models import Checkpoint, CheckpointBlob, CheckpointThread, CheckpointWrite
from .retries import Retrier
from .vendors import insert_if_missing
from .writes import UNLOCKED_GAP_SECONDS, one_write_at_a_time

#: A serializer's output: ``(type, bytes)`` as LangGraph's ``dumps_typed`` returns it.
Typed = tuple[str, bytes]
#: How many checkpoints one read of a listing fetches (with their blobs and writes).
PAGE = 100


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
    # The order of a listing: (checkpoint id, row id), newest first.
    cursor: tuple[str, int] = ("", 0)


@dataclass(frozen=True, slots=True)
class NewBlob:
    channel: str
    version: str
    value: Typed | None  # None: the channel was written empty ("empty" in LangGraph's savers)


class CheckpointPath:
    """Mutations and reads of the checkpoint chains of one database alias, with its retries.

    ``row_lock=False`` is the store's declared unsafe seam here too: a put compares its parent
    with the latest checkpoint it read *before* taking the lock, then writes -- two writers
    that loaded one latest checkpoint both extend it (a silent fork). For the tests and
    memcheck that show the checks catch it; never for real data."""

    def __init__(self, using: str, retrier: Retrier, *, row_lock: bool = True) -> None:
        self.using = using
        self.retrier = retrier
        self.row_lock = row_lock

    # ------------------------------------------------------------------ mutations

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
        observed = None if self.row_lock else self._latest_unlocked(thread_id, checkpoint_ns)

        def attempt(_retry: bool) -> None:
            now = clock.now()
            head = self._lock(thread_id, checkpoint_ns, now, create=True)
            assert head is not None
            rows = Checkpoint.objects.using(self.using)
            stored = rows.filter(thread_id=head.id, checkpoint_id=checkpoint_id)
            fields = {
                "parent_checkpoint_id": parent_checkpoint_id,
                "type": checkpoint[0],
                "checkpoint": checkpoint[1],
                "metadata_type": metadata[0],
                "metadata": metadata[1],
                "run_id": run_id,
                "channel_versions": versions,
            }
            if stored.update(**fields):
                self._insert_blobs(head, blobs)
                return  # the same checkpoint again: a retry, or LangGraph saving it anew
            if expect is not None and parent_checkpoint_id is not None:
                latest = observed if observed is not None else self._latest(head)
                if parent_checkpoint_id not in (latest, expect):
                    raise CheckpointConflict(
                        thread_id, checkpoint_ns, parent=parent_checkpoint_id, latest=latest
                    )
            self._insert_blobs(head, blobs)
            rows.create(thread_id=head.id, checkpoint_id=checkpoint_id, created_at=now, **fields)

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt)

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

        def attempt(_retry: bool) -> None:
            head = self._lock(thread_id, checkpoint_ns, clock.now(), create=True)
            assert head is not None
            rows = CheckpointWrite.objects.using(self.using).filter(
                thread_id=head.id, checkpoint_id=checkpoint_id, task_id=task_id
            )
            have = set(rows.filter(idx__in=[w[0] for w in writes]).values_list("idx", flat=True))
            new = []
            for idx, channel, (kind, data) in writes:
                if idx in have:
                    if idx < 0:
                        rows.filter(idx=idx).update(
                            channel=channel, type=kind, blob=data, task_path=task_path
                        )
                    continue
                have.add(idx)
                new.append(
                    CheckpointWrite(
                        thread_id=head.id,
                        checkpoint_id=checkpoint_id,
                        task_id=task_id,
                        idx=idx,
                        task_path=task_path,
                        channel=channel,
                        type=kind,
                        blob=data,
                    )
                )
            CheckpointWrite.objects.using(self.using).bulk_create(new)

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt)

    def delete_threads(self, thread_ids: Iterable[str]) -> None:
        """Delete every chain of these threads with its checkpoints, blobs and writes."""
        self._delete(Q(thread_id__in=list(thread_ids)))

    def delete_runs(self, run_ids: Iterable[str]) -> None:
        """Delete the checkpoints these runs made (by their metadata's ``run_id``) and their
        pending writes; the blobs stay (a checkpoint of another run may share them)."""
        run_ids = list(run_ids)
        if not run_ids:
            return

        def attempt(_retry: bool) -> None:
            doomed = Checkpoint.objects.using(self.using).filter(run_id__in=run_ids)
            for head_id, checkpoint_id in doomed.values_list("thread_id", "checkpoint_id"):
                CheckpointWrite.objects.using(self.using).filter(
                    thread_id=head_id, checkpoint_id=checkpoint_id
                ).delete()
            doomed.delete()

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt)

    def copy_thread(self, source: str, target: str) -> None:
        """Copy every chain of ``source`` -- checkpoints, blobs, writes -- to ``target``, all or
        nothing; what ``target`` already has of the same ids is kept."""

        def attempt(_retry: bool) -> None:
            now = clock.now()
            db = self.using
            for head in CheckpointThread.objects.using(db).filter(thread_id=source):
                copy = self._lock(target, head.checkpoint_ns, now, create=True)
                assert copy is not None
                for model, unique in (
                    (Checkpoint, ("checkpoint_id",)),
                    (CheckpointBlob, ("channel", "version")),
                    (CheckpointWrite, ("checkpoint_id", "task_id", "idx")),
                ):
                    have = set(
                        model.objects.using(db).filter(thread_id=copy.id).values_list(*unique)
                    )
                    rows = []
                    for row in model.objects.using(db).filter(thread_id=head.id).iterator():
                        if tuple(getattr(row, name) for name in unique) in have:
                            continue
                        row.pk, row.thread_id = None, copy.id
                        rows.append(row)
                    model.objects.using(db).bulk_create(rows, batch_size=500)

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt)

    def prune(self, thread_ids: Iterable[str], *, keep_latest: bool) -> None:
        """Keep only the latest checkpoint of each chain of these threads, with its pending
        writes and the blobs it reads (``keep_latest=False``: delete the threads)."""
        thread_ids = list(thread_ids)
        if not keep_latest:
            self.delete_threads(thread_ids)
            return

        def attempt(_retry: bool) -> None:
            db = self.using
            for head in CheckpointThread.objects.using(db).filter(thread_id__in=thread_ids):
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
            self.retrier.atomic(attempt)

    # ------------------------------------------------------------------ reads

    def get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        """The checkpoint ``checkpoint_id`` of the chain, or its latest (None: no such one)."""

        def work() -> StoredCheckpoint | None:
            rows = Checkpoint.objects.using(self.using).filter(
                thread__thread_id=thread_id, thread__checkpoint_ns=checkpoint_ns
            )
            if checkpoint_id is not None:
                rows = rows.filter(checkpoint_id=checkpoint_id)
            else:
                rows = rows.order_by("-checkpoint_id")
            found = self._complete(list(self._select(rows)[:1]))
            return found[0] if found else None

        return self.retrier.read(work)

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

        def work() -> list[StoredCheckpoint]:
            rows = Checkpoint.objects.using(self.using).all()
            if thread_id is not None:
                rows = rows.filter(thread__thread_id=thread_id)
            if checkpoint_ns is not None:
                rows = rows.filter(thread__checkpoint_ns=checkpoint_ns)
            if checkpoint_id is not None:
                rows = rows.filter(checkpoint_id=checkpoint_id)
            if before is not None:
                rows = rows.filter(checkpoint_id__lt=before)
            if after is not None:
                rows = rows.filter(
                    Q(checkpoint_id__lt=after[0]) | Q(checkpoint_id=after[0], id__lt=after[1])
                )
            rows = rows.order_by("-checkpoint_id", "-id")
            return self._complete(list(self._select(rows)[:size]))

        return self.retrier.read(work)

    # ------------------------------------------------------------------ helpers

    def _lock(
        self, thread_id: str, checkpoint_ns: str, now: datetime, *, create: bool
    ) -> CheckpointThread | None:
        """The chain's head, locked (created first when ``create``: two writers racing to start
        a chain never make two heads, and neither sees an IntegrityError)."""
        heads = CheckpointThread.objects.using(self.using).filter(
            thread_id=thread_id, checkpoint_ns=checkpoint_ns
        )
        locked = heads.select_for_update() if connections[self.using].vendor != "sqlite" else heads
        head = locked.first()
        if head is None and create:
            values = {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "created_at": now,
                "updated_at": now,
            }
            insert_if_missing(connections[self.using], CheckpointThread, values)
            head = locked.first()
        return head

    def _latest(self, head: CheckpointThread) -> str | None:
        return (
            Checkpoint.objects.using(self.using)
            .filter(thread_id=head.id)
            .order_by("-checkpoint_id")
            .values_list("checkpoint_id", flat=True)
            .first()
        )

    def _latest_unlocked(self, thread_id: str, checkpoint_ns: str) -> str | None:
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

    def _insert_blobs(self, head: CheckpointThread, blobs: Sequence[NewBlob]) -> None:
        """Each blob once: a version already stored is kept (versions never change value)."""
        if not blobs:
            return
        db = self.using
        wanted = Q()
        for blob in blobs:
            wanted |= Q(channel=blob.channel, version=blob.version)
        have = set(
            CheckpointBlob.objects.using(db)
            .filter(thread_id=head.id)
            .filter(wanted)
            .values_list("channel", "version")
        )
        CheckpointBlob.objects.using(db).bulk_create(
            [
                CheckpointBlob(
                    thread_id=head.id,
                    channel=blob.channel,
                    version=blob.version,
                    type="empty" if blob.value is None else blob.value[0],
                    blob=None if blob.value is None else blob.value[1],
                )
                for blob in blobs
                if (blob.channel, blob.version) not in have
            ]
        )

    @staticmethod
    def _select(rows: Any) -> Any:
        return rows.values_list(
            "id",
            "thread_id",
            "thread__thread_id",
            "thread__checkpoint_ns",
            "checkpoint_id",
            "parent_checkpoint_id",
            "type",
            "checkpoint",
            "metadata_type",
            "metadata",
            "channel_versions",
        )

    def _complete(self, rows: list[tuple[Any, ...]]) -> list[StoredCheckpoint]:
        """The checkpoints of these rows with their blobs and pending writes: three queries
        for a whole page."""
        if not rows:
            return []
        db = self.using
        wanted, by_checkpoint = Q(), Q()
        for row in rows:
            head_id, checkpoint_id, versions = row[1], row[4], row[10]
            by_checkpoint |= Q(thread_id=head_id, checkpoint_id=checkpoint_id)
            for channel, version in versions.items():
                wanted |= Q(thread_id=head_id, channel=channel, version=version)
        blobs: dict[tuple[int, str, str], Typed] = {}
        if wanted:
            found = CheckpointBlob.objects.using(db).filter(wanted).exclude(type="empty")
            for head_id, channel, version, kind, data in found.values_list(
                "thread_id", "channel", "version", "type", "blob"
            ):
                blobs[(head_id, channel, version)] = (kind, bytes(data))
        writes: dict[tuple[int, str], list[StoredWrite]] = {}
        found_writes = CheckpointWrite.objects.using(db).filter(by_checkpoint)
        for (
            head_id,
            checkpoint_id,
            task_id,
            idx,
            path,
            channel,
            kind,
            data,
        ) in found_writes.values_list(
            "thread_id", "checkpoint_id", "task_id", "idx", "task_path", "channel", "type", "blob"
        ):
            writes.setdefault((head_id, checkpoint_id), []).append(
                StoredWrite(task_id, channel, (kind, bytes(data)), path, idx)
            )
        result = []
        for (
            row_id,
            head_id,
            thread_id,
            ns,
            checkpoint_id,
            parent,
            kind,
            data,
            mkind,
            mdata,
            versions,
        ) in rows:
            own = writes.get((head_id, checkpoint_id), [])
            own.sort(key=lambda w: (w.task_path, w.task_id, w.idx))
            result.append(
                StoredCheckpoint(
                    thread_id,
                    ns,
                    checkpoint_id,
                    parent,
                    (kind, bytes(data)),
                    (mkind, bytes(mdata)),
                    {
                        channel: blobs[(head_id, channel, version)]
                        for channel, version in versions.items()
                        if (head_id, channel, version) in blobs
                    },
                    own,
                    (checkpoint_id, row_id),
                )
            )
        return result

    def _delete(self, heads: Q) -> None:
        def attempt(_retry: bool) -> None:
            ids = list(
                CheckpointThread.objects.using(self.using)
                .filter(heads)
                .values_list("id", flat=True)
            )
            if not ids:
                return
            for model in (CheckpointWrite, CheckpointBlob, Checkpoint):
                model.objects.using(self.using).filter(thread_id__in=ids).delete()
            CheckpointThread.objects.using(self.using).filter(id__in=ids).delete()

        with one_write_at_a_time(self.using):
            self.retrier.atomic(attempt)
