"""What the agent remembers: a user's preferences (shared by every conversation, updated from
parallel tool calls) and a conversation's recent turns (forgotten an hour after the last one)."""

from __future__ import annotations

from typing import Any

from agentmemory import MemoryStore

CONVERSATION_TTL = 3600


class AgentMemory:
    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store or MemoryStore()

    def set_preference(self, user: str, name: str, value: Any) -> None:
        """Read-modify-write under the row lock: parallel tool calls never drop each other."""
        self.store.update(f"user:{user}", "preferences", lambda p: {**p, name: value}, default={})

    def preferences(self, user: str) -> dict[str, Any]:
        found = self.store.recall(f"user:{user}", "preferences")
        return found.value if found else {}

    def add_turn(self, conversation: str, text: str) -> None:
        """Append a turn; every turn gives the conversation another hour."""
        self.store.update(
            f"conversation:{conversation}",
            "turns",
            lambda turns: [*turns, text],
            default=[],
            ttl=CONVERSATION_TTL,
        )

    def turns(self, conversation: str) -> list[str]:
        found = self.store.recall(f"conversation:{conversation}", "turns")
        return found.value if found else []
