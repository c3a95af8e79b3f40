"""agentmemory as Google ADK's ``SessionService`` (``pip install "django-agentmemory[adk]"``)::

    from google.adk.runners import Runner
    from agentmemory.integrations.adk import AgentMemorySessionService

    runner = Runner(agent=agent, app_name="assistant", session_service=AgentMemorySessionService())

Where ADK's session lives in the store, all of it written in one transaction per call:

- the session's *head*: a memory of the app's listing session (``adk:<app>``), keyed by
  ``[user_id, session_id]``, holding its last update time; its version is the session's
  revision, which a :class:`~google.adk.sessions.Session` carries from ``get_session`` to
  ``append_event``;
- the session's events: a log of the store, in the order they were appended;
- its state: one memory per key -- session-scoped ones in the session's own store session, the
  ``app:`` and ``user:`` ones in the app's and the user's (``temp:`` ones are never stored).

So ``append_event`` is a compare-and-set of the head's version: a writer whose session object is
older than the stored session gets ADK's own ``StaleSessionError`` and nothing is written -- never
an append acknowledged onto a stale view, which is how a read-modify-write of session state is
lost (google/adk-python #4751). The same event appended again (a retry after a timeout) is stored
once: every write of the call carries the event's id as its idempotency key. Two
``create_session`` calls with one id make one session; the other gets ``AlreadyExistsError``
(#4954). ``list_sessions`` is ordered by last update, oldest first, then by id (#6272).

``AgentMemoryMemoryService`` is ADK's long-term memory (``BaseMemoryService``) on the store's
semantic index: each event with text is one memory of the user's memory session, keyed by the
event's id, found by ``search_memory`` by meaning.

The adapters are thin: they translate ADK's calls to the store's; every guarantee beneath them
lives in the store and is tested there.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.genai import types

from .. import aio
from ..defects import Defect
from ..errors import InvalidMemory, VersionConflict
from ..retries import Retrier
from ..validation import KEY_MAX, check_name, check_sequence, check_text, check_timestamp

#: The log of a session's events.
EVENTS = "adk-events"


class AgentMemorySessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on a :class:`~agentmemory.MemoryStore` (default: one on the
    settings' database and cache tier); or, without a Django project, on the database of
    ``db_url``, as ADK's ``DatabaseSessionService(db_url=...)``
    (``AgentMemorySessionService(db_url="sqlite:///sessions.db")``: :func:`agentmemory.setup`)."""

    def __init__(self, store: Any = None, *, db_url: str | None = None) -> None:
        from ..standalone import store_for

        self.store = store_for(db_url, store)
        if getattr(self.store, "shards", None):
            # A session's head (in the app's listing) and its state and events are written in
            # one transaction: one database.
            raise InvalidMemory(
                "store",
                "ADK's session service writes an app's listing and each session in one "
                "transaction, so on one database: give it one shard's store, e.g. "
                "store.shard(app_name) -- every session of that app on that shard",
            )
        self._retrier = Retrier(self.store.using)

    def __repr__(self) -> str:
        return f"<AgentMemorySessionService {self.store!r}>"

    # ------------------------------------------------------------------ the service

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        if session_id is not None and not isinstance(session_id, str):
            raise InvalidMemory("session_id", f"must be a str, got {type(session_id).__name__}")
        session_id = (session_id or "").strip() or str(uuid.uuid4())
        _check_ids(app_name, user_id, session_id)
        return await aio.run(self._create, app_name, user_id, session_id, dict(state or {}))

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        _check_ids(app_name, user_id, session_id)
        return await aio.run(self._get, app_name, user_id, session_id, config)

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        _check_ids(app_name, user_id)
        return await aio.run(self._list, app_name, user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        _check_ids(app_name, user_id, session_id)
        await aio.run(self._delete, app_name, user_id, session_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        _check_ids(app_name, user_id)
        return await aio.run(self._state, _user(app_name, user_id))

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        _check_ids(session.app_name, session.user_id, session.id)
        check_name("event.id", event.id, KEY_MAX)
        check_timestamp("event.timestamp", event.timestamp)
        # As ADK's own services: temp: state reaches the in-memory session only.
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        # Only an event stored before may be held by the session object already (a scan of its
        # events, which grow with the session: looked for only then). Stored before: its
        # idempotency key found the earlier write, or the object was loaded after it (the
        # object's update time is not before the event's).
        loaded_after = event.timestamp <= session.last_update_time
        revision, replayed = await aio.run(self._append, session, event)
        session._storage_update_marker = str(revision)
        session.last_update_time = event.timestamp
        if (replayed or loaded_after) and any(held.id == event.id for held in session.events):
            return event  # appended again after it was stored: stored (and held) once
        return self._commit_event_to_session(session, event)

    # ------------------------------------------------------------------ on the pool thread

    def _create(self, app_name: str, user_id: str, session_id: str, state: dict) -> Session:
        listing, key = _listing(app_name), _head_key(user_id, session_id)
        scoped = _split(state)
        now = time.time()
        request = "c:" + uuid.uuid4().hex  # one per call: a retry of this call finds its writes

        def attempt(_retry: bool) -> tuple[int, dict[str, Any] | None]:
            try:
                head = self.store.remember(
                    listing, key, {"update_time": now}, expected_version=0, idempotency_key=request
                )
            except VersionConflict:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
            if head.replayed:  # its state was committed with it: written once, read below
                return head.version, None
            return head.version, self._write_state(app_name, user_id, session_id, scoped)

        revision, own = self._retrier.atomic(attempt)
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=self._merged(app_name, user_id, session_id, own),
            last_update_time=now,
        )
        session._storage_update_marker = str(revision)
        return session

    def _get(
        self, app_name: str, user_id: str, session_id: str, config: GetSessionConfig | None
    ) -> Session | None:
        head = self.store.recall(_listing(app_name), _head_key(user_id, session_id))
        if head is None:
            return None
        # The head first: the state and events read after it are at least as new, so a stale
        # revision is the worst this object can carry -- and append_event refuses it.
        state = self._merged(app_name, user_id, session_id)
        events = self._events(app_name, user_id, session_id, config)
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=state,
            events=events,
            last_update_time=head.value["update_time"],
        )
        session._storage_update_marker = str(head.version)
        return session

    def _list(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        prefix = None if user_id is None else json.dumps([user_id], ensure_ascii=False)[:-1] + ", "
        heads = self.store.recall_many(_listing(app_name), prefix=prefix)
        sessions = []
        for key, head in heads.items():
            owner, session_id = json.loads(key)
            sessions.append(
                Session(
                    id=session_id,
                    app_name=app_name,
                    user_id=owner,
                    last_update_time=head.value["update_time"],
                )
            )
        sessions.sort(key=lambda s: (s.last_update_time, s.id))
        return ListSessionsResponse(sessions=sessions)

    def _delete(self, app_name: str, user_id: str, session_id: str) -> None:
        def attempt(_retry: bool) -> None:
            self.store.forget(_listing(app_name), _head_key(user_id, session_id))
            self.store.erase_session(_session(app_name, user_id, session_id))

        self._retrier.atomic(attempt)

    def _append(self, session: Session, event: Event) -> tuple[int, bool]:
        """Store ``event``: the session's new revision, and whether the event had been stored
        before (a replay: the store says its idempotency key found the earlier write --
        ``MemoryRecord.replayed`` -- whatever this session object's revision or timestamps)."""
        app_name, user_id, session_id = session.app_name, session.user_id, session.id
        listing, key = _listing(app_name), _head_key(user_id, session_id)
        # The event's id is scoped to its session: ADK's ids are the caller's, and the same id
        # in another session is another event (its app: and user: changes included).
        request = "e:" + _digest(app_name, user_id, session_id, event.id)
        scoped = _split(event.actions.state_delta if event.actions else {})
        document = event.model_dump(exclude_none=True, mode="json")
        marker = session._storage_update_marker

        def attempt(_retry: bool) -> tuple[int, bool]:
            if marker is None:  # a Session this service did not load: its update time
                head = self.store.recall(listing, key)
                if head is None:
                    raise SessionNotFoundError(f"Session {session_id} not found.")
                if head.value["update_time"] > session.last_update_time:
                    raise StaleSessionError(_STALE)
                expected = head.version
            else:
                expected = int(marker)
            if Defect.ADK_STALE_APPEND in self.store.defects:  # memcheck's self-test only
                expected = None
            try:
                head = self.store.remember(
                    listing,
                    key,
                    {"update_time": event.timestamp},
                    expected_version=expected,
                    idempotency_key=request,
                )
            except VersionConflict as conflict:
                if conflict.actual == 0:
                    raise SessionNotFoundError(f"Session {session_id} not found.") from None
                raise StaleSessionError(_STALE) from None
            if head.replayed:
                # Stored before, with its state delta and its event in the same transaction:
                # nothing more to write (and nothing to look up by idempotency key).
                return head.version, True
            if Defect.ADK_DROPS_STATE_DELTA not in self.store.defects:  # the self-test's seam
                self._write_state(app_name, user_id, session_id, scoped)
            self.store.append(_session(app_name, user_id, session_id), EVENTS, [document])
            return head.version, False

        return self._retrier.atomic(attempt)

    # ------------------------------------------------------------------ helpers

    def _write_state(
        self, app_name: str, user_id: str, session_id: str, scoped: dict[str, dict[str, Any]]
    ) -> dict[str, Any]:
        """Each key of each scope as a memory of its own (one version per change), a scope's
        keys in one call. Only inside the transaction that wrote the session's head under the
        call's idempotency key, and only when that write was not a replay: a retried call finds
        the head and writes none of them again, so these need no key of their own (and each is
        one statement where the database has the one-statement write). Returns the session's
        own keys as stored."""
        owners = {
            "app": _app(app_name),
            "user": _user(app_name, user_id),
            "session": _session(app_name, user_id, session_id),
        }
        own: dict[str, Any] = {}
        for scope, values in scoped.items():
            if values:
                records = self.store.remember_many(owners[scope], values)
                if scope == "session":
                    own = {name: record.value for name, record in records.items()}
        return own

    def _state(self, owner: str) -> dict[str, Any]:
        return {key: record.value for key, record in self.store.recall_many(owner).items()}

    def _merged(
        self, app_name: str, user_id: str, session_id: str, own: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The session's state as ADK shows it: its own keys, then ``app:`` and ``user:``.
        ``own``: the session's keys when the caller knows them (a session it just created:
        what it wrote is all there is)."""
        merged = self._state(_session(app_name, user_id, session_id)) if own is None else own
        for key, value in self._state(_app(app_name)).items():
            merged[State.APP_PREFIX + key] = value
        for key, value in self._state(_user(app_name, user_id)).items():
            merged[State.USER_PREFIX + key] = value
        return merged

    def _events(
        self, app_name: str, user_id: str, session_id: str, config: GetSessionConfig | None
    ) -> list[Event]:
        recent = None if config is None else config.num_recent_events
        after = None if config is None else config.after_timestamp
        if recent == 0:
            return []
        owner = _session(app_name, user_id, session_id)
        # Filtered by the database, the latest `recent` of those: a session of 50,000 events
        # was read whole and filtered here (2.5-3.3 s).
        since = None if after is None else ("timestamp", check_timestamp("after_timestamp", after))
        items = self.store.read_log(owner, EVENTS, limit=recent, since=since)
        return [Event.model_validate(item.value) for item in items]


_STALE = (
    "The session has been modified in storage since it was loaded: reload it with get_session "
    "and append again (agentmemory refused the append; nothing was written)."
)


def _digest(*parts: str) -> str:
    """A fixed-length name for ids of any length (store session ids are at most 128)."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()[:40]


def _listing(app_name: str) -> str:
    return "adk:" + _digest(app_name)


def _app(app_name: str) -> str:
    return "adk:app:" + _digest(app_name)


def _user(app_name: str, user_id: str) -> str:
    return "adk:user:" + _digest(app_name, user_id)


def _session(app_name: str, user_id: str, session_id: str) -> str:
    return "adk:session:" + _digest(app_name, user_id, session_id)


def _memories(app_name: str, user_id: str) -> str:
    return "adk:memory:" + _digest(app_name, user_id)


def _head_key(user_id: str, session_id: str) -> str:
    key = json.dumps([user_id, session_id], ensure_ascii=False)
    if len(key) > KEY_MAX:
        raise InvalidMemory(
            "session_id",
            f"user_id and session_id take {len(key)} characters as the session's key, over the "
            f"limit of {KEY_MAX}",
        )
    return key


def _check_ids(app_name: Any, user_id: Any, session_id: Any = None) -> None:
    """ADK's ids with the store's own rules (a str; no NUL, lone surrogate or other character an
    id may not hold), before anything reaches a driver. ``user_id`` or ``session_id`` None:
    not given (listings of every user, a memory without its session)."""
    check_name("app_name", app_name, KEY_MAX)
    if user_id is not None:
        check_name("user_id", user_id, KEY_MAX)
    if session_id is not None:
        check_name("session_id", session_id, KEY_MAX)


def _split(delta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A state delta by scope, prefixes removed; ``temp:`` keys dropped. Values that are not
    JSON become their string form, as ADK's own database services store them."""
    scoped: dict[str, dict[str, Any]] = {"app": {}, "user": {}, "session": {}}
    for key, value in delta.items():
        if key.startswith(State.TEMP_PREFIX):
            continue
        safe = json.loads(json.dumps(value, default=str))
        if key.startswith(State.APP_PREFIX):
            scoped["app"][key.removeprefix(State.APP_PREFIX)] = safe
        elif key.startswith(State.USER_PREFIX):
            scoped["user"][key.removeprefix(State.USER_PREFIX)] = safe
        else:
            scoped["session"][key] = safe
    return scoped


class AgentMemoryMemoryService(BaseMemoryService):
    """ADK's memory service on the store's semantic index (``AGENTMEMORY["SEARCH"]``, or the
    ``index`` of the store given): ``add_session_to_memory`` and ``add_events_to_memory`` keep
    each event with text as a memory of the user's memory session (keyed by the event's id, the
    text indexed; an event already kept is not written again, so adding a session again as it
    grows writes only its new events), ``search_memory`` returns the ``limit`` best by meaning,
    ``delete_memory`` forgets one (and adding its session again does not bring it back).
    Memories are per app and user, as ADK scopes them. Raises ``ImproperlyConfigured`` when the
    store has no semantic index."""

    def __init__(self, store: Any = None, *, limit: int = 10) -> None:
        from ..store import MemoryStore

        self.store = store if store is not None else MemoryStore()
        if self.store.index is None:
            raise ImproperlyConfigured(
                "AgentMemoryMemoryService searches by meaning: configure the semantic index "
                '(AGENTMEMORY["SEARCH"], docs/search.md) or pass a MemoryStore(index=...)'
            )
        self.limit = limit

    async def add_session_to_memory(self, session: Session) -> None:
        _check_ids(session.app_name, session.user_id, session.id)
        await aio.run(
            self._add, session.app_name, session.user_id, session.id, list(session.events)
        )

    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Any,
        session_id: str | None = None,
        custom_metadata: Any = None,
    ) -> None:
        _check_ids(app_name, user_id, session_id)
        events = check_sequence("events", events, "ADK Events")
        if not all(isinstance(event, Event) for event in events):
            raise InvalidMemory("events", "must be a list of ADK Events")
        await aio.run(self._add, app_name, user_id, session_id, events)

    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Any,
        custom_metadata: Any = None,
    ) -> None:
        """Keep explicit memories (ADK's ``MemoryEntry``), searchable as the events are: each under
        its ``id``, or, without one, under a digest of what it says (its content, author and
        timestamp) -- so a call retried, or an entry added twice, is kept once. Its
        ``custom_metadata`` comes back with it from ``search_memory``. An entry with no text
        cannot be found by meaning and is refused, with every other entry of the call: nothing
        is written."""
        _check_ids(app_name, user_id)
        entries = check_sequence("memories", memories, "ADK MemoryEntry objects")
        if not all(isinstance(entry, MemoryEntry) for entry in entries):
            raise InvalidMemory("memories", "must be a list of ADK MemoryEntry objects")
        kept = {}
        for number, entry in enumerate(entries):
            text = "\n".join(part.text for part in entry.content.parts or [] if part.text)
            if not text:
                raise InvalidMemory(
                    "memories", f"entry {number} has no text to find it by: nothing was written"
                )
            content = entry.content.model_dump(mode="json", exclude_none=True)
            said = json.dumps([content, entry.author, entry.timestamp], sort_keys=True)
            key = entry.id or "entry-" + hashlib.sha256(said.encode()).hexdigest()[:32]
            kept[key] = {
                "text": text,
                "author": entry.author,
                "timestamp": entry.timestamp,
                "session_id": None,
                "content": content,
                "custom_metadata": dict(entry.custom_metadata or {}),
            }
        await aio.run(self._keep, app_name, user_id, kept)

    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        _check_ids(app_name, user_id)
        check_text("query", query, 10_000)
        hits = await self.store.asearch(_memories(app_name, user_id), query, limit=self.limit)
        return SearchMemoryResponse(
            memories=[
                MemoryEntry(
                    id=hit.key,
                    content=types.Content.model_validate(hit.value["content"]),
                    author=hit.value.get("author"),
                    timestamp=hit.value.get("timestamp"),
                    custom_metadata={
                        **hit.value.get("custom_metadata", {}),
                        "session_id": hit.value.get("session_id"),
                        "score": hit.score,
                    },
                )
                for hit in hits
                if not hit.value.get("deleted")
            ]
        )

    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        _check_ids(app_name, user_id)
        if not memory_id:
            raise InvalidMemory("memory_id", "name the memory to delete (MemoryEntry.id)")
        # Kept as a marker that is never indexed: searches do not find it, and adding its
        # session again does not write the event back.
        await self.store.aremember(
            _memories(app_name, user_id), memory_id, {"deleted": True}, index=False
        )

    def _add(self, app_name: str, user_id: str, session_id: str | None, events: list) -> None:
        texts = {}
        for event in events:
            check_timestamp("event.timestamp", event.timestamp)
            parts = (event.content.parts or []) if event.content else []
            text = "\n".join(part.text for part in parts if part.text)
            if text and event.id:
                texts[event.id] = {
                    "text": text,
                    "author": event.author,
                    "timestamp": _iso(event.timestamp),
                    "session_id": session_id,
                    "content": event.content.model_dump(mode="json", exclude_none=True),
                }
        self._keep(app_name, user_id, texts)

    def _keep(self, app_name: str, user_id: str, texts: dict[str, dict[str, Any]]) -> None:
        """Write the memories the user's memory session does not hold yet (one kept before, or
        deleted since -- its marker -- is not written again), in one ``remember_many``."""
        if not texts:
            return
        memories = _memories(app_name, user_id)
        kept = self.store.recall_many(memories, list(texts))
        new = {key: value for key, value in texts.items() if key not in kept}
        if new:
            self.store.remember_many(memories, new, index=["text"])


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()
