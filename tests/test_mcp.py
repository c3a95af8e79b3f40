"""The MCP server (#45): ``manage.py agentmemory_mcp`` driven through the official SDK's own
client -- over stdio (a subprocess per client) and Streamable HTTP (one server process, many
clients), on the suite's database -- and, for what needs a semantic index, the same server
in-process. What an outside probe checks: the tools and their schemas, 401 without a known
token, errors as tool results, principals that cannot reach each other's sessions, 16 clients'
compare-and-set increments, idempotent retries, a dropped client, a clean exit of stdio."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from django.core.management import call_command
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from agentmemory import Index, MemoryStore
from agentmemory.defects import Defect
from agentmemory.embedders import HashEmbedder
from agentmemory.integrations import mcp as agentmemory_mcp
from agentmemory.models import McpToken, Memory

from .helpers import child_database_url

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {
    "remember": (["session_id", "key", "value"], ["expected_version", "idempotency_key"]),
    "recall": (["session_id", "key"], []),
    "forget": (["session_id", "key"], ["expected_version"]),
    "history": (["session_id", "key"], ["limit"]),
    "search": (["query"], ["session_id", "limit"]),
    "list_keys": (["session_id"], ["prefix"]),
    "append_log": (["session_id", "log", "items"], ["idempotency_key"]),
    "read_log": (["session_id", "log"], ["after", "limit"]),
}


def child_env() -> dict[str, str]:
    """The environment of a ``manage.py`` subprocess on this test's database."""
    return {**os.environ, "DATABASE_URL": child_database_url(), "PYTHONPATH": str(ROOT)}


def manage(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def accepting(process: subprocess.Popen, port: int) -> None:
    """Wait until ``process`` accepts connections on ``port`` (the event, polled; 60 s at
    most), failing with its stderr if it exits first."""
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, process.stderr.read()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing accepted connections on {port} in 60 s"
            time.sleep(0.05)  # polling for the event: the port accepting connections


@contextmanager
def http_server():
    """``manage.py agentmemory_mcp --http`` on a free port; yields its URL once it accepts
    connections (waited for, not slept for)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "agentmemory_mcp", "--http", "--port", str(port)],
        cwd=ROOT,
        env=child_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        accepting(process, port)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.terminate()
        process.wait(30)


def stdio(principal: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "agentmemory_mcp", "--user", principal],
        env=child_env(),
        cwd=str(ROOT),
    )


async def over_http(url: str, token: str, calls: list[tuple[str, dict]], mode: str = "auto"):
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        return [await client.call_tool(name, args) for name, args in calls]


async def over_stdio(principal: str, calls: list[tuple[str, dict]], mode: str = "legacy"):
    async with Client(stdio(principal), mode=mode) as client:
        return [await client.call_tool(name, args) for name, args in calls]


async def in_process(server: Any, calls: list[tuple[str, dict]]):
    async with Client(server) as client:
        return [await client.call_tool(name, args) for name, args in calls]


def ok(result: Any) -> dict:
    assert not result.is_error, result.content[0].text
    # The same as text, for clients that read only text.
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def error(result: Any) -> str:
    assert result.is_error, result.structured_content
    return result.content[0].text


# ---------------------------------------------------------------------- tools and schemas


def test_the_tools_are_listed_with_their_schemas():
    async def listed():
        async with Client(agentmemory_mcp.build_server(principal="alice")) as client:
            return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in anyio.run(listed)}
    assert set(tools) == set(TOOLS)
    for name, (required, optional) in TOOLS.items():
        tool = tools[name]
        schema = tool.input_schema
        assert list(schema["properties"]) == required + optional, name
        assert schema["required"] == required, name
        for param in optional:
            assert schema["properties"][param]["default"] is None, (name, param)
        assert schema["additionalProperties"] is False
        assert len(tool.description) > 80, name
        assert tool.output_schema["type"] == "object", name
    listed_in = {
        "history": "versions",
        "list_keys": "keys",
        "read_log": "items",
        "search": "results",
    }
    for name, field in listed_in.items():
        assert tools[name].output_schema["properties"][field]["type"] == "array", name
    assert "expected_version" in tools["remember"].description
    assert "VersionConflict" in tools["remember"].description
    assert tools["recall"].annotations.read_only_hint
    assert not tools["remember"].annotations.read_only_hint


# ---------------------------------------------------------------------- transports, principals


@pytest.mark.slow  # processes: the server, the commands
def test_stdio_and_http_are_one_principal_for_a_user_and_their_token():
    """A token created for alice and ``--user alice`` are the same principal: HTTP recalls what
    stdio wrote, with either protocol era; bob's token does not."""
    (written,) = anyio.run(
        over_stdio, "alice", [("remember", {"session_id": "s1", "key": "k", "value": {"n": 1}})]
    )
    assert ok(written)["version"] == 1
    alice = manage("agentmemory_mcp_token", "create", "alice").stdout.strip().splitlines()[-1]
    bob = agentmemory_mcp.create_token("bob")
    with http_server() as (url, _):
        for mode in ("legacy", "auto"):
            (read,) = anyio.run(
                over_http, url, alice, [("recall", {"session_id": "s1", "key": "k"})], mode
            )
            assert ok(read)["value"] == {"n": 1} and ok(read)["version"] == 1
        (theirs,) = anyio.run(over_http, url, bob, [("recall", {"session_id": "s1", "key": "k"})])
        assert error(theirs).startswith("MemoryNotFound: key:")
    assert set(Memory.objects.values_list("session_id", flat=True)) == {"mcp:alice:s1"}


@pytest.mark.slow  # processes: the server, the commands
def test_http_answers_401_without_a_known_token_and_runs_nothing():
    token = agentmemory_mcp.create_token("alice")
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"session_id": "s", "key": "k", "value": 1}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    with http_server() as (url, _):
        for authorization in (
            None,
            "",
            "Bearer",
            f"Basic {token}",
            "Bearer amcp_not-a-token",
            f"Bearer {token}x",
            f"Bearer {token[:-1]}",
            f"bearer {token.upper()}",
        ):
            sent = dict(headers)
            if authorization is not None:
                sent["Authorization"] = authorization
            answer = httpx2.post(url, json=call, headers=sent)
            assert answer.status_code == 401, (authorization, answer.text)
            assert answer.json()["error"] == "invalid_token"
            assert answer.headers["www-authenticate"].startswith("Bearer")
        assert not Memory.objects.exists()
        revoked = manage("agentmemory_mcp_token", "revoke", token[:12])
        assert revoked.returncode == 0, revoked.stderr
        assert (
            httpx2.post(
                url, json=call, headers={**headers, "Authorization": f"Bearer {token}"}
            ).status_code
            == 401
        )
    assert not Memory.objects.exists()


