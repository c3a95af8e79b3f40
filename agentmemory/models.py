"""Two tables for memories: the live row of each memory, and its append-only history; three for
logs: the head of each log, its items and its events.

The live row stays after a forget or an expiry as a tombstone (``state`` says which): it carries the
version counter and is what the row lock locks, so the history stays linear across forget, expiry
and re-creation, and the history rows keep their parent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db import connections, models, router, transaction
from django.utils import timezone

from . import clock
from .fields import ExactCharField
from .records import LogOp, Op
from .validation import (
    CHECKPOINT_NAME_MAX,
    CHECKPOINT_NS_MAX,
    IDEMPOTENCY_KEY_MAX,
    KEY_MAX,
    PRINCIPAL_MAX,
    SESSION_ID_MAX,
    THREAD_ID_MAX,
    visible,
)


class MemoryState(models.TextChoices):
    LIVE = "live", "live"
    FORGOTTEN = "forgotten", "forgotten"
    EXPIRED = "expired", "expired"


def is_live(state: str, expires_at: datetime | None, now: datetime) -> bool:
    """The one rule of what a reader may see: a live row whose TTL has not passed."""
    return state == MemoryState.LIVE and (expires_at is None or expires_at > now)


#: The columns of a memory that the Redis tier serves (a record's): an ORM write of any of them
#: drops the tier's entries of the rows it changes.
SERVED_FIELDS = frozenset(
    {"session_id", "key", "value", "version", "state", "created_at", "updated_at", "expires_at"}
)
#: Rows per statement of the ORM's invalidating writes (under SQLite's 999 variables).
ORM_CHUNK = 500


class MemoryQuerySet(models.QuerySet):
    """Memories through Django's ORM. Its writes -- ``delete()``, ``update()``,
    ``bulk_update()``, ``bulk_create()`` -- keep the Redis tier from serving what the database
    no longer holds: the rows they change are locked and read first, changed by their ids, and
    the tier drops their entries once the transaction commits
    (:func:`agentmemory.cache.invalidate_on_commit`). A cleanup from a shell, a data migration
    or a GDPR script may use them; the store's own API (``erase_session``, ``forget``) records
    versions and is what an agent's code should call."""

    def live(self, now: datetime | None = None) -> MemoryQuerySet:
        """Rows :func:`is_live` at ``now`` (the store's clock by default)."""
        now = now or clock.now()
        return self.filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now),
            state=MemoryState.LIVE,
        )

    def _locked_rows(self) -> list[tuple[int, str, str]]:
        """``(id, session_id, key)`` of the matching rows, locked until the transaction ends
        (SQLite: its write lock, taken by the statement that follows)."""
        from .sql import lock_for_delete  # sql imports the models

        rows = self.order_by("session_id", "key").values_list("id", "session_id", "key")
        return lock_for_delete(connections[self.db], rows)

    def _by_ids(self, ids: list[int]) -> Iterator[models.QuerySet]:
        """Plain querysets of these rows, :data:`ORM_CHUNK` ids each."""
        for start in range(0, len(ids), ORM_CHUNK):
            yield Memory._base_manager.using(self.db).filter(id__in=ids[start : start + ORM_CHUNK])

    def delete(self) -> tuple[int, dict[str, int]]:
        # Django's own refusals first, with its messages.
        self._not_support_combined_queries("delete")
        if self.query.is_sliced:
            raise TypeError("Cannot use 'limit' or 'offset' with delete().")
        if self.query.distinct_fields or self.query.distinct:
            raise TypeError("Cannot call delete() after .distinct(*fields).")
        with transaction.atomic(using=self.db, savepoint=False):
            rows = self._locked_rows()
            total, counts = 0, Counter[str]()
            for chunk in self._by_ids([row[0] for row in rows]):
                deleted, by_model = chunk.delete()
                total += deleted
                counts.update(by_model)
            _invalidate(self.db, [(s, k) for _id, s, k in rows])
        return total, dict(counts)

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]

    def update(self, **kwargs: Any) -> int:
        if not SERVED_FIELDS & set(kwargs):
            return super().update(**kwargs)  # what the tier does not serve (vectors, watermark)
        self._not_support_combined_queries("update")
        if self.query.is_sliced:
            raise TypeError("Cannot update a query once a slice has been taken.")
        with transaction.atomic(using=self.db, savepoint=False):
            rows = self._locked_rows()
            ids = [row[0] for row in rows]
            updated = sum(chunk.update(**kwargs) for chunk in self._by_ids(ids))
            pairs = [(s, k) for _id, s, k in rows]
            if {"session_id", "key"} & set(kwargs):  # the new names' entries too
                for chunk in self._by_ids(ids):
                    pairs += list(chunk.values_list("session_id", "key"))
            _invalidate(self.db, pairs)
        return updated

    update.alters_data = True  # type: ignore[attr-defined]

    def bulk_update(self, objs: Iterable[Memory], fields: Iterable[str], **kwargs: Any) -> int:
        objs, fields = list(objs), list(fields)
        if not SERVED_FIELDS & set(fields):
            return super().bulk_update(objs, fields, **kwargs)
        with transaction.atomic(using=self.db, savepoint=False):
            from .sql import lock_for_delete  # sql imports the models

            old: list[tuple[str, str]] = []
            for chunk in self._by_ids([obj.pk for obj in objs]):
                old += lock_for_delete(connections[self.db], chunk.values_list("session_id", "key"))
            updated = super().bulk_update(objs, fields, **kwargs)
            _invalidate(self.db, old + [(obj.session_id, obj.key) for obj in objs])
        return updated

    bulk_update.alters_data = True  # type: ignore[attr-defined]

    def bulk_create(self, objs: Iterable[Memory], *args: Any, **kwargs: Any) -> list[Memory]:
        objs = list(objs)
        with transaction.atomic(using=self.db, savepoint=False):
            created = super().bulk_create(objs, *args, **kwargs)
            # The tier may hold an entry of such a key (an absent memory, a tombstone).
            _invalidate(self.db, [(obj.session_id, obj.key) for obj in objs])
        return created

    bulk_create.alters_data = True  # type: ignore[attr-defined]


