"""The session benchmark: agentmemory's logs under the agent frameworks' session interfaces, against
those frameworks' own backends, on the same machine, in one run.

    .venv/bin/python bench/sessions.py           # docs/session-benchmarks.{json,md}
    .venv/bin/python bench/sessions.py --quick   # seconds, into out/ (CI runs it)

- OpenAI Agents SDK: ``AgentMemorySession`` against the SDK's ``SQLiteSession`` (its default) and
  ``SQLAlchemySession`` (on the same SQLite file kind, and on PostgreSQL);
- Google ADK: ``AgentMemorySessionService`` against ADK's ``DatabaseSessionService`` (SQLite,
  PostgreSQL);
- the log itself: ``MemoryStore.append`` on a log of 10 items and of 100,000 (an append must cost
  the same: O(1) in the log's length).

Each figure is sequential calls on one session already holding N items (10 or 10,000), run
``--repeats`` times interleaved with its peers; reported as the median ops/s and the ratio to the
peer's median in the same run (> 1: agentmemory is faster). No speed is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
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

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402

from agentmemory import MemoryStore  # noqa: E402
from bench.run import available_backends, progress, run_header, write_results  # noqa: E402

SIZES = {
    "full": {"sizes": (10, 10_000), "calls": 200, "repeats": 3, "log": 100_000},
    "quick": {"sizes": (10, 200), "calls": 20, "repeats": 1, "log": 2_000},
}


def item(n: int) -> dict[str, Any]:
    return {"role": "user", "content": f"message {n}: " + "lorem ipsum " * 8}


# ---------------------------------------------------------------- the backends under test


def sqlalchemy_url(alias: str, folder: Path) -> str:
    """The peers' own async URL of a database of ours (a separate SQLite file)."""
    if alias == "sqlite":
        return f"sqlite+aiosqlite:///{folder / 'peer.sqlite3'}"
    db = settings.DATABASES[alias]
    return f"postgresql+psycopg://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def openai_sessions(alias: str, folder: Path) -> dict[str, Callable[[str], Any]]:
    """Session factories by name: ours first, then the peers on the same kind of database."""
    from agents import SQLiteSession
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

    from agentmemory.integrations.openai_agents import AgentMemorySession

    store = MemoryStore(using=alias, cache=None)
    makers: dict[str, Callable[[str], Any]] = {
        "AgentMemorySession": lambda sid: AgentMemorySession(sid, store=store)
    }
    if alias == "sqlite":
        path = str(folder / "sdk.sqlite3")
        makers["SQLiteSession"] = lambda sid: SQLiteSession(sid, db_path=path)
    url = sqlalchemy_url(alias, folder)
    makers["SQLAlchemySession"] = lambda sid: SQLAlchemySession.from_url(
        sid, url=url, create_tables=True
    )
    return makers


async def openai_filled(make: Callable[[str], Any], size: int, calls: int) -> Any:
    """A session holding ``size`` items, plus ``calls`` for each round of pops to take."""
    session = make(f"bench-{uuid.uuid4().hex[:8]}")
    total = size + calls
    for start in range(0, total, 1000):
        await session.add_items([item(n) for n in range(start, min(total, start + 1000))])
    return session


async def measure_openai(session: Any, calls: int) -> dict[str, float]:
    """ops/s of pop_item (size + calls -> size items), get_items(limit=20) and add_items (one
    item: back to size + calls)."""
    figures = {}
    figures["pop"] = await rate(calls, session.pop_item)
    figures["get"] = await rate(calls, lambda: session.get_items(limit=20))
    figures["add"] = await rate(calls, lambda: session.add_items([item(-1)]))
    return figures


def adk_services(alias: str, folder: Path) -> dict[str, Callable[[], Any]]:
    from google.adk.sessions import DatabaseSessionService

    from agentmemory.integrations.adk import AgentMemorySessionService

    store = MemoryStore(using=alias, cache=None)
    url = sqlalchemy_url(alias, folder).replace("peer.sqlite3", "adk.sqlite3")
    peer = DatabaseSessionService(db_url=url)
    return {
        "AgentMemorySessionService": lambda: AgentMemorySessionService(store),
        "DatabaseSessionService": lambda: peer,
    }


def adk_event(n: int) -> Any:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    return Event(
        author="user",
        invocation_id="inv",
        content=types.Content(role="user", parts=[types.Part(text=item(n)["content"])]),
        actions=EventActions(state_delta={"turn": n}),
    )


async def adk_filled(make: Callable[[], Any], size: int) -> tuple[Any, Any]:
    """A service and a session of it holding ``size`` events (appended one by one: ADK has no
    batch append)."""
    service = make()
    session = await service.create_session(
        app_name="bench", user_id="u", session_id=f"bench-{uuid.uuid4().hex[:8]}"
    )
    for n in range(size):
        await service.append_event(session, adk_event(n))
    return service, session


async def measure_adk(service: Any, session: Any, calls: int) -> dict[str, float]:
    """ops/s of create_session (with a state of the session's own, ``app:`` and ``user:``
    keys), append_event (with a state delta) and get_session (the latest 20 events)."""
    from google.adk.sessions.base_session_service import GetSessionConfig

    figures = {}
    figures["create"] = await rate(
        calls,
        lambda: service.create_session(
            app_name="bench",
            user_id="u",
            session_id=f"new-{uuid.uuid4().hex}",
            state={"topic": "bench", "turns": 0, "app:model": "m", "user:name": "u"},
        ),
    )
    figures["append"] = await rate(calls, lambda: service.append_event(session, adk_event(-1)))
    config = GetSessionConfig(num_recent_events=20)
    figures["get"] = await rate(
        calls,
        lambda: service.get_session(
            app_name="bench", user_id="u", session_id=session.id, config=config
        ),
    )
    return figures


