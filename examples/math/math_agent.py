"""The math agent: an ordinary AutoGen AgentChat assistant with a calculator tool, unaware of training.

The only Agent Lightning lines are the ``@agl.rollout`` decorator (so the runner can call it with a task and the
current resources) and ``agl.llm_base_url()`` (the per-rollout URL of the LLM proxy; in a deployed app it would be
configuration). Tracing comes from ``agentlightning_autogen.instrument()``, called once by the runner process
(``agl runner --app-dir examples/math --agent math_agent:math_agent --instrument autogen``).

An episode is: the question -> the model calls ``calculator`` (or answers at once) -> the tool's result -> the
model's final answer. ``reflect_on_tool_use=False`` with ``max_tool_iterations=2`` makes AutoGen send the tools
with every call (so each prompt extends the previous one) and stop after at most two tool rounds; a run that is
still calling tools then ends without a final answer and earns 0.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage, ToolCallRequestEvent
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agentlightning as agl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from math_task import evaluate_expression, score

AGENT_NAME = "solver"
SYSTEM_MESSAGE = "Use the calculator. Reply with the final number only."
"""Kept short on purpose: every prompt token is paid for on every call, and a tiny CPU model pays the most."""

MAX_TOOL_ITERATIONS = 2

MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.UNKNOWN,
    structured_output=False,
)
"""What the served model can do; AutoGen needs it for any model name it does not know (``math-tiny``, vLLM's)."""


async def calculator(expression: str) -> str:
    """Evaluate arithmetic."""
    value = evaluate_expression(expression)
    return "error" if value is None else str(value)


def build_agent(model_client: OpenAIChatCompletionClient) -> AssistantAgent:
    """The assistant: the calculator as its one tool, tool rounds bounded, no reflection call."""
    return AssistantAgent(
        AGENT_NAME,
        model_client=model_client,
        tools=[calculator],
        system_message=SYSTEM_MESSAGE,
        reflect_on_tool_use=False,
        max_tool_iterations=MAX_TOOL_ITERATIONS,
    )


def make_client(base_url: str, model: str, api_key: str | None, **sampling: Any) -> OpenAIChatCompletionClient:
    """AutoGen's OpenAI client for an OpenAI-compatible endpoint (the proxy, vLLM, ...)."""
    return OpenAIChatCompletionClient(
        model=model,
        base_url=base_url,
        api_key=api_key or "not-needed",
        model_info=MODEL_INFO,
        max_retries=2,
        **sampling,
    )


@dataclass
class Outcome:
    """What one run of the agent did.

    Attributes:
        final_text: The agent's final text answer, or ``None`` when it ended without one.
        expressions: The calculator expressions it asked for, in order.
    """

    final_text: str | None
    expressions: list[str] = field(default_factory=lambda: [])

    @property
    def used_tool(self) -> bool:
        """Whether the agent called the calculator at least once."""
        return bool(self.expressions)


async def solve(question: str, model_client: OpenAIChatCompletionClient) -> Outcome:
    """Run the assistant on one question."""
    result = await build_agent(model_client).run(task=question)
    last = result.messages[-1] if result.messages else None
    final = last.content if isinstance(last, TextMessage) and last.source == AGENT_NAME else None
    expressions: list[str] = []
    for message in result.messages:
        if isinstance(message, ToolCallRequestEvent):
            for call in message.content:
                expressions.append(call.arguments)
    return Outcome(final, expressions)


@agl.rollout
async def math_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """Answer ``task["question"]``; reward 1.0 when the final answer's number equals ``task["answer"]``, else 0."""
    llm = resources.llm
    assert llm is not None, "the trainer publishes an LLM resource"
    client = make_client(agl.llm_base_url(), llm.model, llm.api_key, **llm.sampling_parameters)
    try:
        outcome = await solve(str(task["question"]), client)
    finally:
        await client.close()
    return score(outcome.final_text, str(task["answer"]))