def _invalidate(using: str, pairs: list[tuple[str, str]]) -> None:
    from .cache import invalidate_on_commit  # the tier imports the models

    invalidate_on_commit(using, pairs)


class Memory(models.Model):
    """The current state of one ``(session_id, key)``: one row, ever."""

    id = models.BigAutoField(primary_key=True)
    session_id = ExactCharField(max_length=SESSION_ID_MAX)
    key = ExactCharField(max_length=KEY_MAX)
    value = models.JSONField(null=True)
    version = models.PositiveBigIntegerField(default=0)
    state = models.CharField(max_length=16, choices=MemoryState.choices, default=MemoryState.LIVE)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    # The lowest version still in the history: versions below it were pruned (retention).
    # "No gap" means no gap from here to ``version``.
    # A database default too: rows inserted by SQL of one's own (bulk loads) start at 1.
    history_from = models.PositiveBigIntegerField(default=1, db_default=1)
    # The vectors of the live version's indexed texts (agentmemory.semantic): written in the
    # same statement as the value, so a search never pairs a value with another version's.
    embedding = models.BinaryField(null=True, editable=False)
    # A random name for those vectors, new with every write that stores some: vectors never
    # change under a name, so a process may keep them by it (semantic.VectorCache).
    embedding_key = models.BigIntegerField(null=True, editable=False)

    objects = MemoryQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "memories"
        constraints = [
            # One live row per (session_id, key); it also serves recall and recall_many(prefix=).
            models.UniqueConstraint(
                fields=["session_id", "key"], name="agentmemory_one_row_per_key"
            ),
        ]
        indexes = [
            # purge_expired scans by expiry.
            models.Index(fields=["expires_at"], name="agentmemory_expires_idx"),
            # A search lists a session's live, indexed memories by their vectors' names from
            # this index alone, without reading the rows. Unchanged by writes without a semantic
            # index (their embedding_key stays NULL) unless a TTL or a forget changes the row.
            models.Index(
                fields=["session_id", "embedding_key", "state", "expires_at", "id"],
                name="agentmemory_search_idx",
            ),
        ]

    def __str__(self) -> str:
        # Shown in the admin's titles, breadcrumbs and log: bidirectional-text controls are
        # spelled out, so an id cannot make the text around it read differently.
        return f"{visible(self.session_id)}/{visible(self.key)} v{self.version}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Saved as Django saves it; then, once the transaction commits, the Redis tier drops
        its entries of this memory's key (and of the key it had, if that changed)."""
        fields = kwargs.get("update_fields")
        if fields is not None and not SERVED_FIELDS & set(fields):
            return super().save(*args, **kwargs)
        using = kwargs.get("using") or router.db_for_write(Memory, instance=self)
        with transaction.atomic(using=using, savepoint=False):
            before = (
                None
                if self.pk is None
                else Memory._base_manager.using(using)
                .filter(pk=self.pk)
                .values_list("session_id", "key")
                .first()
            )
            super().save(*args, **kwargs)
            _invalidate(using, [(self.session_id, self.key), *([before] if before else [])])

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        """Deleted as Django deletes it (its history with it); the tier drops its entry once
        the transaction commits."""
        using = kwargs.get("using") or router.db_for_write(Memory, instance=self)
        with transaction.atomic(using=using, savepoint=False):
            deleted = super().delete(*args, **kwargs)
            _invalidate(using, [(self.session_id, self.key)])
        return deleted