def run_on(loop: asyncio.AbstractEventLoop, measure: Callable[..., Any], *args: Any) -> Any:
    """One measurement (a new coroutine each time) on the loop its sessions were made on."""
    return loop.run_until_complete(measure(*args))


async def rate(calls: int, call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await call()
    return calls / (time.perf_counter() - started)


def log_append_cost(alias: str, length: int, calls: int) -> dict[str, float]:
    """ops/s of a one-item append on a log of 10 items and on one of ``length``."""
    store = MemoryStore(using=alias, cache=None)
    figures = {}
    for size in (10, length):
        session_id = f"bench-log-{uuid.uuid4().hex[:8]}"
        for start in range(0, size, 1000):
            store.append(session_id, "s", [item(n) for n in range(start, min(size, start + 1000))])
        started = time.perf_counter()
        for _ in range(calls):
            store.append(session_id, "s", [item(-1)])
        figures[f"at {size:,}"] = calls / (time.perf_counter() - started)
        store.erase_session(session_id)
    return figures


# ---------------------------------------------------------------- the run


def interleaved(repeats: int, runs: dict[str, Callable[[], dict[str, float]]]) -> dict[str, Any]:
    """Each run ``repeats`` times, round-robin; the median of each figure."""
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            for figure, value in run().items():
                samples[name].setdefault(figure, []).append(value)
    return {
        name: {figure: statistics.median(values) for figure, values in figures.items()}
        for name, figures in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, into out/")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    backends = available_backends(args.backends.split(","))
    results: dict[str, Any] = run_header(
        calls=size["calls"],
        repeats=size["repeats"],
        openai={},
        adk={},
        log={},
    )
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
        folder = Path(tmp)
        for alias in backends:
            for n in size["sizes"]:
                progress(f"{alias}: OpenAI Agents sessions at {n:,} items")
                makers = openai_sessions(alias, folder)
                loop = asyncio.new_event_loop()
                sessions = {
                    name: loop.run_until_complete(openai_filled(make, n, size["calls"]))
                    for name, make in makers.items()
                }
                results["openai"][f"{alias} @ {n}"] = interleaved(
                    size["repeats"],
                    {
                        name: functools.partial(
                            run_on, loop, measure_openai, session, size["calls"]
                        )
                        for name, session in sessions.items()
                    },
                )
                progress(f"{alias}: ADK session services at {n:,} events")
                services = adk_services(alias, folder)
                filled = {
                    name: loop.run_until_complete(adk_filled(make, n))
                    for name, make in services.items()
                }
                results["adk"][f"{alias} @ {n}"] = interleaved(
                    size["repeats"],
                    {
                        name: functools.partial(run_on, loop, measure_adk, *pair, size["calls"])
                        for name, pair in filled.items()
                    },
                )
                loop.close()
            progress(f"{alias}: an append at 10 and at {size['log']:,} items")
            results["log"][alias] = log_append_cost(alias, size["log"], size["calls"])
            connections[alias].close()
    write_results("session-benchmarks", results, render, args.quick)


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Agent sessions: agentmemory against the frameworks' own backends",
        "",
        "Written by `bench/sessions.py` (`make bench`). Each figure: sequential calls on one "
        "session already holding N items or events, through the framework's own interface, each "
        "backend on the same database server as ours (SQLite: a file each); ops/s, and in "
        "parentheses agentmemory's ratio to that peer in the same run (> 1: agentmemory is "
        "faster). agentmemory does more per call -- a locked, exactly-once, audited write; "
        "see the integration pages for what each peer loses under concurrency.",
        "",
        f"Measured {results['when']} on {results['machine']}: {results['calls']} sequential calls "
        f"per figure, median of {results['repeats']}.",
        "",
        "**OpenAI Agents SDK sessions** (`add_items` of one item, `get_items(limit=20)`, "
        "`pop_item`)",
        "",
        "| backend @ items | session | add | get | pop |",
        "|---|---|---|---|---|",
    ]
    for where, by_name in results["openai"].items():
        ours = by_name["AgentMemorySession"]
        for name, figures in by_name.items():
            cells = [
                _cell(figures[k], ours[k], name == "AgentMemorySession")
                for k in ("add", "get", "pop")
            ]
            lines.append(f"| {where} | {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "**Google ADK session services** (`create_session` with a state of four keys: two of "
        "the session's own, an `app:` and a `user:` key; `append_event` with a state delta; "
        "`get_session` of the latest 20 events)",
        "",
        "| backend @ events | service | create_session | append_event | get_session |",
        "|---|---|---|---|---|",
    ]
    for where, by_name in results["adk"].items():
        ours = by_name["AgentMemorySessionService"]
        for name, figures in by_name.items():
            mine = name == "AgentMemorySessionService"
            cells = [_cell(figures[k], ours[k], mine) for k in ("create", "append", "get")]
            lines.append(f"| {where} | {name} | " + " | ".join(cells) + " |")
    lines += ["", "**An append against the log's length** (`MemoryStore.append`, one item)", ""]
    lines += ["| backend | " + " | ".join(next(iter(results["log"].values()))) + " | ratio |"]
    lines += ["|---|---|---|---|"]
    for alias, figures in results["log"].items():
        small, large = figures.values()
        lines.append(f"| {alias} | {small:,.0f} | {large:,.0f} | {large / small:.2f} |")
    return "\n".join(lines) + "\n"


def _cell(value: float, ours: float, mine: bool) -> str:
    return f"{value:,.0f}" if mine else f"{value:,.0f} ({ours / value:.2f})"


if __name__ == "__main__":
    main()
