"""``memcheck --via mcp``: the workload's calls made through the MCP server
(:mod:`agentmemory.integrations.mcp`) instead of the store, so that the anomaly checks judge that
path too -- its argument and result translation, its principals' session mapping.

Each client thread holds its own MCP client session, as one of two principals (:data:`PRINCIPALS`,
alternating by client): the SDK's ``Client`` connected to the server in-process, in the
``initialize`` handshake's mode -- every call a JSON-RPC request through the server's session
loop, as a stdio client's are, without a process per client. The run's sessions are the
principals' stored ones (``mcp:<principal>:memcheck-<run>-a``): the final reads, the state the
checker compares with and the clean-up see what the server stored, where it stored it.

The tools cover the register workloads (recall, remember, compare-and-set, forget, history
pages, retried writes): :data:`WORKLOADS`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import IdempotencyKeyReused, InvalidMemory, MemoryUnavailable, VersionConflict

if TYPE_CHECKING:
    from ..store import MemoryStore

#: The workloads whose calls the MCP tools cover (without ``--workloads``, ``--via mcp`` runs
#: these).
WORKLOADS = ("register", "isolation", "idempotent")
#: Two principals: their sessions share names (``memcheck-<run>-a``) and must never meet.
PRINCIPALS = ("memcheck-p", "memcheck-q")
#: What ``last_read_source`` says of a read made through the server.
SOURCE = "mcp"

_CONFLICT = re.compile(r"is at version (\d+), not (\d+)")
_ERROR = re.compile(r"^(\w+): (?:(\w+(?:\[\d+\])?): )?(.*)$", re.S)


def stored_sessions(base: list[str]) -> list[str]:
    """The run's sessions as the server stores them: each principal's copy of each."""
    from ..integrations.mcp import principal_prefix

    return [f"{principal_prefix(p)}{session}" for p in PRINCIPALS for session in base]


def principal_of_client(client: str) -> str:
    """The principal a client thread acts as: by the number in its name, alternating."""
    digits = "".join(ch for ch in client if ch.isdigit()) or "0"
    return PRINCIPALS[int(digits) % len(PRINCIPALS)]


@dataclass(frozen=True)
class Recalled:
    """What a tool returned for one key, in the fields the workload records."""

    key: str
    version: int
    value: Any
    expires_at: datetime | None = None


@dataclass(frozen=True)
class Version:
    version: int
    op: str
    value: Any
    created_at: datetime


class ViaMcp:
    """The store calls of the register workloads, made as MCP tool calls of ``principal`` on a
    server over ``store``. Session ids are the stored ones (``mcp:<principal>:...``); each call
    names the server's (the prefix removed). The tools' errors come back as the store's
    exceptions, so the workload records them as it records the store's."""

    def __init__(self, store: MemoryStore, principal: str) -> None:
        from anyio.from_thread import start_blocking_portal
        from mcp import Client

        from ..integrations.mcp import build_server, principal_prefix

        self.store = store
        self.using = store.using
        self.cache = store.cache
        self.defects = store.defects
        self.principal = principal
        self.prefix = principal_prefix(principal)
        self.last_read_source: str | None = None
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._client_cm = self._portal.wrap_async_context_manager(
            Client(build_server(store, principal=principal), mode="legacy")
        )
        self._client = self._client_cm.__enter__()

    def close(self) -> None:
        try:
            self._client_cm.__exit__(None, None, None)
        finally:
            self._portal_cm.__exit__(None, None, None)

    # ------------------------------------------------------------------ the calls

    def _session(self, session_id: str) -> str:
        if not session_id.startswith(self.prefix):
            raise ValueError(f"{session_id!r} is not a session of principal {self.principal!r}")
        return session_id.removeprefix(self.prefix)

    def _call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self._portal.call(self._client.call_tool, tool, arguments)
        if result.is_error:
            raise _error(result.content[0].text, arguments)
        return result.structured_content

    def recall(self, session_id: str, key: str, *, version: int | None = None) -> Recalled | None:
        if version is not None:
            raise ValueError("recall(version=) has no MCP tool")
        self.last_read_source = SOURCE
        try:
            found = self._call("recall", {"session_id": self._session(session_id), "key": key})
        except _NotFound:
            return None
        return Recalled(key, found["version"], found["value"], _moment(found["expires_at"]))

    def remember(
        self,
        session_id: str,
        key: str,
        value: Any,
        *,
        ttl: Any = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Recalled:
        if ttl is not None:
            raise ValueError("remember(ttl=) has no MCP parameter")
        arguments: dict[str, Any] = {"session_id": self._session(session_id), "key": key}
        arguments["value"] = value
        if expected_version is not None:
            arguments["expected_version"] = expected_version
        if idempotency_key is not None:
            arguments["idempotency_key"] = idempotency_key
        written = self._call("remember", arguments)
        return Recalled(key, written["version"], value, _moment(written["expires_at"]))

    def forget(self, session_id: str, key: str, *, expected_version: int | None = None) -> bool:
        arguments: dict[str, Any] = {"session_id": self._session(session_id), "key": key}
        if expected_version is not None:
            arguments["expected_version"] = expected_version
        return bool(self._call("forget", arguments)["forgotten"])

    def history(
        self,
        session_id: str,
        key: str,
        *,
        limit: int | None = None,
        before_version: int | None = None,
    ) -> list[Version]:
        """As :meth:`MemoryStore.history`: every version oldest first, or a page newest first
        before ``before_version`` -- from the tool's whole history (it has no keyset pages)."""
        found = self._call("history", {"session_id": self._session(session_id), "key": key})
        versions = [
            Version(v["version"], v["op"], v["value"], _moment(v["created_at"]) or datetime.min)
            for v in found["versions"]
        ]
        if limit is None and before_version is None:
            return versions
        newest_first = [
            v for v in reversed(versions) if before_version is None or v.version < before_version
        ]
        return newest_first[: limit or 100]


class _NotFound(Exception):
    pass


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _error(text: str, arguments: dict[str, Any]) -> Exception:
    """The store's exception for a tool's error text (``Class: field: message``)."""
    match = _ERROR.match(text)
    name, field, message = match.groups() if match else ("", None, text)
    if name == "MemoryNotFound":
        return _NotFound(text)
    if name == "VersionConflict":
        conflict = _CONFLICT.search(text)
        actual, expected = (int(conflict[1]), int(conflict[2])) if conflict else (-1, -1)
        return VersionConflict(
            arguments.get("session_id", ""),
            arguments.get("key", ""),
            expected=expected,
            actual=actual,
        )
    if name == "IdempotencyKeyReused":
        return IdempotencyKeyReused(
            str(arguments.get("idempotency_key")), message, "another request"
        )
    if name == "InvalidMemory":
        return InvalidMemory(field or "arguments", message)
    if name == "MemoryUnavailable":
        return MemoryUnavailable(text)
    return RuntimeError(text)  # indeterminate: the workload records it as such