class MemoryVersion(models.Model):
    """One version of a memory. Append-only; ``(memory, version)`` is unique."""

    id = models.BigAutoField(primary_key=True)
    memory = models.ForeignKey(Memory, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveBigIntegerField()
    op = models.CharField(max_length=8, choices=[(op.value, op.value) for op in Op])
    value = models.JSONField(null=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    # The caller's idempotency key, or one the store generated for this call: a retry after an
    # indeterminate commit finds it and returns the version the first attempt wrote.
    request_id = ExactCharField(max_length=IDEMPOTENCY_KEY_MAX + 4)
    # The version's vectors as it was indexed (None: not indexed, or a forget/expire).
    embedding = models.BinaryField(null=True, editable=False)

    class Meta:
        ordering = ["memory", "version"]
        constraints = [
            # Even a write that skipped the row lock could not commit a second copy of a version.
            models.UniqueConstraint(
                fields=["memory", "version"], name="agentmemory_one_row_per_version"
            ),
            models.UniqueConstraint(
                fields=["memory", "request_id"], name="agentmemory_one_version_per_request"
            ),
        ]

    def __str__(self) -> str:
        return f"v{self.version} {self.op}"


class PendingInvalidation(models.Model):
    """A key whose cache entry may be older than the database: its writer could not reach Redis.
    While any exists, readers do not renew the cache fence; the next reader that reaches Redis
    deletes those entries, then these rows."""

    id = models.BigAutoField(primary_key=True)
    session_id = ExactCharField(max_length=SESSION_ID_MAX)
    key = ExactCharField(max_length=KEY_MAX)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.session_id}/{self.key} pending since {self.created_at}"

    @classmethod
    def record(cls, using: str, session_id: str, keys: Iterable[str]) -> None:
        """Record these keys of the session as pending (the one place that does)."""
        cls.objects.using(using).bulk_create([cls(session_id=session_id, key=key) for key in keys])


class CacheIncarnation(models.Model):
    """How far this database has come, as the Redis tier counts it: one row whose counter a
    fence renewal moves forward after it has checked the entries stored since the last one
    against the database, and which the tier keeps in Redis too. A database whose counter is
    behind the one Redis holds went back in time -- a dump restored, a point-in-time recovery, an
    asynchronous replica promoted, a volume snapshot -- and the tier stops trusting everything
    it cached of it (:meth:`agentmemory.cache.MemoryCache.renew_fence`; docs/redis.md)."""

    #: The one row's primary key.
    ONLY = 1

    id = models.PositiveSmallIntegerField(primary_key=True)
    counter = models.PositiveBigIntegerField(default=0)
    moved_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"incarnation {self.counter} (moved {self.moved_at})"


class ShardMap(models.Model):
    """The shards this database's sessions are placed over (:mod:`agentmemory.sharding`): one
    row, written by the first :class:`~agentmemory.sharding.ShardedStore` that used the
    database, read by every other process's first call to it. A process with another list of
    shards would place some sessions elsewhere and split their calls between two databases: its
    calls are refused instead (``manage.py agentmemory_shards`` shows and changes the list)."""

    #: The one row's primary key.
    ONLY = 1

    id = models.PositiveSmallIntegerField(primary_key=True)
    shards = models.JSONField()
    recorded_at = models.DateTimeField(default=timezone.now)
    #: How many sessions have moved away from this database (:mod:`agentmemory.moves`): a read
    #: of several statements compares it before and after, and reads again if a move ended in
    #: between (a session moved away and back has new row ids).
    moves = models.PositiveBigIntegerField(default=0, db_default=0)

    def __str__(self) -> str:
        return f"shards {', '.join(self.shards)} (recorded {self.recorded_at})"


class GateState(models.TextChoices):
    """Where a session stands on a shard while it is moved (:mod:`agentmemory.moves`)."""

    #: Written here (the state of a session with no gate row).
    OPEN = "open", "open"
    #: Being copied to ``peer``: read here, written nowhere until the move ends.
    MOVING = "moving", "moving"
    #: Being copied here from ``peer``: written nowhere until the move ends.
    INCOMING = "incoming", "incoming"
    #: Lives on ``peer`` now: nothing of it is left here but this row.
    MOVED = "moved", "moved"


class SessionGate(models.Model):
    """A session's gate on one shard (:mod:`agentmemory.moves`): every write of a shard's store
    passes it in its own transaction, serialized with the mover's change of state, so that no
    write lands on a shard after the session's rows were copied from it. Most sessions have no
    row (open) on SQLite and PostgreSQL; on the MySQL family every written session has one, which
    each write updates (``writes``), as a Galera cluster certifies only rows written."""

    id = models.BigAutoField(primary_key=True)
    session_id = ExactCharField(max_length=SESSION_ID_MAX, unique=True)
    state = models.CharField(max_length=16, choices=GateState.choices, default=GateState.OPEN)
    #: The other shard of a move: where the session went (moved, moving) or came from.
    peer = models.CharField(max_length=100, blank=True, default="")
    writes = models.PositiveBigIntegerField(default=0)
    changed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        peer = f" ({self.peer})" if self.peer else ""
        return f"{visible(self.session_id)} {self.state}{peer}"


# ---------------------------------------------------------------------- logs


class Log(models.Model):
    """The head of one log, ``(session_id, stream)``: one row, ever, as a memory's live row.

    It is what a writer of the log locks, and it counts: the last sequence number given (items
    are numbered 1, 2, 3, ... with no gap and no reuse), the live items, the events. A clear or an
    expiry moves ``cleared_through`` up to ``last_seq`` instead of touching the items, so it costs
    the same at any length, and readers skip what it hides by that bound."""

    id = models.BigAutoField(primary_key=True)
    session_id = ExactCharField(max_length=SESSION_ID_MAX)
    stream = ExactCharField(max_length=KEY_MAX)
    last_seq = models.PositiveBigIntegerField(default=0)
    length = models.PositiveBigIntegerField(default=0)
    cleared_through = models.PositiveBigIntegerField(default=0)
    version = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session_id", "stream"], name="agentmemory_one_head_per_log"
            ),
        ]
        indexes = [models.Index(fields=["expires_at"], name="agentmemory_log_expires_idx")]

    def __str__(self) -> str:
        return f"{visible(self.session_id)}/{visible(self.stream)} ({self.length} items)"


