"""The calculator agent written with plain OpenAI SDK calls: no agent framework, the same task, tool and reward.

The same loop as ``calc_agent.py`` (the LangGraph graph) without LangGraph: ask the model with the calculator
offered as a tool, run the tool call it makes, ask again, score the final answer. The only Agent Lightning lines
are the ``@agl.rollout`` decorator and ``agl.llm_base_url()``; the runner's ``--instrument openai`` records the
client's calls. One ``AsyncOpenAI`` client is kept per base URL (a runner slot's URL does not change between
rollouts), as any long-running app keeps its client, and all of them share one HTTP connection pool.
``benchmarks/e2e_overhead.py --agent openai`` uses it to measure the framework's own overhead without an agent
framework's CPU cost in the figure.

    python examples/calc/train.py --agent openai
"""

from __future__ import annotations

import functools
import json
from typing import Any

from calc_rules import MAX_LLM_CALLS, evaluate, score_text
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

import agentlightning as agl

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression made of integers, + - * and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


@functools.cache
def _http_pool() -> DefaultAsyncHttpxClient:
    """One HTTP connection pool for every slot's client (each client would otherwise build its own, TLS context
    included: ~20 ms of CPU apiece, 64 times per runner process)."""
    return DefaultAsyncHttpxClient()


@functools.lru_cache(maxsize=1024)
def client_for(base_url: str, api_key: str) -> AsyncOpenAI:
    """One client per base URL, all on one HTTP connection pool reused from one rollout to the next."""
    return AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2, http_client=_http_pool())


def run_tool(arguments: str) -> str:
    """The calculator on a tool call's JSON arguments ("E" for arguments it cannot use, as the tool says)."""
    try:
        expression = json.loads(arguments).get("expression")
    except (ValueError, AttributeError):
        return "E"
    return evaluate(expression) if isinstance(expression, str) else "E"


@agl.rollout
async def calc_openai_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """Answer ``task["question"]`` (e.g. ``Q:37*48+12=``) with at most ``MAX_LLM_CALLS`` calls; reward as the graph."""
    llm = resources.llm
    assert llm is not None, "the trainer publishes an LLM resource"
    client = client_for(agl.llm_base_url(), llm.api_key or "not-needed")
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    for _ in range(MAX_LLM_CALLS):
        response = await client.chat.completions.create(
            model=llm.model, messages=messages, tools=TOOLS, **llm.sampling_parameters
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return score_text(message.content or "", int(task["answer"]))
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = run_tool(call.function.arguments) if call.function.name == "calculator" else "E"  # pyright: ignore[reportAttributeAccessIssue]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return -0.1  # still wanted the tool when the call budget ran out