def test_a_principal_cannot_reach_anothers_sessions():
    """bob names alice's session and key with every tool: he finds nothing, changes nothing."""
    server = agentmemory_mcp.build_server
    s = {"session_id": "shared", "key": "k"}
    anyio.run(
        in_process,
        server(principal="alice"),
        [
            ("remember", {**s, "value": "alice's"}),
            ("append_log", {"session_id": "shared", "log": "l", "items": ["a1", "a2"]}),
        ],
    )
    results = anyio.run(
        in_process,
        server(principal="bob"),
        [
            ("recall", s),
            ("history", s),
            ("list_keys", {"session_id": "shared"}),
            ("read_log", {"session_id": "shared", "log": "l"}),
            ("forget", s),
            ("forget", {**s, "expected_version": 1}),
            ("remember", {**s, "value": "bob's", "expected_version": 1}),
        ],
    )
    recall, history, keys, log, forget, forget_cas, overwrite = results
    assert error(recall).startswith("MemoryNotFound")
    assert ok(history)["versions"] == []
    assert ok(keys)["keys"] == []
    assert ok(log)["items"] == []
    assert ok(forget)["forgotten"] is False
    assert error(forget_cas).startswith("VersionConflict: expected_version:")
    assert error(overwrite).startswith("VersionConflict")
    (mine,) = anyio.run(in_process, server(principal="alice"), [("recall", s)])
    assert ok(mine)["value"] == "alice's" and ok(mine)["version"] == 1
    # Names that differ only in case are other principals.
    (upper,) = anyio.run(in_process, server(principal="Alice"), [("recall", s)])
    assert error(upper).startswith("MemoryNotFound")


