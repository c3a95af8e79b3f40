"""agentmemory without a Django project: ``agentmemory.setup(url)`` and the adapters' URL
idioms (``AgentMemorySaver.from_conn_string``, ``AgentMemoryStore.from_conn_string``,
``AgentMemorySession(id, url)``, ``AgentMemorySessionService(db_url=)``), each in a plain
script run by a new interpreter with no settings module -- as a LangGraph, SDK or ADK user runs
one; and inside a project, the project's settings left as they were."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from agentmemory.standalone import cache_settings, database_settings

ROOT = Path(__file__).resolve().parent.parent


def script(code: str, cwd: Path, *, settings: str | None = None) -> str:
    """Run ``code`` in a new interpreter in ``cwd``: no ``DJANGO_SETTINGS_MODULE`` (unless
    ``settings``), the repository not on the path (agentmemory is installed). Its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    if settings is not None:
        env.update(DJANGO_SETTINGS_MODULE=settings, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_one_line_gives_a_store_and_a_second_process_reads_what_the_first_wrote(tmp_path):
    out = script(
        """
        import agentmemory

        store = agentmemory.setup("sqlite:///memory.db")
        store.remember("ada", "preferences", {"tone": "warm"})
        again = agentmemory.setup("sqlite:///memory.db")  # the same URL: the same database
        print(again.using == store.using, again.recall("ada", "preferences").version)
        other = agentmemory.setup("sqlite:///other.db")
        print(other.using != store.using, other.recall("ada", "preferences"))
        """,
        tmp_path,
    )
    assert out.split() == ["True", "1", "True", "None"]
    assert (tmp_path / "memory.db").exists()
    out = script(
        """
        import agentmemory

        store = agentmemory.setup("sqlite:///memory.db")
        print(store.recall("ada", "preferences").value, store.remember("ada", "k", 1).version)
        """,
        tmp_path,
    )
    assert out.strip() == "{'tone': 'warm'} 1"


@pytest.mark.parametrize(
    "first",
    [
        "from agentmemory.integrations.openai_agents import AgentMemorySession as made\n"
        "made('s', 'sqlite:///first.db')",
        "from agentmemory.integrations.adk import AgentMemorySessionService as made\n"
        "made(db_url='sqlite:///first.db')",
        "from agentmemory.integrations.langgraph import AgentMemoryStore as made\n"
        "made.from_conn_string('sqlite:///first.db').__enter__()",
        "from agentmemory.integrations.langgraph import AgentMemorySaver as made\n"
        "made.from_conn_string('sqlite:///first.db').__enter__()",
        "from agentmemory.integrations.llamaindex import AgentMemoryChatStore as made\n"
        "from llama_index.core.llms import ChatMessage\n"
        "made('sqlite:///first.db').add_message('u', ChatMessage(role='user', content='hi'))\n"
        "print(made('sqlite:///first.db').get_messages('u')[0].content)",
    ],
    ids=["sdk-session", "adk-service", "langgraph-store", "langgraph-saver", "llamaindex"],
)
def test_each_adapter_is_the_first_thing_a_script_may_make(tmp_path, first):
    script(first, tmp_path)
    assert (tmp_path / "first.db").exists()


def test_a_store_set_up_inside_a_coroutine(tmp_path):
    out = script(
        """
        import asyncio

        import agentmemory


        async def main():
            store = agentmemory.setup("sqlite:///memory.db")  # Django's calls: off the loop
            record = await store.aremember("ada", "k", 1)
            print(record.version, (await store.arecall("ada", "k")).value)


        asyncio.run(main())
        """,
        tmp_path,
    )
    assert out.split() == ["1", "1"]


def test_the_adapters_take_a_url_as_their_peers_do(tmp_path):
    out = script(
        """
        import asyncio
        import operator
        from typing import Annotated, TypedDict

        from langgraph.graph import END, START, StateGraph

        from agentmemory.integrations.adk import AgentMemorySessionService
        from agentmemory.integrations.langgraph import AgentMemorySaver, AgentMemoryStore
        from agentmemory.integrations.openai_agents import AgentMemorySession

        URL = "sqlite:///agent.db"


        class State(TypedDict):
            turns: Annotated[list, operator.add]


        builder = StateGraph(State)
        builder.add_node("reply", lambda state: {"turns": ["hi"]})
        builder.add_edge(START, "reply")
        builder.add_edge("reply", END)
        with AgentMemorySaver.from_conn_string(URL) as saver:
            graph = builder.compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "t1"}}
            graph.invoke({"turns": []}, config)
            print(graph.invoke({"turns": []}, config)["turns"])
        with AgentMemoryStore.from_conn_string(URL) as store:
            store.put(("users", "ada"), "tone", {"value": "warm"})
            print(store.get(("users", "ada"), "tone").value)


        async def main():
            session = AgentMemorySession("conversation-1", URL)
            await session.add_items([{"role": "user", "content": "hello"}])
            print(len(await session.get_items()))
            service = AgentMemorySessionService(db_url=URL)
            made = await service.create_session(app_name="app", user_id="ada", state={"k": 1})
            found = await service.get_session(app_name="app", user_id="ada", session_id=made.id)
            print(found.state)


        asyncio.run(main())
        """,
        tmp_path,
    )
    assert out.splitlines() == ["['hi', 'hi']", "{'value': 'warm'}", "1", "{'k': 1}"]


def test_inside_a_project_its_settings_stay_and_the_url_gets_an_alias_beside_them(tmp_path):
    out = script(
        f"""
        import django

        django.setup()
        from django.conf import settings

        import agentmemory

        before = {{alias: dict(db) for alias, db in settings.DATABASES.items()}}
        store = agentmemory.setup("sqlite:///{tmp_path / "beside.db"}")
        store.remember("s", "k", 1)
        after = settings.DATABASES
        print(store.using not in before, all(after[alias] == db for alias, db in before.items()))
        print(sorted(set(after) - set(before)) == [store.using])
        """,
        tmp_path,
        settings="project.settings",
    )
    assert out.split() == ["True", "True", "True"]


@pytest.mark.parametrize(
    "url, named",
    [
        ("memory.db", "has no scheme: a SQLite file is 'sqlite:///memory.db'"),
        ("sqlite://", "a SQLite file is needed"),
        ("sqlite:///:memory:", "a SQLite file is needed"),
        ("oracle://u@h/db", "unknown scheme 'oracle'"),
        ("postgres://u:secret@h:5432/", "no database name"),
        (["sqlite:///memory.db"], "must be a URL"),
    ],
)
def test_a_bad_database_url_is_refused_naming_what_was_wrong(url, named):
    with pytest.raises(ImproperlyConfigured, match=named) as refused:
        database_settings(url)
    assert "secret" not in str(refused.value)


def test_urls_become_djangos_settings():
    assert database_settings("postgres://app:p%40ss@db.internal:6432/agents?sslmode=require") == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "agents",
        "USER": "app",
        "PASSWORD": "p@ss",
        "HOST": "db.internal",
        "PORT": "6432",
        "OPTIONS": {"sslmode": "require"},
        "CONN_HEALTH_CHECKS": True,
    }
    mysql = database_settings("mariadb://root@127.0.0.1/agents")
    assert mysql["ENGINE"] == "django.db.backends.mysql"
    assert mysql["OPTIONS"] == {"charset": "utf8mb4", "isolation_level": "read committed"}
    sqlite = database_settings("sqlite:////var/lib/app/memory.db?timeout=5")
    assert sqlite["NAME"] == "/var/lib/app/memory.db"
    assert sqlite["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert sqlite["OPTIONS"]["timeout"] == 5
    assert cache_settings("redis://127.0.0.1:6379/3")["LOCATION"] == "redis://127.0.0.1:6379/3"
    for bad in ("memcached://h:11211", "127.0.0.1:6379", 6379):
        with pytest.raises(ImproperlyConfigured, match="redis:// or rediss:// URL"):
            cache_settings(bad)


def test_a_url_and_a_store_at_once_are_refused():
    from agentmemory import InvalidMemory, MemoryStore
    from agentmemory.integrations.adk import AgentMemorySessionService
    from agentmemory.integrations.openai_agents import AgentMemorySession

    with pytest.raises(InvalidMemory, match="db_url"):
        AgentMemorySession("s", "sqlite:///x.db", store=MemoryStore(cache=None))
    with pytest.raises(InvalidMemory, match="db_url"):
        AgentMemorySessionService(MemoryStore(cache=None), db_url="sqlite:///x.db")