class LogItem(models.Model):
    """One item of a log. Never rewritten: a pop marks it (``removed_in``: the event that
    popped it); a clear or an expiry hides it behind the head's ``cleared_through``."""

    id = models.BigAutoField(primary_key=True)
    log = models.ForeignKey(Log, on_delete=models.CASCADE, related_name="items")
    seq = models.PositiveBigIntegerField()
    value = models.JSONField(null=True)
    created_at = models.DateTimeField()
    removed_in = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["log", "seq"]
        constraints = [
            # Even an append that skipped the lock could not commit a second item of a number;
            # it also serves every read of a log, by (log, seq) in either direction.
            models.UniqueConstraint(fields=["log", "seq"], name="agentmemory_one_item_per_seq"),
        ]
        indexes = [
            # The live items of a log in order (``removed_in IS NULL`` is an equality on every
            # database): a read or a pop walks live items only, never the popped ones between
            # them -- after m pops in a row the next would otherwise pass over m rows.
            models.Index(fields=["log", "removed_in", "seq"], name="agentmemory_live_items_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq}"


class LogEvent(models.Model):
    """One mutation of a log -- an append (of one or many items), a pop, a clear, an expiry --
    numbered 1, 2, 3, ... per log as a memory's versions are: the log's audit trail."""

    id = models.BigAutoField(primary_key=True)
    log = models.ForeignKey(Log, on_delete=models.CASCADE, related_name="events")
    version = models.PositiveBigIntegerField()
    op = models.CharField(max_length=8, choices=[(op.value, op.value) for op in LogOp])
    # The items it concerns: appended, popped (one), or hidden by a clear or an expiry.
    first_seq = models.PositiveBigIntegerField()
    last_seq = models.PositiveBigIntegerField()
    # How many live items it added or removed.
    count = models.PositiveBigIntegerField()
    created_at = models.DateTimeField()
    # As a memory version's: the caller's idempotency key or one generated for the call.
    request_id = ExactCharField(max_length=IDEMPOTENCY_KEY_MAX + 4)

    class Meta:
        ordering = ["log", "version"]
        constraints = [
            models.UniqueConstraint(fields=["log", "version"], name="agentmemory_one_log_event"),
            models.UniqueConstraint(
                fields=["log", "request_id"], name="agentmemory_one_log_event_per_request"
            ),
        ]

    def __str__(self) -> str:
        return f"e{self.version} {self.op} #{self.first_seq}-{self.last_seq}"


# ---------------------------------------------------------------------- checkpoints


class CheckpointThread(models.Model):
    """The head of one checkpoint chain, ``(thread_id, checkpoint_ns)``: one row, ever, as a log's
    head. Every ``put`` and ``put_writes`` of the chain locks it (insert-if-missing, then
    ``SELECT ... FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE``), so that a put can compare its parent
    with the chain's latest checkpoint and write in one step: two writers that loaded the same
    latest checkpoint never both extend it."""

    id = models.BigAutoField(primary_key=True)
    thread_id = ExactCharField(max_length=THREAD_ID_MAX)
    checkpoint_ns = ExactCharField(max_length=CHECKPOINT_NS_MAX, blank=True)
    # Counts the chain's puts and put_writes: each one writes the head as it locks it, so that
    # on a Galera cluster two of them from different nodes conflict at certification (a row
    # lock is local to its node; certification compares what transactions wrote).
    version = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread_id", "checkpoint_ns"], name="agentmemory_one_head_per_chain"
            ),
        ]

    def __str__(self) -> str:
        ns = f" [{visible(self.checkpoint_ns)}]" if self.checkpoint_ns else ""
        return f"{visible(self.thread_id)}{ns}"