def test_search_finds_only_the_callers_memories():
    store = MemoryStore(cache=None, index=Index(embed=HashEmbedder(dims=32), dims=32))
    for principal in ("alice", "bob"):
        anyio.run(
            in_process,
            agentmemory_mcp.build_server(store, principal=principal),
            [
                ("remember", {"session_id": "s1", "key": "pet", "value": f"{principal} has a cat"}),
                ("remember", {"session_id": "s2", "key": "car", "value": f"{principal} drives"}),
            ],
        )
    everywhere, one, limited = anyio.run(
        in_process,
        agentmemory_mcp.build_server(store, principal="bob"),
        [
            ("search", {"query": "cat"}),
            ("search", {"query": "cat", "session_id": "s2"}),
            ("search", {"query": "cat", "limit": 1}),
        ],
    )
    found = ok(everywhere)["results"]
    assert {(r["session_id"], r["key"]) for r in found} == {("s1", "pet"), ("s2", "car")}
    assert all(r["value"].startswith("bob") for r in found)
    assert [r["key"] for r in ok(one)["results"]] == ["car"]
    assert len(ok(limited)["results"]) == 1
    (without,) = anyio.run(
        in_process,
        agentmemory_mcp.build_server(MemoryStore(cache=None), principal="bob"),
        [("search", {"query": "cat"})],
    )
    assert error(without).startswith("SearchUnavailable")


# ---------------------------------------------------------------------- what the tools do


def test_history_lists_every_version_and_read_log_reads_after_a_number():
    calls = [
        ("remember", {"session_id": "s", "key": "k", "value": 1}),
        ("remember", {"session_id": "s", "key": "k", "value": 2, "expected_version": 1}),
        ("forget", {"session_id": "s", "key": "k"}),
        ("remember", {"session_id": "s", "key": "k", "value": 4}),
        ("history", {"session_id": "s", "key": "k"}),
        ("history", {"session_id": "s", "key": "k", "limit": 2}),
        ("append_log", {"session_id": "s", "log": "l", "items": [1, 2, 3, 4, 5]}),
        ("read_log", {"session_id": "s", "log": "l", "after": 3}),
        ("read_log", {"session_id": "s", "log": "l", "limit": 2}),
        ("read_log", {"session_id": "s", "log": "l", "after": 1, "limit": 2}),
        ("list_keys", {"session_id": "s"}),
        ("list_keys", {"session_id": "s", "prefix": "x"}),
    ]
    results = anyio.run(in_process, agentmemory_mcp.build_server(principal="p"), calls)
    history, page = ok(results[4])["versions"], ok(results[5])["versions"]
    assert [(v["version"], v["op"], v["value"]) for v in history] == [
        (1, "write", 1),
        (2, "write", 2),
        (3, "forget", None),
        (4, "write", 4),
    ]
    assert [v["version"] for v in page] == [3, 4]
    assert ok(results[6])["numbers"] == [1, 2, 3, 4, 5]
    assert [(i["number"], i["value"]) for i in ok(results[7])["items"]] == [(4, 4), (5, 5)]
    assert [i["number"] for i in ok(results[8])["items"]] == [4, 5]
    assert [i["number"] for i in ok(results[9])["items"]] == [2, 3]
    assert ok(results[10])["keys"] == ["k"] and ok(results[11])["keys"] == []


DEEP: list = []
for _ in range(40):
    DEEP = [DEEP]


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("remember", {"session_id": "s", "key": "k"}, "InvalidMemory: value: is required"),
        (
            "remember",
            {"session_id": 7, "key": "k", "value": 1},
            "InvalidMemory: session_id: must be a str",
        ),
        ("remember", {"session_id": ["s"], "key": "k", "value": 1}, "InvalidMemory: session_id:"),
        ("remember", {"session_id": "", "key": "k", "value": 1}, "InvalidMemory: session_id:"),
        (
            "remember",
            {"session_id": "s" * 92, "key": "k", "value": 1},
            "InvalidMemory: session_id: must be at most 91",
        ),
        (
            "remember",
            {"session_id": "e\u0301", "key": "k", "value": 1},
            "InvalidMemory: session_id: must be in Unicode normalization form NFC",
        ),
        (
            "remember",
            {"session_id": "s", "key": "k", "value": 1, "expected_version": True},
            "InvalidMemory: expected_version: must be an int",
        ),
        (
            "remember",
            {"session_id": "s", "key": "k", "value": 1, "expected_version": "1"},
            "InvalidMemory: expected_version: must be an int",
        ),
        (
            "remember",
            {"session_id": "s", "key": "k", "value": 1, "expected_version": -1},
            "InvalidMemory: expected_version: must be >= 0",
        ),
        (
            "remember",
            {"session_id": "s", "key": "k", "value": DEEP},
            "InvalidMemory: value:",
        ),
        (
            "remember",
            {"session_id": "s", "key": "k", "value": 1, "idempotency_key": ""},
            "InvalidMemory: idempotency_key:",
        ),
        (
            "remember",
            {"session_id": "s", "key": "k", "value": 1, "ttl": 5},
            "InvalidMemory: ttl: remember takes no argument 'ttl'",
        ),
        (
            "append_log",
            {"session_id": "s", "log": "l", "items": "abc"},
            "InvalidMemory: items: must be a list of JSON values, got a single str",
        ),
        (
            "append_log",
            {"session_id": "s", "log": "l", "items": {"a": 1}},
            "InvalidMemory: items: must be a list",
        ),
        (
            "read_log",
            {"session_id": "s", "log": "l", "after": -1},
            "InvalidMemory: after: must be >= 0",
        ),
        (
            "history",
            {"session_id": "s", "key": "k", "limit": 0},
            "InvalidMemory: limit: must be >= 1",
        ),
        (
            "history",
            {"session_id": "s", "key": "k", "limit": 10**6},
            "InvalidMemory: limit: must be <= 10000",
        ),
        ("search", {"query": "   "}, "InvalidMemory: query:"),
        (
            "recall",
            {"session_id": "s", "key": "missing"},
            "MemoryNotFound: key: no live memory 'missing' in session 's'",
        ),
        ("no_such_tool", {}, "UnknownTool: no tool 'no_such_tool'"),
    ],
)
def test_bad_calls_are_tool_errors_naming_the_class_and_field_and_change_nothing(
    name, arguments, expected
):
    store = MemoryStore(cache=None, index=Index(embed=HashEmbedder(dims=8), dims=8))
    (result,) = anyio.run(
        in_process, agentmemory_mcp.build_server(store, principal="p"), [(name, arguments)]
    )
    assert error(result).startswith(expected), error(result)
    assert "Traceback" not in error(result)
    assert not Memory.objects.exists()


