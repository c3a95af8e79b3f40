"""agentmemory as LlamaIndex's chat store (``pip install ".[llamaindex]"``)::

    from llama_index.core.memory import ChatMemoryBuffer
    from agentmemory.integrations.llamaindex import AgentMemoryChatStore

    chat_store = AgentMemoryChatStore()          # or AgentMemoryChatStore("sqlite:///chats.db")
    memory = ChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="user-42")

A ``BaseChatStore`` on the store's logs: each chat key is a log of one session (``session_id``,
default ``"llama-index"``), its messages the log's items in order. What the store guarantees, the
chat store does, on every database: an ``add_message`` lands once, in order, never overwriting a
concurrent one (LlamaIndex's ``SimpleChatStore`` and the key-value chat stores rewrite the whole
list: two concurrent adds keep one); ``delete_last_message`` from two callers never returns the
same message; an insert at a position, a removal by position and ``set_messages`` replace the
messages at once under the log's lock (:meth:`~agentmemory.MemoryStore.rewrite_log`), so a
reader sees them before or after, and an ``add_message`` racing with them is neither lost nor
repeated. The async methods run on the store's thread pool.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms import ChatMessage
from llama_index.core.storage.chat_store.base import BaseChatStore
from llama_index.core.storage.chat_store.base_db import AsyncDBChatStore, MessageStatus

from .. import validation
from ..errors import InvalidMemory

#: The session whose logs hold the chats, by default.
SESSION = "llama-index"
#: What the session of a ``Memory``'s archived messages adds to the chats' session.
ARCHIVED = ":archived"


class AgentMemoryChatStore(BaseChatStore):
    """LlamaIndex's ``BaseChatStore`` on agentmemory logs: chat ``key`` is the log ``key`` of
    the session ``session_id``.

    ``db_url``: a database URL to keep the chats in, without a Django project
    (:func:`agentmemory.setup`); or ``store``: the :class:`~agentmemory.MemoryStore` to keep them
    in (default: one on the settings' database; logs are read from the database).

    Bad input -- a key the store refuses, a message that is not a ``ChatMessage``, a ``str``
    where the list of messages belongs, a position that is not an int -- raises
    :class:`~agentmemory.InvalidMemory` naming it, and changes nothing."""

    session_id: str = Field(default=SESSION, description="the session whose logs are the chats")
    _store: Any = PrivateAttr()

    def __init__(
        self,
        db_url: str | None = None,
        *,
        session_id: str = SESSION,
        store: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(session_id=validation.check_session_id(session_id), **kwargs)
        from ..standalone import store_for

        self._store = store_for(db_url, store, cache=None)

    @classmethod
    def class_name(cls) -> str:
        return "AgentMemoryChatStore"

    @property
    def store(self) -> Any:
        return self._store

    # ------------------------------------------------------------------ sync

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Replace the chat's messages by ``messages``, at once."""
        values = _dump_all(messages)
        self._store.rewrite_log(self.session_id, key, lambda _current: values)

    def get_messages(self, key: str) -> list[ChatMessage]:
        """The chat's messages, oldest first ([] for a chat that does not exist)."""
        return [_load(item.value) for item in self._store.read_log(self.session_id, key)]

    def add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        """Append ``message`` (``idx``: insert it at that position, as ``list.insert``)."""
        value = _dump(message, "message")
        if idx is None:
            self._store.append(self.session_id, key, [value])
            return
        at = _position(idx)
        self._store.rewrite_log(self.session_id, key, lambda current: _inserted(current, at, value))

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        """Remove every message of the chat and return them (None: it had none)."""
        removed: list[Any] = []

        def remove_all(current: list[Any]) -> list[Any]:
            removed[:] = current  # the attempt that commits sets it last
            return []

        self._store.rewrite_log(self.session_id, key, remove_all)
        return [_load(value) for value in removed] or None

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove the message at position ``idx`` (negative: from the end) and return it; None,
        and nothing changed, when there is no such position."""
        at = _position(idx)
        removed: list[Any] = []

        def remove_one(current: list[Any]) -> list[Any]:
            removed.clear()
            if not -len(current) <= at < len(current):
                return current
            kept = list(current)
            removed.append(kept.pop(at))
            return kept

        if not self._store.log_length(self.session_id, key):
            return None
        self._store.rewrite_log(self.session_id, key, remove_one)
        return _load(removed[0]) if removed else None

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Remove the chat's last message and return it (None: it has none). Two callers never
        get the same message."""
        popped = self._store.pop(self.session_id, key)
        return None if popped is None else _load(popped.value)

    def get_keys(self) -> list[str]:
        """The chats that hold messages, in the order they were started."""
        return self._store.log_streams(self.session_id)

    # ------------------------------------------------------------------ async: the store's pool

    async def aset_messages(self, key: str, messages: list[ChatMessage]) -> None:
        from .. import aio

        await aio.run(self.set_messages, key, messages)

    async def aget_messages(self, key: str) -> list[ChatMessage]:
        from .. import aio

        return await aio.run(self.get_messages, key)

    async def async_add_message(
        self, key: str, message: ChatMessage, idx: int | None = None
    ) -> None:
        from .. import aio

        await aio.run(self.add_message, key, message, idx)

    async def adelete_messages(self, key: str) -> list[ChatMessage] | None:
        from .. import aio

        return await aio.run(self.delete_messages, key)

    async def adelete_message(self, key: str, idx: int) -> ChatMessage | None:
        from .. import aio

        return await aio.run(self.delete_message, key, idx)

    async def adelete_last_message(self, key: str) -> ChatMessage | None:
        from .. import aio

        return await aio.run(self.delete_last_message, key)

    async def aget_keys(self) -> list[str]:
        from .. import aio

        return await aio.run(self.get_keys)


class AgentMemoryDBChatStore(AsyncDBChatStore):
    """LlamaIndex's ``AsyncDBChatStore`` -- the store of its ``Memory`` class -- on agentmemory
    logs: a chat ``key``'s active messages are the log ``key`` of the session ``session_id``,
    its archived ones (what ``Memory`` flushes out of its token budget) the log ``key`` of the
    session ``session_id + ":archived"``.

    Where LlamaIndex's ``SQLAlchemyChatStore`` orders messages by a nanosecond timestamp and
    replaces, archives and deletes in separate statements, here the order is the log's numbers,
    and ``set_messages``, ``archive_oldest_messages`` and ``delete_oldest_messages`` are one
    transaction under the logs' locks (the active log's first): a reader sees them before or
    after, and a message added meanwhile is neither lost nor repeated. ``delete_message(key,
    idx)`` removes the active message at position ``idx`` (the SQL store's ``idx`` is its row
    id, which a log has no use for)."""

    session_id: str = Field(default=SESSION, description="the session whose logs are the chats")
    _store: Any = PrivateAttr()

    def __init__(
        self,
        db_url: str | None = None,
        *,
        session_id: str = SESSION,
        store: Any = None,
        **kwargs: Any,
    ) -> None:
        session_id = validation.check_session_id(session_id)
        validation.check_session_id(session_id + ARCHIVED)  # its archive's session fits too
        super().__init__(session_id=session_id, **kwargs)
        from ..standalone import store_for

        self._store = store_for(db_url, store, cache=None)

    @classmethod
    def class_name(cls) -> str:
        return "AgentMemoryDBChatStore"

    @property
    def store(self) -> Any:
        return self._store

    def _sessions(self, status: MessageStatus | None) -> list[str]:
        """The sessions holding messages of ``status`` (None: both), oldest messages first."""
        archived = self.session_id + ARCHIVED
        if status is None:
            return [archived, self.session_id]
        status = _status(status)
        return [self.session_id if status is MessageStatus.ACTIVE else archived]

    async def _run(self, fn: Any, *args: Any) -> Any:
        from .. import aio

        return await aio.run(fn, *args)

    async def get_messages(
        self,
        key: str,
        status: MessageStatus | None = MessageStatus.ACTIVE,
        limit: int | None = None,
        offset: int | None = None,
    ) -> list[ChatMessage]:
        """The chat's messages of ``status`` (None: archived, then active), oldest first, from
        ``offset`` on, at most ``limit``."""
        sessions = self._sessions(status)
        start = 0 if offset is None else validation.check_version("offset", offset, minimum=0)
        if limit is not None:
            limit = validation.check_version("limit", limit, minimum=0)

        def read() -> list[Any]:
            return [i.value for s in sessions for i in self._store.read_log(s, key)]

        values = await self._run(read)
        chosen = values[start:] if limit is None else values[start : start + limit]
        return [_load(value) for value in chosen]

    async def count_messages(
        self, key: str, status: MessageStatus | None = MessageStatus.ACTIVE
    ) -> int:
        sessions = self._sessions(status)
        return sum([await self._store.alog_length(s, key) for s in sessions])

    async def add_message(
        self, key: str, message: ChatMessage, status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        (session,) = self._sessions(status)
        await self._store.aappend(session, key, [_dump(message, "message")])

    async def add_messages(
        self, key: str, messages: list[ChatMessage], status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        (session,) = self._sessions(status)
        values = _dump_all(messages)
        if values:
            await self._store.aappend(session, key, values)

    async def set_messages(
        self, key: str, messages: list[ChatMessage], status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        """Replace every message of the chat -- active and archived -- by ``messages`` with
        ``status``, in one transaction."""
        (chosen,) = self._sessions(status)
        values = _dump_all(messages)

        def replace() -> None:
            with transaction.atomic(using=self._store.using):
                for session in reversed(self._sessions(None)):  # the active log's lock first
                    new = values if session == chosen else []
                    self._store.rewrite_log(session, key, lambda _current, new=new: new)

        await self._run(replace)

    async def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove the active message at position ``idx`` and return it (None: no such one)."""
        at = _position(idx)
        removed: list[Any] = []

        def remove_one(current: list[Any]) -> list[Any]:
            removed.clear()
            if not -len(current) <= at < len(current):
                return current
            kept = list(current)
            removed.append(kept.pop(at))
            return kept

        def delete() -> None:
            if self._store.log_length(self.session_id, key):
                self._store.rewrite_log(self.session_id, key, remove_one)

        await self._run(delete)
        return _load(removed[0]) if removed else None

    async def delete_messages(self, key: str, status: MessageStatus | None = None) -> None:
        """Remove the chat's messages of ``status`` (None: every one), in one transaction."""
        sessions = self._sessions(status)

        def delete() -> None:
            with transaction.atomic(using=self._store.using):
                for session in reversed(sessions):
                    self._store.rewrite_log(session, key, lambda _current: [])

        await self._run(delete)

    async def delete_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        """Remove the ``n`` oldest active messages and return them."""
        return [_load(v) for v in await self._run(self._take_oldest, key, n, False)]

    async def archive_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        """Move the ``n`` oldest active messages to the archive (after what it holds), in one
        transaction, and return them."""
        return [_load(v) for v in await self._run(self._take_oldest, key, n, True)]

    def _take_oldest(self, key: str, n: Any, archive: bool) -> list[Any]:
        count = validation.check_version("n", n, minimum=0)
        taken: list[Any] = []

        def take(current: list[Any]) -> list[Any]:
            taken[:] = current[:count]
            return current[count:]

        with transaction.atomic(using=self._store.using):
            if count and self._store.log_length(self.session_id, key):
                self._store.rewrite_log(self.session_id, key, take)
            if archive and taken:
                self._store.append(self.session_id + ARCHIVED, key, list(taken))
        return taken

    async def get_keys(self) -> list[str]:
        """The chats that hold messages, active or archived."""

        def keys() -> list[str]:
            found = self._store.log_streams(self.session_id)
            found += self._store.log_streams(self.session_id + ARCHIVED)
            return list(dict.fromkeys(found))

        return await self._run(keys)


def _status(status: Any) -> MessageStatus:
    try:
        return MessageStatus(status)
    except ValueError:
        raise InvalidMemory(
            "status", f"must be a MessageStatus ({', '.join(m.value for m in MessageStatus)})"
        ) from None


def _inserted(current: list[Any], at: int, value: Any) -> list[Any]:
    kept = list(current)
    kept.insert(at, value)
    return kept


def _position(idx: Any) -> int:
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise InvalidMemory("idx", f"must be an int, got {type(idx).__name__}")
    return idx


def _dump(message: Any, field: str) -> dict[str, Any]:
    if not isinstance(message, ChatMessage):
        raise InvalidMemory(field, f"must be a ChatMessage, got {type(message).__name__}")
    return message.model_dump(mode="json")


def _dump_all(messages: Any) -> list[dict[str, Any]]:
    messages = validation.check_sequence("messages", messages, "ChatMessage")
    return [_dump(message, f"messages[{at}]") for at, message in enumerate(messages)]


def _load(value: Any) -> ChatMessage:
    return ChatMessage.model_validate(value)