class Checkpoint(models.Model):
    """One checkpoint of a chain, as LangGraph's serializer wrote it: the checkpoint without its
    channel values (they are :class:`CheckpointBlob` rows, one per channel version, shared by the
    checkpoints that did not change them) and its metadata."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique constraints below begin with it.
    thread = models.ForeignKey(
        CheckpointThread, on_delete=models.CASCADE, related_name="checkpoints", db_index=False
    )
    checkpoint_id = ExactCharField(max_length=CHECKPOINT_NAME_MAX)
    parent_checkpoint_id = ExactCharField(max_length=CHECKPOINT_NAME_MAX, null=True, blank=True)
    type = models.CharField(max_length=32)
    checkpoint = models.BinaryField()
    metadata_type = models.CharField(max_length=32)
    metadata = models.BinaryField()
    # The metadata's run_id, for delete_for_runs (None: the metadata has none).
    run_id = ExactCharField(max_length=CHECKPOINT_NAME_MAX, null=True, blank=True)
    # channel -> version (as a string): which blob holds each channel's value.
    channel_versions = models.JSONField(default=dict)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # Also the order of a chain: checkpoint ids increase with time (LangGraph's uuid6),
            # so the latest is the greatest, found from the end of this index.
            models.UniqueConstraint(
                fields=["thread", "checkpoint_id"], name="agentmemory_one_checkpoint_per_id"
            ),
        ]
        indexes = [models.Index(fields=["run_id"], name="agentmemory_checkpoint_run_idx")]

    def __str__(self) -> str:
        return self.checkpoint_id


class CheckpointBlob(models.Model):
    """The value of one channel at one version, written by the first checkpoint that had it."""

    id = models.BigAutoField(primary_key=True)
    thread = models.ForeignKey(
        CheckpointThread, on_delete=models.CASCADE, related_name="blobs", db_index=False
    )
    channel = ExactCharField(max_length=CHECKPOINT_NAME_MAX)
    version = ExactCharField(max_length=CHECKPOINT_NAME_MAX)
    type = models.CharField(max_length=32)
    blob = models.BinaryField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "channel", "version"], name="agentmemory_one_blob_per_version"
            ),
        ]

    def __str__(self) -> str:
        return f"{visible(self.channel)}@{self.version}"


class CheckpointWrite(models.Model):
    """A pending write of a task, made after a checkpoint (``checkpoint_id``: the checkpoint it
    follows; it need not be stored yet) and before the next: stored once per ``(task_id, idx)``,
    so a task's writes saved twice are saved once."""

    id = models.BigAutoField(primary_key=True)
    thread = models.ForeignKey(
        CheckpointThread, on_delete=models.CASCADE, related_name="writes", db_index=False
    )
    checkpoint_id = ExactCharField(max_length=CHECKPOINT_NAME_MAX)
    task_id = ExactCharField(max_length=CHECKPOINT_NAME_MAX)
    idx = models.BigIntegerField()
    task_path = models.TextField(blank=True)
    channel = ExactCharField(max_length=CHECKPOINT_NAME_MAX)
    type = models.CharField(max_length=32)
    blob = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "checkpoint_id", "task_id", "idx"],
                name="agentmemory_one_write_per_index",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id}[{self.idx}] {visible(self.channel)}"


# ---------------------------------------------------------------------- MCP


class McpToken(models.Model):
    """A bearer token of the MCP server (``manage.py agentmemory_mcp --http``), for one
    principal: a request that carries it acts as ``principal``, whose session ids are its own
    (:mod:`agentmemory.integrations.mcp`). Only the token's SHA-256 digest is stored -- the token
    is shown once, when it is created (``manage.py agentmemory_mcp_token create``) -- and its
    first characters (``prefix``), by which ``list`` and ``revoke`` name it."""

    id = models.BigAutoField(primary_key=True)
    principal = ExactCharField(max_length=PRINCIPAL_MAX, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    label = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "MCP token"

    def __str__(self) -> str:
        return f"{self.prefix}... ({visible(self.principal)})"