def test_session_ids_and_keys_that_differ_in_case_accent_or_trailing_space_are_distinct():
    ids = ["s", "S", "s ", " s", "é", "e"]
    server = agentmemory_mcp.build_server(principal="p")
    calls = [("remember", {"session_id": i, "key": i, "value": i}) for i in ids]
    calls += [("recall", {"session_id": i, "key": i}) for i in ids]
    results = anyio.run(in_process, server, calls)
    assert [ok(r)["value"] for r in results[len(ids) :]] == ids
    assert all(ok(r)["version"] == 1 for r in results)


def test_retries_with_the_same_idempotency_key_write_once_and_another_request_is_refused():
    retried_through_the_tools(MemoryStore(cache=None))


def test_the_retry_test_fails_on_a_store_that_ignores_idempotency_keys():
    """The declared seam (the self-test's idempotency-ignored variant) behind the tools: a
    retried call writes again, and the test above fails."""
    with pytest.raises(AssertionError):
        retried_through_the_tools(MemoryStore(cache=None, defects=[Defect.IDEMPOTENCY_IGNORED]))


def retried_through_the_tools(store: MemoryStore) -> None:
    server = agentmemory_mcp.build_server(store, principal="p")
    write = {"session_id": "s", "key": "k", "value": {"n": 1}, "idempotency_key": "req-1"}
    append = {"session_id": "s", "log": "l", "items": ["a", "b"], "idempotency_key": "req-2"}
    first, again, other, log, log_again, log_other = anyio.run(
        in_process,
        server,
        [
            ("remember", write),
            ("remember", write),
            ("remember", {**write, "value": {"n": 2}}),
            ("append_log", append),
            ("append_log", append),
            ("append_log", {**append, "items": ["c"]}),
        ],
    )
    assert ok(first) == {**ok(again), "replayed": False} and ok(again)["replayed"] is True
    assert error(other).startswith("IdempotencyKeyReused: idempotency_key:")
    assert ok(log)["numbers"] == ok(log_again)["numbers"] == [1, 2]
    assert error(log_other).startswith("IdempotencyKeyReused: idempotency_key:")
    (history, items) = anyio.run(
        in_process,
        server,
        [
            ("history", {"session_id": "s", "key": "k"}),
            ("read_log", {"session_id": "s", "log": "l"}),
        ],
    )
    assert len(ok(history)["versions"]) == 1 and len(ok(items)["items"]) == 2


# ---------------------------------------------------------------------- concurrency


