"""agentmemory as a Model Context Protocol server (``pip install ".[mcp]"``): any agent that
speaks MCP -- Claude Desktop and Code, Cursor, VS Code, the OpenAI and Google SDKs' MCP clients --
reaches the store's versioned memories and logs through eight tools::

    python manage.py agentmemory_mcp --user alice                # stdio, as principal alice
    python manage.py agentmemory_mcp_token create alice          # a bearer token for alice
    python manage.py agentmemory_mcp --http --port 8765          # Streamable HTTP at /mcp

Built on the official SDK's low-level server (``mcp.server.lowlevel.Server``): the SDK speaks
the protocol -- the ``initialize`` handshake of the clients in use today and the 2026-07-28
single-exchange requests -- and this module defines the tools, their schemas and what each call
does. Over HTTP the server is stateless (each POST is its own exchange, JSON responses): any
number of clients, and a process restart loses nothing.

**Principals.** Every call acts as a principal: ``--user NAME`` on stdio, the owner of the
request's bearer token over HTTP (a request without a known token gets HTTP 401, before any tool
runs). A principal's session ids are its own: ``alice``'s session ``s1`` is stored as session
``mcp:alice:s1`` (:func:`stored_session_id`), so no tool call of ``bob`` can name it -- every
session id a call names, and every search, is confined to the caller's prefix. The mapping is
the prefix alone: it shows in the admin as is, and a Python caller reaches ``alice``'s memories
with ``MemoryStore().recall("mcp:alice:s1", key)``. There is no grant of one principal's
sessions to another: agents that share memories use one principal (a token each, revocable one
by one).

**Tokens** (:class:`~agentmemory.models.McpToken`): 256 random bits, shown once, stored as
their SHA-256 digest; ``agentmemory_mcp_token list`` names them by their first characters,
``revoke`` removes them (the next request with one is refused).

Every guarantee is the store's -- versions, compare-and-set, exactly-once writes under an
idempotency key, all-or-nothing appends; the tools translate arguments and results, and turn the
store's errors into tool results (``isError``) whose text names the error class and the field.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from .. import __version__, aio, validation
from ..defects import Defect
from ..errors import AgentMemoryError, InvalidMemory, VersionConflict

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server

    from ..store import MemoryStore

logger = logging.getLogger(__name__)

#: What a principal's session ids are stored under: ``mcp:<principal>:``.
SESSION_PREFIX = "mcp:"
#: The longest session id a tool call may name: what the stored id leaves for it after the
#: longest principal's prefix -- the same for every principal.
SESSION_ID_MAX = validation.SESSION_ID_MAX - len(SESSION_PREFIX) - validation.PRINCIPAL_MAX - 1
#: A new token's scheme prefix (tells an agentmemory token from others in a config file).
TOKEN_PREFIX = "amcp_"
SERVER_NAME = "agentmemory"

#: The principal of the HTTP request being served (set by :class:`BearerAuth`).
current_principal: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentmemory_mcp_principal", default=None
)


class MemoryNotFound(AgentMemoryError, LookupError):
    """A tool asked for a memory that does not exist, was forgotten or has expired."""

    def __init__(self, session_id: str, key: str) -> None:
        self.session_id, self.key = session_id, key
        super().__init__(
            f"key: no live memory {key!r} in session {session_id!r} (never written, forgotten "
            "or expired)"
        )


class SearchUnavailable(AgentMemoryError):
    """``search`` on a server whose store has no semantic index."""


# ---------------------------------------------------------------------- principals and tokens


def stored_session_id(principal: str, session_id: Any) -> str:
    """The store's session id of ``principal``'s ``session_id``: ``mcp:<principal>:<id>``.
    Raises :class:`InvalidMemory` (field ``session_id``) for an id the store would refuse, or
    one longer than :data:`SESSION_ID_MAX`."""
    session_id = validation.check_session_id(session_id)
    if len(session_id) > SESSION_ID_MAX:
        raise InvalidMemory(
            "session_id",
            f"must be at most {SESSION_ID_MAX} characters over MCP (the store keeps it under "
            f"the principal's prefix), got {len(session_id)}",
        )
    return f"{principal_prefix(principal)}{session_id}"


def principal_prefix(principal: str) -> str:
    return f"{SESSION_PREFIX}{principal}:"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(principal: str, *, label: str = "", using: str | None = None) -> str:
    """A new bearer token for ``principal`` (checked: :func:`~agentmemory.validation.check_principal`),
    stored as its digest; returns the token -- the only time it is seen."""
    from ..models import McpToken

    principal = validation.check_principal(principal)
    if not isinstance(label, str) or len(label) > 200:
        raise InvalidMemory("label", "must be a str of at most 200 characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    McpToken.objects.using(using).create(
        principal=principal, digest=digest(token), prefix=token[:12], label=label
    )
    return token


def principal_of(token: str, *, using: str | None = None) -> str | None:
    """The principal ``token`` acts as; None for a token that is not (or no longer) known."""
    from ..models import McpToken

    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    found = (
        McpToken.objects.using(using).filter(digest=digest(token)).values_list("principal").first()
    )
    return found[0] if found else None


# ---------------------------------------------------------------------- the tools

_SESSION = {
    "type": "string",
    "description": "Your session id: a conversation, a user, a project. Yours alone: another "
    f"principal's session of the same name is another session. At most {SESSION_ID_MAX} "
    "characters; case, accents and spaces count ('a' and 'A ' are two sessions).",
}
_KEY = {"type": "string", "description": "The memory's key within the session."}
_VERSION = {"type": "integer", "minimum": 1}
_IDEMPOTENCY = {
    "type": ["string", "null"],
    "default": None,
    "description": "A key of your own for this request (1-64 characters). Retrying the call "
    "with the same key (after a timeout, a lost connection) returns what the first call did "
    "and writes nothing more; the same key with another request is refused "
    "(IdempotencyKeyReused). Pass one whenever you may retry.",
}
_TIME = {"type": ["string", "null"], "description": "ISO 8601, UTC"}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input: dict[str, Any]
    output: dict[str, Any]
    read_only: bool


TOOLS = (
    ToolSpec(
        "remember",
        "Store a JSON value under a key of a session, as the memory's next version (the first "
        "write is version 1). Returns the new version. To change a value you read, pass the "
        "version you read as expected_version: the write happens only if the memory is still "
        "at that version (0: only if it does not exist yet); otherwise nothing is written and "
        "the call fails with VersionConflict naming the current version -- recall the key, "
        "recompute the value from what it holds now, and try again with that version. Without "
        "expected_version the write always happens (last writer wins).",
        _obj(
            {
                "session_id": _SESSION,
                "key": _KEY,
                "value": {
                    "description": "Any JSON value: object, array, string, number, boolean or null."
                },
                "expected_version": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "default": None,
                    "description": "Write only if the memory is at this version (0: absent).",
                },
                "idempotency_key": _IDEMPOTENCY,
            },
            ["session_id", "key", "value"],
        ),
        _obj(
            {
                "session_id": {"type": "string"},
                "key": {"type": "string"},
                "version": _VERSION,
                "replayed": {
                    "type": "boolean",
                    "description": "true: a retry; the first call's version, nothing written",
                },
                "expires_at": _TIME,
            },
            ["session_id", "key", "version", "replayed", "expires_at"],
        ),
        read_only=False,
    ),
    ToolSpec(
        "recall",
        "Read the current value and version of a memory. Fails with MemoryNotFound when the key "
        "was never written, was forgotten or has expired. Keep the version to update the "
        "memory safely: remember(..., expected_version=version).",
        _obj({"session_id": _SESSION, "key": _KEY}, ["session_id", "key"]),
        _obj(
            {
                "session_id": {"type": "string"},
                "key": {"type": "string"},
                "value": {"description": "the JSON value"},
                "version": _VERSION,
                "updated_at": _TIME,
                "expires_at": _TIME,
            },
            ["session_id", "key", "value", "version", "updated_at", "expires_at"],
        ),
        read_only=True,
    ),
    ToolSpec(
        "forget",
        "Forget a memory: recall stops finding it; its history keeps every version, the forget "
        "being the last (a later remember starts the next version). With expected_version, "
        "only if the memory is at that version (VersionConflict otherwise). Returns "
        "forgotten=false, and changes nothing, when there was no live memory to forget -- so a "
        "retried forget is harmless.",
        _obj(
            {
                "session_id": _SESSION,
                "key": _KEY,
                "expected_version": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "default": None,
                    "description": "Forget only if the memory is at this version.",
                },
            },
            ["session_id", "key"],
        ),
        _obj(
            {
                "session_id": {"type": "string"},
                "key": {"type": "string"},
                "forgotten": {"type": "boolean"},
            },
            ["session_id", "key", "forgotten"],
        ),
        read_only=False,
    ),
    ToolSpec(
        "history",
        "Every version of a memory, oldest first: writes (op 'write', with their value), "
        "forgets and expiries (op 'forget' / 'expire', value null). With limit, only the latest "
        "limit versions (still oldest first). An empty list when the key was never written.",
        _obj(
            {
                "session_id": _SESSION,
                "key": _KEY,
                "limit": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": validation.HISTORY_PAGE_MAX,
                    "default": None,
                    "description": "Only the latest versions (none: every version).",
                },
            },
            ["session_id", "key"],
        ),
        _obj(
            {
                "session_id": {"type": "string"},
                "key": {"type": "string"},
                "versions": {
                    "type": "array",
                    "items": _obj(
                        {
                            "version": _VERSION,
                            "op": {"type": "string"},
                            "value": {},
                            "created_at": {"type": "string"},
                            "expires_at": _TIME,
                        },
                        ["version", "op", "value", "created_at", "expires_at"],
                    ),
                },
            },
            ["session_id", "key", "versions"],
        ),
        read_only=True,
    ),
    ToolSpec(
        "search",
        "Find memories by meaning: the live memories whose values best match the query, best "
        "first, each with its session, key, value, version and score (cosine similarity). "
        "Searches one of your sessions, or all of them without session_id. Needs the server's "
        "semantic index (SearchUnavailable otherwise).",
        _obj(
            {
                "query": {"type": "string", "description": "What to look for, in words."},
                "session_id": {**_SESSION, "type": ["string", "null"], "default": None},
                "limit": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": validation.SEARCH_LIMIT_MAX,
                    "default": None,
                    "description": "How many results at most (default 10).",
                },
            },
            ["query"],
        ),
        _obj(
            {
                "results": {
                    "type": "array",
                    "items": _obj(
                        {
                            "session_id": {"type": "string"},
                            "key": {"type": "string"},
                            "value": {},
                            "version": _VERSION,
                            "score": {"type": "number"},
                        },
                        ["session_id", "key", "value", "version", "score"],
                    ),
                }
            },
            ["results"],
        ),
        read_only=True,
    ),
    ToolSpec(
        "list_keys",
        "The keys of a session's live memories, sorted; with prefix, only those that start "
        "with it (case counts).",
        _obj(
            {
                "session_id": _SESSION,
                "prefix": {"type": ["string", "null"], "default": None},
            },
            ["session_id"],
        ),
        _obj(
            {
                "session_id": {"type": "string"},
                "keys": {"type": "array", "items": {"type": "string"}},
            },
            ["session_id", "keys"],
        ),
        read_only=True,
    ),
    ToolSpec(
        "append_log",
        "Append items (a list of JSON values) to a log of the session -- a conversation, an "
        "event stream -- all or nothing, numbered after the log's last item (1, 2, 3, ...: no "
        "gap, never reused, so concurrent appends never overwrite each other). Returns the "
        "numbers given. Pass an idempotency_key if you may retry: a retry then appends nothing "
        "more.",
        _obj(
            {
                "session_id": _SESSION,
                "log": {"type": "string", "description": "The log's name within the session."},
                "items": {
                    "type": "array",
                    "items": {},
                    "description": "The values to append, in order (a list, even of one).",
                },
                "idempotency_key": _IDEMPOTENCY,
            },
            ["session_id", "log", "items"],
        ),
        _obj(
            {
                "session_id": {"type": "string"},
                "log": {"type": "string"},
                "numbers": {"type": "array", "items": _VERSION},
            },
            ["session_id", "log", "numbers"],
        ),
        read_only=False,
    ),
    ToolSpec(
        "read_log",
        "Read a log's items, oldest first, each with its number: every item; with after=N, the "
        "items after item N (to read on from where you stopped); with limit, at most limit "
        "items -- the first ones after N, or without after the latest ones.",
        _obj(
            {
                "session_id": _SESSION,
                "log": {"type": "string"},
                "after": {"type": ["integer", "null"], "minimum": 0, "default": None},
                "limit": {"type": ["integer", "null"], "minimum": 0, "default": None},
            },
            ["session_id", "log"],
        ),
        _obj(
            {
                "session_id": {"type": "string"},
                "log": {"type": "string"},
                "items": {
                    "type": "array",
                    "items": _obj(
                        {"number": _VERSION, "value": {}, "created_at": {"type": "string"}},
                        ["number", "value", "created_at"],
                    ),
                },
            },
            ["session_id", "log", "items"],
        ),
        read_only=True,
    ),
)
SPECS = {spec.name: spec for spec in TOOLS}


def _time(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


class Tools:
    """What each tool does, for one principal, on one store: plain synchronous calls (the
    server runs them on the store's thread pool). Each takes the tool's checked arguments."""

    def __init__(self, store: MemoryStore, principal: str) -> None:
        self.store = store
        self.principal = validation.check_principal(principal)

    def session(self, session_id: Any) -> str:
        if Defect.MCP_SHARED_SESSIONS in self.store.defects:
            return validation.check_session_id(session_id)  # the self-test's variant
        return stored_session_id(self.principal, session_id)

    @property
    def prefix(self) -> str:
        """What the caller's stored session ids start with."""
        if Defect.MCP_SHARED_SESSIONS in self.store.defects:
            return ""
        return principal_prefix(self.principal)

    def remember(
        self,
        session_id: str,
        key: str,
        value: Any,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        stored = self.session(session_id)
        try:
            record = self.store.remember(
                stored,
                key,
                value,
                expected_version=expected_version,
                idempotency_key=idempotency_key,
            )
        except VersionConflict as conflict:
            raise _conflict(session_id, conflict) from None
        return {
            "session_id": session_id,
            "key": record.key,
            "version": record.version,
            "replayed": record.replayed,
            "expires_at": _time(record.expires_at),
        }

    def recall(self, session_id: str, key: str) -> dict[str, Any]:
        record = self.store.recall(self.session(session_id), key)
        if record is None:
            raise MemoryNotFound(session_id, key)
        return {
            "session_id": session_id,
            "key": record.key,
            "value": record.value,
            "version": record.version,
            "updated_at": _time(record.updated_at),
            "expires_at": _time(record.expires_at),
        }

    def forget(
        self, session_id: str, key: str, expected_version: int | None = None
    ) -> dict[str, Any]:
        stored = self.session(session_id)
        if expected_version is not None:
            expected_version = validation.check_version(
                "expected_version", expected_version, minimum=1
            )
        try:
            forgotten = self.store.forget(stored, key, expected_version=expected_version)
        except VersionConflict as conflict:
            raise _conflict(session_id, conflict) from None
        return {"session_id": session_id, "key": key, "forgotten": forgotten}

    def history(self, session_id: str, key: str, limit: int | None = None) -> dict[str, Any]:
        stored = self.session(session_id)
        if limit is None:
            versions = self.store.history(stored, key)
        else:
            versions = self.store.history(stored, key, limit=limit)[::-1]
        return {
            "session_id": session_id,
            "key": key,
            "versions": [
                {
                    "version": v.version,
                    "op": str(v.op),
                    "value": v.value,
                    "created_at": v.created_at.isoformat(),
                    "expires_at": _time(v.expires_at),
                }
                for v in versions
            ],
        }

    def search(
        self, query: str, session_id: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        options = {} if limit is None else {"limit": limit}
        prefix = self.prefix
        try:
            if session_id is None:
                found = self.store.search_sessions(prefix, query, **options)
            else:
                found = self.store.search(self.session(session_id), query, **options)
        except ImproperlyConfigured:
            raise SearchUnavailable(
                "this server's store has no semantic index (AGENTMEMORY['SEARCH'])"
            ) from None
        return {
            "results": [
                {
                    "session_id": hit.session_id.removeprefix(prefix),
                    "key": hit.key,
                    "value": hit.value,
                    "version": hit.version,
                    "score": hit.score,
                }
                for hit in found
                if hit.session_id.startswith(prefix)  # never another's, whatever the store gave
            ]
        }

    def list_keys(self, session_id: str, prefix: str | None = None) -> dict[str, Any]:
        found = self.store.recall_many(self.session(session_id), prefix=prefix)
        return {"session_id": session_id, "keys": sorted(found)}

    def append_log(
        self,
        session_id: str,
        log: str,
        items: list[Any],
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        stored = self.session(session_id)
        appended = self.store.append(stored, log, items, idempotency_key=idempotency_key)
        return {"session_id": session_id, "log": log, "numbers": [item.seq for item in appended]}

    def read_log(
        self, session_id: str, log: str, after: int | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        items = self.store.read_log(self.session(session_id), log, after=after, limit=limit)
        return {
            "session_id": session_id,
            "log": log,
            "items": [
                {"number": item.seq, "value": item.value, "created_at": item.created_at.isoformat()}
                for item in items
            ],
        }


def _conflict(session_id: str, conflict: VersionConflict) -> VersionConflict:
    """The store's conflict, told with the caller's session id (not the stored one)."""
    error = VersionConflict(
        session_id, conflict.key, expected=conflict.expected, actual=conflict.actual
    )
    error.args = (
        f"expected_version: {conflict.key!r} in session {session_id!r} is at version "
        f"{conflict.actual}, not {conflict.expected}; nothing was written. Recall it, "
        f"recompute from what it holds now, and retry with expected_version={conflict.actual}",
    )
    return error


def check_arguments(spec: ToolSpec, arguments: Any) -> dict[str, Any]:
    """The call's arguments as keyword arguments: an object, no name the tool does not take,
    every required one present. Their values are checked by the store (the error names the
    field)."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise InvalidMemory("arguments", f"must be an object, got {type(arguments).__name__}")
    properties = spec.input["properties"]
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise InvalidMemory(
            unknown[0],
            f"{spec.name} takes no argument {unknown[0]!r} (it takes {', '.join(properties)})",
        )
    for name in spec.input["required"]:
        if name not in arguments:
            raise InvalidMemory(name, f"is required by {spec.name}")
    for name in ("session_id", "key", "log", "query", "prefix", "idempotency_key"):
        if (
            name in arguments
            and arguments[name] is not None
            and not isinstance(arguments[name], str)
        ):
            raise InvalidMemory(name, f"must be a str, got {type(arguments[name]).__name__}")
    for name in ("limit", "after", "expected_version"):
        if arguments.get(name) is not None:
            validation.check_version(name, arguments[name], minimum=0)
    return dict(arguments)


def error_text(exc: BaseException) -> str:
    """A tool error as the model reads it: the error class, then the message, which begins with
    the field at fault where there is one."""
    if isinstance(exc, AgentMemoryError):
        return f"{type(exc).__name__}: {exc}"
    return f"InternalError: the server failed ({type(exc).__name__}); see its log"


# ---------------------------------------------------------------------- the server


def build_server(
    store: MemoryStore | None = None,
    *,
    principal: str | Callable[[], str | None] | None = None,
) -> Server[Any]:
    """The MCP server (the SDK's low-level :class:`~mcp.server.lowlevel.Server`) over ``store``
    (default: ``MemoryStore()``, the settings' database, cache and index). ``principal``: the
    name every call acts as (stdio), or None to take each request's from :data:`current_principal`
    (HTTP, set by :class:`BearerAuth`)."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    from ..store import MemoryStore

    memory = store if store is not None else MemoryStore()
    fixed = validation.check_principal(principal) if isinstance(principal, str) else None

    tools = [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input,
            output_schema=spec.output,
            annotations=types.ToolAnnotations(
                read_only_hint=spec.read_only,
                destructive_hint=spec.name == "forget",
                idempotent_hint=spec.read_only,
                open_world_hint=False,
            ),
        )
        for spec in TOOLS
    ]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        spec = SPECS.get(params.name)
        if spec is None:
            return _error_result(
                f"UnknownTool: no tool {params.name!r} (tools: {', '.join(SPECS)})"
            )
        who = fixed or current_principal.get()
        if who is None:  # BearerAuth answers 401 before: a server mounted without it
            return _error_result("Unauthenticated: this request carries no principal")
        try:
            arguments = check_arguments(spec, params.arguments)
            result = await aio.run(_call, memory, who, spec.name, arguments)
        except AgentMemoryError as exc:
            return _error_result(error_text(exc))
        except Exception as exc:  # a bug or an outage: logged here, named there
            logger.exception("MCP tool %s failed", spec.name)
            return _error_result(error_text(exc))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))],
            structured_content=result,
        )

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=(
            "Versioned memory: remember/recall/forget/history a JSON value per (session_id, "
            "key), list_keys, search by meaning, and append-only logs (append_log/read_log). "
            "Update a value you read with expected_version to never overwrite another writer; "
            "pass idempotency_key to writes you may retry."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _call(store: MemoryStore, principal: str, name: str, arguments: dict[str, Any]) -> Any:
    from django.db import close_old_connections

    close_old_connections()  # a connection a restarted server dropped: a new one
    return getattr(Tools(store, principal), name)(**arguments)


def _error_result(text: str) -> Any:
    import mcp_types as types

    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


# ---------------------------------------------------------------------- transports


async def serve_stdio(principal: str, store: MemoryStore | None = None) -> None:
    """Serve one client on stdin/stdout as ``principal``, until stdin closes."""
    from mcp.server.stdio import stdio_server

    server = build_server(store, principal=principal)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


class BearerAuth:
    """ASGI middleware: an HTTP request must carry ``Authorization: Bearer <token>`` of a known
    token (:func:`principal_of`), or it is answered 401 -- never a tool result; the request then
    runs as the token's principal (:data:`current_principal`)."""

    def __init__(self, app: Any, *, using: str | None = None) -> None:
        self.app, self.using = app, using

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        principal = None
        if scheme.lower() == "bearer" and token.strip():
            principal = await aio.run(_principal_of, token.strip(), self.using)
        if principal is None:
            await _unauthorized(send, "missing" if not header else "unknown")
            return
        reset = current_principal.set(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            current_principal.reset(reset)


def _principal_of(token: str, using: str | None) -> str | None:
    from django.db import close_old_connections

    close_old_connections()
    return principal_of(token, using=using)


async def _unauthorized(send: Any, why: str) -> None:
    body = json.dumps(
        {
            "error": "invalid_token",
            "error_description": f"{why} bearer token: send Authorization: Bearer <token> "
            "(manage.py agentmemory_mcp_token create USER)",
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="agentmemory", error="invalid_token"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def http_app(
    store: MemoryStore | None = None,
    *,
    host: str = "127.0.0.1",
    path: str = "/mcp",
    allowed_hosts: list[str] | None = None,
) -> Any:
    """The Streamable HTTP server as an ASGI app (stateless, JSON responses), every request
    authenticated by :class:`BearerAuth`. Served by ``manage.py agentmemory_mcp --http``; to
    serve it from your own ASGI server, run its lifespan (the SDK's session manager needs it).
    ``allowed_hosts``: the ``Host`` headers accepted (DNS-rebinding protection; default: the
    loopback names when ``host`` is a loopback address, any otherwise -- put the server behind
    a proxy that terminates TLS)."""
    from mcp.server.transport_security import TransportSecuritySettings

    security = None
    if allowed_hosts:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=allowed_hosts,
            allowed_origins=[
                f"{scheme}://{h}" for h in allowed_hosts for scheme in ("http", "https")
            ],
        )
    app = build_server(store).streamable_http_app(
        streamable_http_path=path,
        stateless_http=True,
        json_response=True,
        host=host,
        transport_security=security,
    )
    return BearerAuth(app, using=store.using if store is not None else None)


def with_django(django_app: Any, store: MemoryStore | None = None, *, path: str = "/mcp") -> Any:
    """One ASGI application for your project's ``asgi.py``: requests to ``path`` go to the MCP
    server (:func:`http_app`, bearer tokens and all), every other request to ``django_app``;
    the ASGI lifespan runs the MCP server's (its session manager)::

        # asgi.py
        from django.core.asgi import get_asgi_application

        django_app = get_asgi_application()  # first: it sets Django up
        from agentmemory.integrations.mcp import with_django

        application = with_django(django_app)

    Serve it with any ASGI server that runs the lifespan (uvicorn, hypercorn, daphne)."""
    if not isinstance(path, str) or not path.startswith("/") or path.endswith("/"):
        raise InvalidMemory("path", f"must start with / and not end with one, got {path!r}")
    mcp_app = http_app(store, path=path, host="0.0.0.0", allowed_hosts=_django_hosts())

    async def application(scope: Any, receive: Any, send: Any) -> None:
        ours = scope["type"] == "http" and scope["path"] in (path, path + "/")
        if scope["type"] == "lifespan" or ours:
            await mcp_app(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    return application


def _django_hosts() -> list[str] | None:
    """The ``Host`` headers the MCP server accepts inside a Django project: its
    ``ALLOWED_HOSTS`` (with any port; ``*``: any host; a ``.example.com`` wildcard is not
    carried over), Django's local names while ``DEBUG`` leaves it empty."""
    from django.conf import settings

    hosts = list(settings.ALLOWED_HOSTS) or (
        ["localhost", "127.0.0.1", "[::1]"] if settings.DEBUG else []
    )
    if "*" in hosts:
        return None
    exact = [host for host in hosts if not host.startswith(".")]
    return [form for host in exact for form in (host, f"{host}:*")] or ["localhost"]
