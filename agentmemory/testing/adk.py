"""A model for Google ADK that answers from a script: an agent's tests (and the docs' examples)
run ADK's own ``Runner`` with it, reaching no network::

    from google.adk.agents import LlmAgent
    from agentmemory.testing.adk import ScriptedLlm

    model = ScriptedLlm(replies=["Hello Ada.", "Your name is Ada."])
    agent = LlmAgent(name="assistant", model=model, instruction="Be brief.")

Needs the ``adk`` extra."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.genai import types


class ScriptedLlm(BaseLlm):
    """Answers each turn with the next of ``replies`` and records the conversation it was given
    (``seen``: per turn, the texts of the request's contents)."""

    model: str = "scripted"
    replies: list[str] = []
    seen: list[list[str]] = []

    async def generate_content_async(
        self, llm_request: Any, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append(
            [part.text for content in llm_request.contents for part in content.parts if part.text]
        )
        if not self.replies:
            raise AssertionError(f"the script has no reply left for turn {len(self.seen)}")
        text = self.replies.pop(0)
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