@pytest.mark.slow
def test_sixteen_http_clients_increment_with_compare_and_set_and_lose_nothing():
    """16 clients, each its own HTTP connection, 10 increments each by compare-and-set from an
    initial version: value 160, version 161, a history of 1-161 with no gap."""
    token = agentmemory_mcp.create_token("counter")
    s = {"session_id": "s", "key": "n"}
    conflicts = []

    async def client(url: str) -> None:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http,
            Client(streamable_http_client(url, http_client=http)) as mcp,
        ):
            done, misses = 0, 0
            while done < 10:
                current = ok(await mcp.call_tool("recall", s))
                result = await mcp.call_tool(
                    "remember",
                    {
                        **s,
                        "value": current["value"] + 1,
                        "expected_version": current["version"],
                    },
                )
                if result.is_error:
                    assert error(result).startswith("VersionConflict"), error(result)
                    conflicts.append(1)
                    misses += 1
                    # An agent's retry policy: a jittered backoff after a conflict (without one,
                    # 16 clients spent 15 of every 16 calls losing the race).
                    await anyio.sleep(random.uniform(0, 0.005) * min(misses, 8))
                else:
                    done, misses = done + 1, 0

    async def all_clients(url: str) -> None:
        async with anyio.create_task_group() as group:
            for _ in range(16):
                group.start_soon(client, url)

    with http_server() as (url, _):
        anyio.run(over_http, url, token, [("remember", {**s, "value": 0})])
        anyio.run(all_clients, url)
        final, history = anyio.run(over_http, url, token, [("recall", s), ("history", s)])
    assert ok(final)["value"] == 160 and ok(final)["version"] == 161
    assert [v["version"] for v in ok(history)["versions"]] == list(range(1, 162))
    assert conflicts, "no two clients ever raced: the test did not test compare-and-set"


@pytest.mark.slow
def test_a_client_dropping_mid_call_leaves_the_server_serving_the_others():
    """A client sends half a request and vanishes, another drops while its call runs: the
    server goes on answering everyone else."""
    token = agentmemory_mcp.create_token("p")
    with http_server() as (url, process):
        port = int(url.split(":")[2].split("/")[0])
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {token}\r\nContent-Length: 100000\r\n\r\n".encode()
            + b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "remem'
        )

        async def dropped() -> None:
            with anyio.move_on_after(0.05):
                await over_http(
                    url,
                    token,
                    [("remember", {"session_id": "s", "key": "big", "value": "x" * 2_000_000})],
                )

        anyio.run(dropped)
        half.close()
        (result,) = anyio.run(
            over_http, url, token, [("remember", {"session_id": "s", "key": "k", "value": 1})]
        )
        assert ok(result)["version"] == 1
        assert process.poll() is None


@pytest.mark.slow
def test_stdio_exits_0_soon_after_stdin_closes_with_a_large_remember_in_flight():
    """The client writes its handshake and a 4 MB remember, then closes stdin at once: the
    server exits 0 within seconds, and the memory is there whole or not at all."""
    value = "v" * 4_000_000
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "probe", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "remember",
                "arguments": {"session_id": "s", "key": "big", "value": value},
            },
        },
    ]
    process = subprocess.Popen(
        [sys.executable, "manage.py", "agentmemory_mcp", "--user", "p"],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    started = time.monotonic()
    # Written whole, then stdin closed at once (communicate), then read to the end.
    out, err = process.communicate(
        b"".join(json.dumps(m).encode() + b"\n" for m in messages), timeout=60
    )
    assert process.returncode == 0, err.decode()[-2000:]
    assert time.monotonic() - started < 30
    assert json.loads(out.splitlines()[0])["result"]["serverInfo"]["name"] == "agentmemory"
    stored = MemoryStore(cache=None).recall("mcp:p:s", "big")
    assert stored is None or stored.value == value


# ---------------------------------------------------------------------- the commands


@pytest.mark.slow  # processes: the server, the commands
def test_the_token_command_creates_lists_and_revokes():
    created = manage("agentmemory_mcp_token", "create", "alice", "--label", "laptop")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip().splitlines()[-1]
    assert token.startswith("amcp_") and len(token) > 40
    second = agentmemory_mcp.create_token("alice")
    other = agentmemory_mcp.create_token("bob")
    row = McpToken.objects.get(prefix=token[:12])
    assert row.digest != token and token not in row.digest and row.label == "laptop"
    listed = manage("agentmemory_mcp_token", "list")
    assert token[:12] in listed.stdout and token not in listed.stdout and "laptop" in listed.stdout
    assert other[:12] in listed.stdout
    only = manage("agentmemory_mcp_token", "list", "bob").stdout
    assert other[:12] in only and token[:12] not in only
    assert manage("agentmemory_mcp_token", "revoke", token[:12]).returncode == 0
    assert agentmemory_mcp.principal_of(token) is None
    assert agentmemory_mcp.principal_of(second) == "alice"
    assert manage("agentmemory_mcp_token", "revoke", "--user", "alice").returncode == 0
    assert agentmemory_mcp.principal_of(second) is None
    assert agentmemory_mcp.principal_of(other) == "bob"
    missing = manage("agentmemory_mcp_token", "revoke", token[:12])
    assert missing.returncode == 1 and "nothing revoked" in missing.stderr


@pytest.mark.parametrize(
    "principal", ["al ice", "alice ", "élise", "a:b", "", "x" * 33, "ali\u200bce"]
)
def test_a_principal_name_outside_the_rules_is_refused_by_both_commands(principal):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="principal") as created:
        call_command("agentmemory_mcp_token", "create", principal)
    with pytest.raises(CommandError, match="--user: ") as served:
        call_command("agentmemory_mcp", "--user", principal)
    assert created.value.returncode == served.value.returncode == 2
    assert not McpToken.objects.exists()


