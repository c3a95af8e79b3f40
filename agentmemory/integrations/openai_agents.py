"""agentmemory as the OpenAI Agents SDK's ``Session`` (``pip install
"django-agentmemory[openai-agents]"``)::

    from agents import Agent, Runner
    from agentmemory.integrations.openai_agents import AgentMemorySession

    session = AgentMemorySession("user-42")
    result = await Runner.run(agent, "Hello", session=session)

A session is a log of the store (:meth:`MemoryStore.append <agentmemory.MemoryStore.append>`):
the conversation's items numbered 1, 2, 3, ... in the order they were added. What the store
guarantees, the session does, on every database it runs on: an ``add_items`` is all or nothing
and lands exactly once (a retry after a lost acknowledgement adds nothing more); two concurrent
``pop_item`` calls never return the same item (openai-agents-python #4988); items added in one
millisecond keep their order (#1900: the order is the sequence number's, never a timestamp's);
and a cancelled call is finished -- or never started -- by the time the cancellation reaches the
caller (#1658): no item lands after the caller saw its ``add_items`` cancelled.

The adapter is thin: it translates the SDK's calls to the store's and back; every guarantee lives
in the store and is tested there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agents.memory.session import SessionABC, _CompactionSnapshot
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from .. import validation
from ..defects import Defect
from ..errors import InvalidMemory

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from ..store import MemoryStore

#: The log of the session's ``session_id`` that holds its items.
STREAM = "openai-agents"


class AgentMemorySession(SessionABC):
    """The SDK's ``Session`` protocol on an agentmemory log: ``get_items(limit)`` (the latest
    ``limit`` items, oldest first; None: ``session_settings.limit``, then every item),
    ``add_items``, ``pop_item``, ``clear_session``.

    ``db_url``: a database URL to keep it in, without a Django project, as the SDK's
    ``SQLiteSession("id", "conversations.db")`` (``AgentMemorySession("id",
    "sqlite:///conversations.db")``: :func:`agentmemory.setup`); or ``store``: the
    :class:`~agentmemory.MemoryStore` to keep it in (default: one on the settings' database,
    without the Redis tier -- logs are read from the database);
    ``stream``: the log's name within ``session_id`` (several agents may keep their own
    conversations in one session)."""

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        db_url: str | None = None,
        *,
        store: MemoryStore | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        stream: str = STREAM,
    ) -> None:
        self.session_id = validation.check_session_id(session_id)
        self.stream = validation.check_stream(stream)
        from ..standalone import store_for

        self.store = store_for(db_url, store, cache=None)
        self.session_settings = (
            SessionSettings() if session_settings is None else _settings(session_settings)
        )

    def __repr__(self) -> str:
        return f"<AgentMemorySession {self.session_id!r} stream={self.stream!r} {self.store!r}>"

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation, oldest first: the latest ``limit`` items (0: none; negative or
        None without a settings limit: all)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidMemory("limit", f"must be an int or None, got {type(limit).__name__}")
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and limit < 0:
            limit = None  # SQLiteSession's (SQLite's) meaning of a negative LIMIT
        items = await self.store.aread_log(self.session_id, self.stream, limit=limit)
        return [item.value for item in items]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in their order, all or nothing."""
        items = validation.check_sequence("items", items, "items")  # a dict's keys are not items
        if items:
            await self.store.aappend(self.session_id, self.stream, items)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the most recent item (None: the session is empty)."""
        if Defect.SDK_POP_KEEPS_ITEM in self.store.defects:  # memcheck's self-test only
            latest = await self.store.aread_log(self.session_id, self.stream, limit=1)
            return latest[-1].value if latest else None
        popped = await self.store.apop(self.session_id, self.stream)
        return None if popped is None else popped.value

    async def clear_session(self) -> None:
        """Remove every item (the log's numbering goes on: nothing is renumbered)."""
        await self.store.aclear_log(self.session_id, self.stream)

    # ------------------------------------------------------------------ compaction's hooks

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The SDK's ``OpenAIResponsesCompactionSession`` replaces the history in one step
        through this hook (instead of a clear, then an add): a reader sees the old items or the
        compacted ones, never an empty session between them."""
        values = validation.check_sequence("items", items, "items")
        await self.store.arewrite_log(self.session_id, self.stream, lambda _current: values)
        return True

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Any = None
    ) -> _CompactionSnapshot | None:
        """The latest ``limit`` items, and a ``replace_suffix(start, output)`` that replaces
        the snapshot's items from ``start`` on by ``output`` -- only if they are still the
        log's last items, under the log's lock (False, nothing changed, when an ``add_items``
        or a ``pop_item`` came between: the compaction is skipped, the new item kept).
        ``prune_prefix``: older items it approves are dropped from the front too."""
        limit = validation.check_version("limit", limit, minimum=1)
        rows = await self.store.aread_log(self.session_id, self.stream, limit=limit)
        complete = len(rows) < limit or not (
            await self.store.aread_log(self.session_id, self.stream, limit=1, before=rows[0].seq)
        )

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            expected = [row.value for row in rows[start:]]
            if not expected:
                return False
            new_items = validation.check_sequence("output", output, "items")

            def replaced(current: list[Any]) -> list[Any]:
                if current[-len(expected) :] != expected:
                    raise _SuffixChanged
                kept = current[: -len(expected)]
                if prune_prefix is not None:
                    while kept and prune_prefix(kept[0]):
                        kept.pop(0)
                return [*kept, *new_items]

            try:
                await self.store.arewrite_log(self.session_id, self.stream, replaced)
            except _SuffixChanged:
                return False
            return True

        return _CompactionSnapshot(
            items=[row.value for row in rows], complete=complete, replace_suffix=replace_suffix
        )


class _SuffixChanged(Exception):
    """A compaction's snapshot is no longer the end of the log: nothing is replaced."""


def _settings(given: SessionSettings | dict[str, Any]) -> SessionSettings:
    return given if isinstance(given, SessionSettings) else SessionSettings(**given)
