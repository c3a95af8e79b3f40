"""The adapters of #45 against the frameworks' own stores, on the same machine, in one run.

    .venv/bin/python bench/adapters.py           # docs/adapter-benchmarks.{json,md}
    .venv/bin/python bench/adapters.py --quick   # seconds, into out/ (CI runs it)

- LlamaIndex ``Memory``'s store: ``AgentMemoryDBChatStore`` against ``SQLAlchemyChatStore`` (its
  default), on SQLite (aiosqlite) and PostgreSQL (psycopg);
- Microsoft Agent Framework's history: ``AgentMemoryHistoryProvider`` against
  ``FileHistoryProvider`` (JSON Lines, a file per session);
- the MCP server: a tool call through the SDK's client (in-process, the JSON-RPC session loop a
  stdio client uses) against the same store call made directly -- the server's cost.

Each figure is sequential calls on one chat or session already holding N messages, run
``--repeats`` times interleaved with its peer; the median calls/s and the ratio to the peer's
median in the same run (> 1: agentmemory is faster). No speed is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import django  # noqa: E402

django.setup()

from django.db import connections  # noqa: E402

from agentmemory import MemoryStore  # noqa: E402
from bench.run import available_backends, progress, run_header, write_results  # noqa: E402
from bench.sessions import interleaved, sqlalchemy_url  # noqa: E402

SIZES = {
    "full": {"sizes": (10, 1_000), "calls": 200, "repeats": 3},
    "quick": {"sizes": (10,), "calls": 20, "repeats": 1},
}


def text(n: int) -> str:
    return f"message {n}: " + "lorem ipsum " * 8


async def rate(calls: int, call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await call()
    return calls / (time.perf_counter() - started)


# ---------------------------------------------------------------- LlamaIndex Memory's store


def llamaindex_stores(alias: str, folder: Path) -> dict[str, Any]:
    from llama_index.core.storage.chat_store.sql import SQLAlchemyChatStore

    from agentmemory.integrations.llamaindex import AgentMemoryDBChatStore

    url = sqlalchemy_url(alias, folder).replace("peer.sqlite3", "llama.sqlite3")
    return {
        "AgentMemoryDBChatStore": AgentMemoryDBChatStore(
            store=MemoryStore(using=alias, cache=None)
        ),
        "SQLAlchemyChatStore": SQLAlchemyChatStore(
            table_name=f"bench_{uuid.uuid4().hex[:8]}", async_database_uri=url
        ),
    }


async def llamaindex_measure(store: Any, key: str, calls: int) -> dict[str, float]:
    """add_message (one), get_messages (the whole active chat, as Memory reads it),
    count_messages."""
    from llama_index.core.llms import ChatMessage

    message = ChatMessage(role="user", content=text(-1))
    return {
        "add": await rate(calls, lambda: store.add_message(key, message)),
        "get": await rate(calls, lambda: store.get_messages(key)),
        "count": await rate(calls, lambda: store.count_messages(key)),
    }


async def llamaindex_filled(store: Any, size: int) -> str:
    from llama_index.core.llms import ChatMessage

    key = f"bench-{uuid.uuid4().hex[:8]}"
    await store.add_messages(key, [ChatMessage(role="user", content=text(n)) for n in range(size)])
    return key


# ---------------------------------------------------------------- Agent Framework's history


def history_providers(alias: str, folder: Path) -> dict[str, Any]:
    from agent_framework import FileHistoryProvider

    from agentmemory.integrations.agent_framework import AgentMemoryHistoryProvider

    providers: dict[str, Any] = {
        "AgentMemoryHistoryProvider": AgentMemoryHistoryProvider(
            store=MemoryStore(using=alias, cache=None)
        )
    }
    if alias == "sqlite":  # the file provider's files are the same whatever our database
        providers["FileHistoryProvider"] = FileHistoryProvider(folder / "af-history")
    return providers


async def history_filled(provider: Any, size: int) -> str:
    from agent_framework import Message

    session_id = f"bench-{uuid.uuid4().hex[:8]}"
    batch = [Message(role="user", contents=[text(n)], message_id=f"m{n}") for n in range(size)]
    await provider.save_messages(session_id, batch, state={})
    return session_id


async def history_measure(provider: Any, session_id: str, calls: int) -> dict[str, float]:
    """save_messages of one turn (a user message and a reply, with ids: what the framework
    saves after a run), get_messages (the whole history, as a run loads it)."""
    from agent_framework import Message

    counter = iter(range(10**9))

    def turn() -> list[Any]:
        n = next(counter)
        return [
            Message(role="user", contents=["hi"], message_id=f"u{n}-{uuid.uuid4().hex[:6]}"),
            Message(
                role="assistant", contents=["hello"], message_id=f"a{n}-{uuid.uuid4().hex[:6]}"
            ),
        ]

    return {
        "save": await rate(calls, lambda: provider.save_messages(session_id, turn(), state={})),
        "get": await rate(calls, lambda: provider.get_messages(session_id, state={})),
    }


# ---------------------------------------------------------------- the MCP server's cost


async def mcp_measure(alias: str, calls: int) -> dict[str, dict[str, float]]:
    from mcp import Client

    from agentmemory.integrations.mcp import build_server

    store = MemoryStore(using=alias, cache=None)
    session = f"bench-{uuid.uuid4().hex[:8]}"
    args = {"session_id": session, "key": "k"}
    async with Client(build_server(store, principal="bench"), mode="legacy") as client:
        await client.call_tool("remember", {**args, "value": text(0)})
        through = {
            "remember": await rate(
                calls, lambda: client.call_tool("remember", {**args, "value": text(1)})
            ),
            "recall": await rate(calls, lambda: client.call_tool("recall", args)),
        }
    stored = f"mcp:bench:{session}"
    direct = {
        "remember": await rate(calls, lambda: store.aremember(stored, "k", text(1))),
        "recall": await rate(calls, lambda: store.arecall(stored, "k")),
    }
    await store.aerase_session(stored)
    return {"MCP tool call": through, "the store directly": direct}


# ---------------------------------------------------------------- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, into out/")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    calls, repeats = size["calls"], size["repeats"]
    backends = available_backends(args.backends.split(","))
    results: dict[str, Any] = run_header(
        calls=calls,
        repeats=repeats,
        llamaindex={},
        agent_framework={},
        mcp={},
    )
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as tmp:
        folder = Path(tmp)
        for alias in backends:
            loop = asyncio.new_event_loop()
            for n in size["sizes"]:
                progress(f"{alias}: LlamaIndex Memory's chat store at {n:,} messages")
                stores = llamaindex_stores(alias, folder)
                keys = {
                    name: loop.run_until_complete(llamaindex_filled(store, n))
                    for name, store in stores.items()
                }
                results["llamaindex"][f"{alias} @ {n}"] = interleaved(
                    repeats,
                    {
                        name: lambda s=store, k=keys[name], lp=loop: lp.run_until_complete(
                            llamaindex_measure(s, k, calls)
                        )
                        for name, store in stores.items()
                    },
                )
                progress(f"{alias}: Agent Framework's history at {n:,} messages")
                providers = history_providers(alias, folder)
                sessions = {
                    name: loop.run_until_complete(history_filled(p, n))
                    for name, p in providers.items()
                }
                results["agent_framework"][f"{alias} @ {n}"] = interleaved(
                    repeats,
                    {
                        name: lambda p=p, s=sessions[name], lp=loop: lp.run_until_complete(
                            history_measure(p, s, calls)
                        )
                        for name, p in providers.items()
                    },
                )
            progress(f"{alias}: the MCP server's cost")
            samples = [loop.run_until_complete(mcp_measure(alias, calls)) for _ in range(repeats)]
            results["mcp"][alias] = {
                path: {
                    op: sorted(s[path][op] for s in samples)[len(samples) // 2]
                    for op in samples[0][path]
                }
                for path in samples[0]
            }
            loop.close()
            connections[alias].close()
    write_results("adapter-benchmarks", results, render, args.quick)


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The new adapters against the frameworks' own stores",
        "",
        "Written by `bench/adapters.py` (`make bench`). Sequential calls on one chat or session "
        "already holding N messages, through the framework's own interface; calls/s, and in "
        "parentheses agentmemory's ratio to that peer in the same run (> 1: agentmemory is "
        "faster). agentmemory does more per call -- a locked, exactly-once, audited write; "
        "see [LlamaIndex](llamaindex.md), [Agent Framework](agent-framework.md) and "
        "[MCP](mcp.md) for what each peer loses under concurrency.",
        "",
        f"Measured {results['when']} on {results['machine']}: {results['calls']} sequential calls "
        f"per figure, median of {results['repeats']}.",
        "",
    ]
    lines += _table(
        "**LlamaIndex `Memory`'s chat store** (`add_message` of one message, `get_messages` of "
        "the whole active chat, `count_messages`)",
        results["llamaindex"],
        "AgentMemoryDBChatStore",
        ("add", "get", "count"),
    )
    lines += _table(
        "**Microsoft Agent Framework's history** (`save_messages` of one turn, `get_messages` of "
        "the whole history)",
        results["agent_framework"],
        "AgentMemoryHistoryProvider",
        ("save", "get"),
    )
    lines += [
        "**The MCP server's cost** (a tool call through the SDK's client, in-process, against "
        "the same call on the store directly)",
        "",
        "| backend | path | remember | recall |",
        "|---|---|---|---|",
    ]
    for alias, paths in results["mcp"].items():
        direct = paths["the store directly"]
        for path, figures in paths.items():
            mine = path == "the store directly"
            cells = [
                _cell(figures[k], direct[k], mine, invert=True) for k in ("remember", "recall")
            ]
            lines.append(f"| {alias} | {path} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(For the MCP rows the ratio is the tool call's share of the direct call's rate: what "
        "the protocol costs.)",
    ]
    return "\n".join(lines) + "\n"


def _table(title: str, by_where: dict[str, Any], ours: str, columns: tuple[str, ...]) -> list[str]:
    lines = [title, "", "| backend @ messages | store | " + " | ".join(columns) + " |"]
    lines.append("|---|---|" + "---|" * len(columns))
    for where, by_name in by_where.items():
        mine = by_name[ours]
        for name, figures in by_name.items():
            cells = [_cell(figures[c], mine[c], name == ours) for c in columns]
            lines.append(f"| {where} | {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _cell(value: float, ours: float, mine: bool, *, invert: bool = False) -> str:
    if mine:
        return f"{value:,.0f}"
    ratio = value / ours if invert else ours / value
    return f"{value:,.0f} ({ratio:.2f})"


if __name__ == "__main__":
    main()
