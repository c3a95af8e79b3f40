"""agentmemory as LangGraph's checkpointer (``pip install "django-agentmemory[langgraph]"``)::

    from agentmemory.integrations.langgraph import AgentMemorySaver

    graph = builder.compile(checkpointer=AgentMemorySaver())
    graph.invoke(inputs, {"configurable": {"thread_id": "user-42"}})

Every method of ``BaseCheckpointSaver``, synchronous and asynchronous, the optional ones
(``delete_for_runs``, ``copy_thread``, ``prune``) too; it passes LangGraph's conformance suite
(``langgraph-checkpoint-conformance``) on every database agentmemory runs on. Beyond that suite,
what the chains' storage guarantees (:mod:`agentmemory.checkpoints`):

- **no silent fork** (langgraph #8796): two runs of one thread that both loaded its latest
  checkpoint never both extend it -- the later put raises :class:`~agentmemory.CheckpointConflict`
  and writes nothing, so that run stops with the error instead of a branch no reader sees.
  Forks asked for still work: a run from an older ``checkpoint_id`` (time travel),
  ``update_state`` on an older checkpoint, parentless puts (new roots);
- **no lost or doubled pending write** (#8115): concurrent ``put_writes`` of one checkpoint all
  land, and a task's writes saved twice are stored once;
- each put and put_writes is one transaction, retried by the store's policy, and exactly once.

How a put knows which rule applies: a checkpoint tuple this saver returns carries, in its
config's ``configurable``, the key ``"__agentmemory_expect__"``: ``""`` when it was the latest
checkpoint of its chain (loaded without a ``checkpoint_id``), the checkpoint's id when it was
asked for by id; and a config a put returns carries ``""`` too, whatever config the put was
given (a run that began on a new thread puts from the caller's own config). LangGraph carries a
loaded tuple's config into the puts of the run; a put whose config has the key must extend the
chain's latest checkpoint or the one the key names. A config without the key (one built by
hand) is stored by LangGraph's rule alone.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint
from langgraph.checkpoint.serde.base import SerializerProtocol

from .. import aio
from ..errors import InvalidMemory
from ..records import CHECKPOINT_PAGE, NewBlob, StoredCheckpoint
from ..validation import (
    CHECKPOINT_NAME_MAX,
    CHECKPOINT_NS_MAX,
    THREAD_ID_MAX,
    check_name,
    check_sequence,
    check_text,
    check_version,
)
from .threads import aliases_of, call_sync

if TYPE_CHECKING:  # the models need Django's settings: imported once a saver is made
    from ..store import MemoryStore

#: The key of a loaded checkpoint's ``configurable`` that tells a put which parents it may have.
EXPECT = "__agentmemory_expect__"
STRATEGIES = ("keep_latest", "delete")
T = TypeVar("T")


class AgentMemorySaver(BaseCheckpointSaver[str]):
    """LangGraph's ``BaseCheckpointSaver`` on agentmemory's checkpoint chains.

    ``store``: the :class:`~agentmemory.MemoryStore` whose database keeps them (default: one on
    the settings' database; the Redis tier does not serve checkpoints). ``serde``: the
    serializer, as for every LangGraph saver (default LangGraph's ``JsonPlusSerializer``).

    Raises, beyond what the database may (after the store's retries,
    :class:`~agentmemory.MemoryUnavailable`): :class:`~agentmemory.CheckpointConflict` from a
    put that would fork a chain silently; :class:`~agentmemory.InvalidMemory` (a
    ``ValueError``) for a config without a ``thread_id``, an id or namespace over its length
    limit, a ``channels`` that is not a list, or an unknown prune strategy -- before any query;
    ``NotImplementedError`` from ``prune(..., strategy="keep_latest")`` of a thread that uses a
    ``DeltaChannel`` (its latest checkpoint alone would load those channels empty; nothing is
    pruned), as LangGraph's ``PostgresSaver``."""

    def __init__(
        self, store: MemoryStore | None = None, *, serde: SerializerProtocol | None = None
    ) -> None:
        from ..store import MemoryStore

        super().__init__(serde=serde)
        self.store = store if store is not None else MemoryStore(cache=None)
        self.chains = self.store.checkpoints

    def __repr__(self) -> str:
        return f"<AgentMemorySaver {self.store!r}>"

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, conn_string: str, *, serde: SerializerProtocol | None = None
    ) -> Iterator[AgentMemorySaver]:
        """A saver on the database of a URL (``sqlite:///memory.db``, ``postgres://...``,
        ``mysql://...``), as LangGraph's savers are made, without a Django project
        (:func:`agentmemory.setup`): ``with AgentMemorySaver.from_conn_string(url) as saver``."""
        from ..standalone import setup

        yield cls(setup(conn_string), serde=serde)

    # ---------------------------------------------------------------- synchronous

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._call("get_tuple", self._get_tuple, config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        listing = _Listing(self, config, filter, before, limit)
        while (page := self._call("list", listing.next_page)) is not None:
            yield from page

    def put(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._call("put", self._put, config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._call("put_writes", self._put_writes, config, writes, task_id, task_path)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """What a ``DeltaChannel`` rebuilds its value from at the checkpoint ``config`` names
        (its ``checkpoint_id``, or the thread's latest): per channel, the pending writes of its
        ancestors (nearest first, up to the nearest one holding the channel's value: the
        ``seed``), returned oldest first. LangGraph's default walks ``get_tuple`` once per
        ancestor; this reads the walk in a few statements
        (:meth:`~agentmemory.checkpoints.CheckpointPath.delta_history`)."""
        return self._call("get_delta_channel_history", self._delta_history, config, channels)

    def delete_thread(self, thread_id: str) -> None:
        self._call("delete_thread", self.chains.delete_threads, [_thread_id(thread_id)])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._call("delete_for_runs", self.chains.delete_runs, _run_ids(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source, target = _thread_id(source_thread_id), _thread_id(target_thread_id)
        self._call("copy_thread", self.chains.copy_thread, source, target)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._call("prune", self._prune, thread_ids, strategy)

    def get_next_version(self, current: str | int | float | None, channel: None = None) -> str:
        """The next version of a channel: the count, zero-padded, and a random fraction, as
        LangGraph's ``PostgresSaver`` makes them -- two branches of a fork that each write a
        channel give its versions different names, so their blobs never meet."""
        if current is None:
            number = 0
        elif isinstance(current, str):
            number = int(current.split(".")[0])
        else:
            number = int(current)
        return f"{number + 1:032}.{random.random():016}"

    # ---------------------------------------------------------------- asynchronous

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await aio.run(self._get_tuple, config)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await aio.run(self._delta_history, config, channels)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        listing = _Listing(self, config, filter, before, limit)
        while (page := await aio.run(listing.next_page)) is not None:
            for found in page:
                yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await aio.run(self._put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await aio.run(self._put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await aio.run(self.chains.delete_threads, [_thread_id(thread_id)])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await aio.run(self.chains.delete_runs, _run_ids(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source, target = _thread_id(source_thread_id), _thread_id(target_thread_id)
        await aio.run(self.chains.copy_thread, source, target)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await aio.run(self._prune, thread_ids, strategy)

    # ---------------------------------------------------------------- the work

    def _call(self, method: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` where a synchronous call of ``method`` runs: in the caller's thread,
        or on the store's pool for a thread of LangGraph's own (:func:`call_sync`)."""
        use = f"`await saver.a{method}(...)`"
        return call_sync(type(self).__name__, aliases_of(self.store), use, fn, *args)

    def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, checkpoint_ns = _chain(config)
        checkpoint_id = _checkpoint_id(config)
        stored = self.chains.get(thread_id, checkpoint_ns, checkpoint_id)
        if stored is None:
            return None
        # Loaded as the latest, a put from it must extend the latest; asked for by id, a put
        # from it may fork there.
        return self._tuple(stored, expect=checkpoint_id or "")

    def _delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> dict[str, DeltaChannelHistory]:
        thread_id, checkpoint_ns = _chain(config)
        wanted = [_name("channel", channel) for channel in check_sequence("channels", channels)]
        if not wanted:
            return {}
        found = self.chains.delta_history(thread_id, checkpoint_ns, _checkpoint_id(config), wanted)
        loads = self.serde.loads_typed
        result: dict[str, DeltaChannelHistory] = {}
        for channel, history in found.items():
            entry: DeltaChannelHistory = {
                "writes": [(w.task_id, w.channel, loads(w.value)) for w in history.writes]
            }
            if history.seed is not None:
                entry["seed"] = loads(history.seed)
            result[channel] = entry
        return result

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, checkpoint_ns = _chain(config)
        configurable = config["configurable"]
        parent = _checkpoint_id(config)
        expect = configurable.get(EXPECT)
        checkpoint_id = _name("checkpoint id", checkpoint["id"])
        stored = dict(checkpoint)
        values = stored.pop("channel_values", {})
        blobs = [
            NewBlob(
                _name("channel", channel),
                _name("channel version", str(version)),
                self.serde.dumps_typed(values[channel]) if channel in values else None,
            )
            for channel, version in new_versions.items()
        ]
        saved_metadata = get_serializable_checkpoint_metadata(config, metadata)
        run_id = saved_metadata.get("run_id")
        self.chains.put(
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            parent,
            expect=None if expect is None else str(expect),
            checkpoint=self.serde.dumps_typed(stored),
            metadata=self.serde.dumps_typed(saved_metadata),
            run_id=None if run_id is None else str(run_id)[:CHECKPOINT_NAME_MAX],
            versions={
                channel: str(version) for channel, version in checkpoint["channel_versions"].items()
            },
            blobs=blobs,
        )
        returned: dict[str, Any] = {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
        # Whatever config the put was given (a run that began on a new thread puts from the
        # caller's own, without the key): a put from the config it returns must extend the
        # checkpoint just stored, or the chain's latest -- two writers going on from one
        # returned config never fork the chain silently.
        returned[EXPECT] = ""
        return {"configurable": returned}

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        thread_id, checkpoint_ns = _chain(config)
        checkpoint_id = _checkpoint_id(config)
        if checkpoint_id is None:
            raise InvalidMemory(
                "config", "put_writes needs the checkpoint's id (configurable.checkpoint_id)"
            )
        rows = [
            (
                WRITES_IDX_MAP.get(channel, idx),
                _name("channel", channel),
                self.serde.dumps_typed(value),
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        self.chains.put_writes(
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            _name("task id", str(task_id)),
            check_text("task_path", task_path, CHECKPOINT_NS_MAX),
            rows,
        )

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        if strategy not in STRATEGIES:
            raise InvalidMemory(
                "strategy", f"must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}"
            )
        ids = [_thread_id(thread_id) for thread_id in check_sequence("thread_ids", thread_ids)]
        self.chains.prune(ids, keep_latest=strategy == "keep_latest", needs_history=self._delta)

    def _delta(self, metadata: tuple[str, bytes]) -> bool:
        """Whether a checkpoint of this metadata belongs to a thread with a ``DeltaChannel``:
        LangGraph records its counters there (LangGraph.js marks such threads
        ``delta_writes_versioned``), as ``PostgresSaver``'s prune checks."""
        found = self.serde.loads_typed(metadata)
        return isinstance(found, dict) and any(
            key in found for key in ("counters_since_delta_snapshot", "delta_writes_versioned")
        )

    def _tuple(self, stored: StoredCheckpoint, *, expect: str | None) -> CheckpointTuple:
        loads = self.serde.loads_typed
        checkpoint = loads(stored.checkpoint)
        checkpoint["channel_values"] = {
            channel: loads(value) for channel, value in stored.blobs.items()
        }
        configurable: dict[str, Any] = {
            "thread_id": stored.thread_id,
            "checkpoint_ns": stored.checkpoint_ns,
            "checkpoint_id": stored.checkpoint_id,
        }
        if expect is not None:
            configurable[EXPECT] = expect
        parent = stored.parent_checkpoint_id
        return CheckpointTuple(
            config={"configurable": configurable},
            checkpoint=checkpoint,
            metadata=loads(stored.metadata),
            parent_config=None
            if parent is None
            else {
                "configurable": {
                    "thread_id": stored.thread_id,
                    "checkpoint_ns": stored.checkpoint_ns,
                    "checkpoint_id": parent,
                }
            },
            pending_writes=[
                (write.task_id, write.channel, loads(write.value)) for write in stored.writes
            ],
        )


class _Listing:
    """One ``list``: its filters, and where its next page starts."""

    def __init__(
        self,
        saver: AgentMemorySaver,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> None:
        configurable = (config or {}).get("configurable", {})
        self.saver = saver
        self.thread_id = None if config is None else _chain(config)[0]
        ns = configurable.get("checkpoint_ns")
        self.checkpoint_ns = None if ns is None else _name("checkpoint_ns", ns, CHECKPOINT_NS_MAX)
        self.checkpoint_id = _checkpoint_id(config)
        self.before = _checkpoint_id(before, "before")
        self.filter = dict(filter or {})
        self.left = _limit(limit)
        self.after: tuple[str, int] | None = None
        self.done = False

    def next_page(self) -> list[CheckpointTuple] | None:
        """The next checkpoints that match (an empty page when a whole page of the database's
        matched none), or None at the end."""
        if self.done or (self.left is not None and self.left <= 0):
            return None
        # A page of what is left to return, when every checkpoint read is returned.
        size = (
            CHECKPOINT_PAGE if self.filter or self.left is None else min(CHECKPOINT_PAGE, self.left)
        )
        stored = self.saver.chains.page(
            self.thread_id, self.checkpoint_ns, self.checkpoint_id, self.before, self.after, size
        )
        if not stored:
            self.done = True
            return None
        # A page shorter than asked for is the last: no read of an empty one after it.
        self.done = len(stored) < size
        self.after = stored[-1].cursor
        page = []
        for found in stored:
            tuple_ = self.saver._tuple(found, expect=None)
            if any(tuple_.metadata.get(key) != value for key, value in self.filter.items()):
                continue
            page.append(tuple_)
            if self.left is not None:
                self.left -= 1
                if self.left <= 0:
                    break
        return page


def _chain(config: RunnableConfig) -> tuple[str, str]:
    """The ``(thread_id, checkpoint_ns)`` a config names, checked."""
    configurable = config.get("configurable") or {}
    if configurable.get("thread_id") is None:
        raise InvalidMemory(
            "config",
            "a checkpointer needs a thread_id: pass config={'configurable': {'thread_id': ...}}",
        )
    thread_id = _thread_id(configurable["thread_id"])
    return thread_id, _name(
        "checkpoint_ns", configurable.get("checkpoint_ns") or "", CHECKPOINT_NS_MAX
    )


def _run_ids(run_ids: Any) -> list[str]:
    """Run ids as LangGraph's savers take them: a list of ids (a UUID is its string), never a
    single str."""
    return [
        _name("run_ids", str(run_id), minimum=1)
        for run_id in check_sequence("run_ids", run_ids, "run ids")
    ]


def _thread_id(thread_id: Any) -> str:
    return _name("thread_id", str(thread_id), THREAD_ID_MAX, minimum=1)


def _name(field: str, text: Any, limit: int = CHECKPOINT_NAME_MAX, *, minimum: int = 0) -> str:
    """An id of a chain, with the store's own rules (:func:`~agentmemory.validation.check_name`):
    no NUL for PostgreSQL, no lone surrogate for any driver, nothing that displays as another."""
    return check_name(field, text, limit, minimum=minimum)


def _checkpoint_id(config: RunnableConfig | None, field: str = "checkpoint_id") -> str | None:
    """The ``checkpoint_id`` a config names, if any: a str (an int would reach the driver)."""
    found = get_checkpoint_id(config) if config else None
    # "" names no checkpoint (the latest), as LangGraph's own savers read it.
    return None if found is None or found == "" else _name(field, found, minimum=1)


def _limit(limit: Any) -> int | None:
    if limit is None:
        return None
    return check_version("limit", limit, minimum=0)
