"""``manage.py demo``: a superuser and a record of every kind the admin shows -- memories with
histories, a log, an OpenAI Agents SDK session, an ADK session with events, a LangGraph thread
with checkpoints and pending writes -- to look around the admin in a minute (``make demo`` runs
it, then the development server). A framework that is not installed is left out, and said."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from agentmemory import MemoryStore


class Plan(TypedDict):
    """The demo LangGraph thread's state."""

    steps: Annotated[list, operator.add]


class Command(BaseCommand):
    help = "Create the demo superuser and sample memories (idempotent: run it again any time)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=options["username"], defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(options["password"])
            user.save()
        store = MemoryStore()
        if store.recall("demo-agent-1", "preferences") is None:
            store.remember("demo-agent-1", "preferences", {"language": "en", "tone": "casual"})
            store.update(
                "demo-agent-1", "preferences", lambda p: {**p, "tone": "formal"}, default={}
            )
            store.update("demo-agent-1", "preferences", lambda p: {**p, "language": "fr"})
            for turn in ("Book a flight to Lyon", "Prefer the morning", "Window seat"):
                store.update(
                    "demo-agent-1", "conversation", lambda t, x=turn: [*t, x], default=[], ttl=3600
                )
            store.remember("demo-agent-2", "profile", {"name": "Ada", "timezone": "Europe/Paris"})
            store.remember("demo-agent-2", "scratchpad", {"draft": "to be forgotten"})
            store.forget("demo-agent-2", "scratchpad")
            store.remember("demo-agent-3", "otp-session", {"step": 2}, ttl=1)
            store.append("demo-agent-1", "tool-calls", [{"tool": "search_flights", "to": "LYS"}])
            store.append("demo-agent-1", "tool-calls", [{"tool": "hold_seat", "seat": "12A"}])
            store.pop("demo-agent-1", "tool-calls")
            for seeded in (self._sdk_session, self._adk_session, self._langgraph_thread):
                try:
                    seeded()
                except ImportError as missing:
                    self.stdout.write(f"demo: {seeded.__doc__} left out ({missing.name} missing)")
        self.stdout.write(
            f"demo ready: http://127.0.0.1:8000/admin/agentmemory/memory/ "
            f"(user {options['username']!r}"
            + (f", password {options['password']!r})" if created else ", password unchanged)")
        )

    def _sdk_session(self) -> None:
        """an OpenAI Agents SDK session"""
        from agentmemory.integrations.openai_agents import AgentMemorySession

        session = AgentMemorySession("demo-agent-1")
        turns = [
            {"role": "user", "content": "Book me a flight to Lyon on Friday."},
            {"role": "assistant", "content": "The 7:05 or the 9:40? Both have window seats."},
            {"role": "user", "content": "The 7:05, window seat please."},
        ]
        async_to_sync(session.add_items)(turns)

    def _adk_session(self) -> None:
        """an ADK session with events"""
        from google.adk.events.event import Event
        from google.adk.events.event_actions import EventActions
        from google.genai import types

        from agentmemory.integrations.adk import AgentMemorySessionService

        service = AgentMemorySessionService()

        async def seed() -> None:
            session = await service.create_session(
                app_name="demo-app", user_id="ada", state={"user:tone": "brief"}
            )
            for author, text, delta in (
                ("user", "What is the weather in Lyon?", {}),
                ("assistant", "Sunny, 21 degrees.", {"last_city": "Lyon"}),
            ):
                said = types.Content(role=author, parts=[types.Part(text=text)])
                await service.append_event(
                    session,
                    Event(
                        author=author,
                        invocation_id="demo-1",
                        content=said,
                        actions=EventActions(state_delta=delta),
                    ),
                )

        async_to_sync(seed)()

    def _langgraph_thread(self) -> None:
        """a LangGraph thread"""
        from langgraph.graph import END, START, StateGraph

        from agentmemory.integrations.langgraph import AgentMemorySaver

        builder = StateGraph(Plan)
        builder.add_node("search", lambda state: {"steps": ["searched flights"]})
        builder.add_node("book", lambda state: {"steps": ["booked 7:05, seat 12A"]})
        builder.add_edge(START, "search")
        builder.add_edge("search", "book")
        builder.add_edge("book", END)
        graph = builder.compile(checkpointer=AgentMemorySaver(), interrupt_before=["book"])
        config = {"configurable": {"thread_id": "demo-trip"}}
        graph.invoke({"steps": ["asked for a flight"]}, config)  # paused before "book"
