"""A chat client for Microsoft Agent Framework that answers from a script: an agent's tests (and
the docs' examples) run the framework's own ``Agent`` with it, reaching no network::

    from agent_framework import Agent
    from agentmemory.testing.agent_framework import ScriptedChatClient

    client = ScriptedChatClient(["Hi! I'm the agent.", "You said your name is Ada."])
    agent = Agent(client=client, instructions="Be brief.")

Needs the ``agent-framework`` extra. Streaming is not scripted."""

from __future__ import annotations

from typing import Any

from agent_framework import BaseChatClient, ChatResponse, Message


class ScriptedChatClient(BaseChatClient):
    """Answers each call with the next of ``replies`` and records what it was given:
    ``inputs`` (the messages of each call) and ``instructions`` (each call's system
    instructions, as the framework passed them in its options)."""

    def __init__(self, replies: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.replies = list(replies)
        self.inputs: list[list[Message]] = []
        self.instructions: list[Any] = []

    async def _inner_get_response(
        self, *, messages: Any, stream: bool, options: Any, **kwargs: Any
    ) -> Any:
        if stream:
            raise NotImplementedError("ScriptedChatClient does not stream")
        self.inputs.append(list(messages))
        self.instructions.append((options or {}).get("instructions"))
        if not self.replies:
            raise AssertionError(f"the script has no reply left for call {len(self.inputs)}")
        text = self.replies.pop(0)
        return ChatResponse(
            messages=[Message(role="assistant", contents=[text])],
            response_id=f"scripted-{len(self.inputs)}",
        )