@pytest.mark.slow  # processes: the server, the commands
def test_the_server_command_refuses_options_that_do_not_go_together():
    from django.core.management.base import CommandError

    for args, message in (
        ((), "needs --user"),
        (("--http", "--user", "alice"), "--user is for stdio"),
        (("--http", "--port", "70000"), "--port: must be 0 to 65535"),
    ):
        with pytest.raises(CommandError, match=message) as refused:
            call_command("agentmemory_mcp", *args)
        assert refused.value.returncode == 2
    # As a process: the exit code, the message on stderr, nothing on stdout (the protocol's).
    bad = manage("agentmemory_mcp", "--user", "al ice", stdin="")
    assert bad.returncode == 2 and "--user: " in bad.stderr and bad.stdout == ""


def test_tokens_are_checked_in_process_too():
    """:func:`principal_of` refuses what is not a token of this server, whatever its type."""
    token = agentmemory_mcp.create_token("alice")
    assert agentmemory_mcp.principal_of(token) == "alice"
    for wrong in (token.upper(), token + " ", " " + token, "", None, 5, token[5:], "amcp_"):
        assert agentmemory_mcp.principal_of(wrong) is None
    with pytest.raises(Exception, match="principal"):
        call_command("agentmemory_mcp_token", "create", "bad name")


def test_the_admin_lists_tokens_by_prefix_and_deleting_one_revokes_it(admin_client):
    from django.urls import reverse

    token = agentmemory_mcp.create_token("alice", label="laptop")
    row = McpToken.objects.get()
    page = admin_client.get(reverse("admin:agentmemory_mcptoken_changelist")).content.decode()
    assert row.prefix in page and "alice" in page and "laptop" in page
    assert token not in page and row.digest not in page
    assert admin_client.get(reverse("admin:agentmemory_mcptoken_add")).status_code == 403
    change = reverse("admin:agentmemory_mcptoken_change", args=[row.pk])
    assert row.digest not in admin_client.get(change).content.decode()
    assert admin_client.post(change, {"principal": "mallory"}).status_code == 403
    delete = reverse("admin:agentmemory_mcptoken_delete", args=[row.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert agentmemory_mcp.principal_of(token) is None


@pytest.mark.slow  # processes: the server, the commands
def test_mounted_in_the_projects_asgi_application_beside_django():
    """``with_django``: the demo project's asgi.py serves Django and the MCP server at /mcp
    from one ASGI server (uvicorn), the MCP server's lifespan run by it."""
    token = agentmemory_mcp.create_token("alice")
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "project.asgi:application",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=child_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        accepting(process, port)
        base = f"http://127.0.0.1:{port}"
        assert httpx2.get(f"{base}/admin/login/").status_code == 200  # Django
        assert httpx2.post(f"{base}/mcp", json={}).status_code == 401  # the MCP server
        (written, read) = anyio.run(
            over_http,
            f"{base}/mcp",
            token,
            [
                ("remember", {"session_id": "s", "key": "k", "value": 1}),
                ("recall", {"session_id": "s", "key": "k"}),
            ],
        )
        assert ok(written)["version"] == 1 and ok(read)["value"] == 1
        # DNS rebinding: a known token, but a Host outside Django's ALLOWED_HOSTS.
        evil = httpx2.post(
            f"{base}/mcp",
            json={},
            headers={"Host": "evil.example", "Authorization": f"Bearer {token}"},
        )
        assert evil.status_code == 421, evil.status_code
    finally:
        process.terminate()
        process.wait(30)
