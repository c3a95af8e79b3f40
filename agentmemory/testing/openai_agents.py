"""A model for the OpenAI Agents SDK that answers from a script: an agent's tests (and the docs'
examples) run the SDK's own ``Runner`` with it, reaching no network::

    from agents import Agent, Runner
    from agentmemory.testing.openai_agents import ScriptedModel

    model = ScriptedModel(["Hi! I'm the agent.", "You said your name is Ada."])
    agent = Agent(name="assistant", instructions="Be brief.", model=model)

Needs the ``openai-agents`` extra. Streaming is not scripted."""

from __future__ import annotations

from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText


class ScriptedModel(Model):
    """Answers each turn with the next of ``replies`` and records the input it was given
    (``inputs``: one list of items per turn)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.inputs: list[Any] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.inputs.append(input)
        if not self.replies:
            raise AssertionError(f"the script has no reply left for turn {len(self.inputs)}")
        text = self.replies.pop(0)
        message = ResponseOutputMessage(
            id=f"msg_{len(self.inputs)}",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ScriptedModel answers without streaming")
