"""agentmemory for Microsoft Agent Framework (``pip install ".[agent-framework]"``)::

    from agent_framework import Agent
    from agentmemory.integrations.agent_framework import (
        AgentMemoryContextProvider,
        AgentMemoryHistoryProvider,
    )

    agent = Agent(
        client=...,
        context_providers=[AgentMemoryHistoryProvider(), AgentMemoryContextProvider()],
    )
    session = agent.create_session(session_id="user-42")
    await agent.run("Hello", session=session)

:class:`AgentMemoryHistoryProvider` keeps the conversation -- the framework's ``HistoryProvider``
-- on a log of the store: one log per session, its messages the items in order. A save lands
exactly once, however the framework resends it: what the log already holds is left out under the
log's lock (the framework's own ``filter_new_messages``, as its ``InMemoryHistoryProvider`` does
with the session state; and a message with an id is never stored twice) -- so two processes
saving one session at once can neither both append the same messages nor lose one another's.

:class:`AgentMemoryContextProvider` brings long-term memories into each run: the memories of
chosen keys, and those that match the user's message by meaning (with a semantic index), as
instructions the model reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from agent_framework import ContextProvider, HistoryProvider, Message

# The framework's own replay filter and message identity (InMemoryHistoryProvider's).
from agent_framework._sessions import filter_new_messages, get_message_identity

from .. import validation
from ..errors import InvalidMemory

#: The log of each session that holds its messages.
STREAM = "agent-framework"


class AgentMemoryHistoryProvider(HistoryProvider):
    """The framework's ``HistoryProvider`` on an agentmemory log: the messages of session
    ``session_id`` are the items of the log ``(session_id, stream)``, stored as
    ``Message.to_dict()``.

    ``db_url``: a database URL to keep them in, without a Django project
    (:func:`agentmemory.setup`); or ``store``: the :class:`~agentmemory.MemoryStore` to keep them
    in (default: one on the settings' database). The other arguments are the framework's
    (``load_messages``, ``store_inputs``, ...)."""

    DEFAULT_SOURCE_ID: ClassVar[str] = "agentmemory"

    def __init__(
        self,
        db_url: str | None = None,
        *,
        store: Any = None,
        stream: str = STREAM,
        source_id: str | None = None,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_context_messages: bool = False,
        store_context_from: set[str] | None = None,
        store_outputs: bool = True,
    ) -> None:
        super().__init__(
            source_id=source_id or self.DEFAULT_SOURCE_ID,
            load_messages=load_messages,
            store_inputs=store_inputs,
            store_context_messages=store_context_messages,
            store_context_from=store_context_from,
            store_outputs=store_outputs,
        )
        from ..standalone import store_for

        self.stream = validation.check_stream(stream)
        self.store = store_for(db_url, store, cache=None)

    async def get_messages(
        self, session_id: str | None, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        """The session's messages, oldest first."""
        items = await self.store.aread_log(_session(session_id), self.stream)
        return [Message.from_dict(item.value) for item in items]

    async def save_messages(
        self,
        session_id: str | None,
        messages: Sequence[Message],
        *,
        state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append the messages the log does not hold yet (a resent transcript, a retried save:
        what overlaps the stored history is left out), all or nothing."""
        session = _session(session_id)
        incoming = validation.check_sequence("messages", messages, "Message")
        for at, message in enumerate(incoming):
            if not isinstance(message, Message):
                raise InvalidMemory(
                    f"messages[{at}]", f"must be a Message, got {type(message).__name__}"
                )
        if not incoming:
            return

        def new_ones(stored: list[Any]) -> list[dict[str, Any]]:
            # The framework's filter looks at the whole history only for a transcript at least
            # as long (a replay); otherwise at its last len(incoming) messages: only those are
            # decoded (a turn's save costs the same at any length, but for the read).
            tail = stored if len(incoming) >= len(stored) else stored[-len(incoming) :]
            existing = [Message.from_dict(value) for value in tail]
            # A message with an id is stored once, whatever order savers race in (the
            # framework's filter assumes one saver: an older transcript saved after a newer
            # one would be appended again); one without an id, by the framework's rule.
            ids = {("id", value["message_id"]) for value in stored if value.get("message_id")}
            return [
                message.to_dict()
                for message in filter_new_messages(existing, incoming)
                if message.message_id is None or get_message_identity(message) not in ids
            ]

        await self.store.aappend_with(session, self.stream, new_ones)


class AgentMemoryContextProvider(ContextProvider):
    """Long-term memories in each run, as instructions: the live memories of ``keys``, and --
    when the store has a semantic index -- the ``limit`` memories that best match the user's
    last message. They are read from ``session_id`` (default: the run's session id), or, with
    ``session_prefix``, searched across every session that starts with it (a user's sessions).

    Nothing is written: memories are what the application (or a tool) remembers with the store.
    A run without a session id and without ``session_id`` reads nothing."""

    DEFAULT_SOURCE_ID: ClassVar[str] = "agentmemory-memories"

    def __init__(
        self,
        db_url: str | None = None,
        *,
        store: Any = None,
        session_id: str | None = None,
        session_prefix: str | None = None,
        keys: Sequence[str] = (),
        limit: int = 5,
        source_id: str | None = None,
        title: str = "What you remember about this user (from earlier conversations):",
    ) -> None:
        super().__init__(source_id or self.DEFAULT_SOURCE_ID)
        from ..standalone import store_for

        self.store = store_for(db_url, store, cache=None)
        self.session_id = None if session_id is None else validation.check_session_id(session_id)
        self.session_prefix = (
            None if session_prefix is None else validation.check_prefix(session_prefix)
        )
        self.keys = [
            validation.check_key(key) for key in validation.check_sequence("keys", keys, "keys")
        ]
        self.limit = validation.check_version(
            "limit", limit, minimum=0, maximum=validation.SEARCH_LIMIT_MAX
        )
        if not isinstance(title, str):
            raise InvalidMemory("title", f"must be a str, got {type(title).__name__}")
        self.title = title

    async def before_run(
        self, *, agent: Any, session: Any, context: Any, state: dict[str, Any]
    ) -> None:
        found = await self.memories(context.session_id, _last_user_text(context.input_messages))
        if found:
            lines = "\n".join(f"- {key}: {_shown(value)}" for key, value in found)
            context.extend_instructions(self.source_id, f"{self.title}\n{lines}")

    async def memories(self, run_session_id: str | None, query: str) -> list[tuple[str, Any]]:
        """The ``(key, value)`` pairs a run with this session id and last user message gets:
        the chosen keys first, then the search's matches (each key once)."""
        session_id = self.session_id or run_session_id
        found: dict[str, Any] = {}
        if self.keys and session_id is not None:
            recalled = await self.store.arecall_many(session_id, self.keys)
            found.update((key, recalled[key].value) for key in self.keys if key in recalled)
        if self.limit and query.strip() and self.store.index is not None:
            if self.session_prefix is not None:
                hits = await self.store.asearch_sessions(
                    self.session_prefix, query, limit=self.limit
                )
            elif session_id is not None:
                hits = await self.store.asearch(session_id, query, limit=self.limit)
            else:
                hits = []
            for hit in hits:
                found.setdefault(hit.key, hit.value)
        return list(found.items())


def _session(session_id: Any) -> str:
    if session_id is None:
        raise InvalidMemory(
            "session_id",
            "the run has no session id: run the agent with a session "
            "(agent.create_session(session_id=...)) to keep its history",
        )
    return validation.check_session_id(session_id)


def _last_user_text(messages: Sequence[Message]) -> str:
    for message in reversed(list(messages)):
        if message.role == "user" and message.text:
            return message.text
    return ""


def _shown(value: Any) -> str:
    import json

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 500 else text[:497] + "..."
