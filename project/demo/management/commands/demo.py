"""``manage.py demo``: a superuser and a few agent memories with histories, to look around the
admin in a minute (``make demo`` runs it, then the development server)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from agentmemory import MemoryStore


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
        self.stdout.write(
            f"demo ready: http://127.0.0.1:8000/admin/agentmemory/memory/ "
            f"(user {options['username']!r}"
            + (f", password {options['password']!r})" if created else ", password unchanged)")
        )
