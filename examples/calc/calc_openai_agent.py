"""The calculator agent written with plain OpenAI SDK calls: no agent framework, the same task, tool and reward.

The same loop as ``calc_agent.py`` (the LangGraph graph) without LangGraph: ask the model with the calculator
offered as a tool, run the tool call it makes, ask again, score the final answer. The only Agent Lightning lines
are the ``@agl.rollout`` decorator and ``agl.llm_base_url()``; the runner's ``--instrument openai`` records the
client's calls. One ``AsyncOpenAI`` client is kept per base URL (a runner slot's URL does not change between
rollouts), as any long-running app keeps its client, and all of them share one connection pool of openai's aiohttp
backend (``DefaultAioHttpClient``: aiohttp parses HTTP in C where the default httpx backend parses it in Python, for
~0.3 ms less CPU per call) and one TLS context.
``benchmarks/e2e_overhead.py --agent openai`` uses it to measure the framework's own overhead without an agent
framework's CPU cost in the figure.

    python examples/calc/train.py --agent openai
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import weakref
from typing import Any

from calc_rules import MAX_LLM_CALLS, TOOLS, evaluate, prompt_messages, score_text
from openai import AsyncOpenAI, DefaultAioHttpClient

import agentlightning as agl

PROMPT: list[dict[str, Any]] = prompt_messages()
"""Messages before the question (a system prompt, a worked example) for a model that needs them (see calc_rules)."""


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client (each would otherwise load the system's certificates: ~20 ms of CPU)."""
    return ssl.create_default_context()


class _LoopClients:
    """The clients of one event loop: one aiohttp connection pool and one ``AsyncOpenAI`` per base URL on it.

    One pool for every slot: aiohttp keeps a host's idle connections in a queue (taking one costs the same with 64
    of them), where httpx's pool walked all its connections on every request (so the slots had one pool each).
    """

    def __init__(self) -> None:
        self.http = DefaultAioHttpClient(verify=_tls())
        self.openai: dict[tuple[str, str], AsyncOpenAI] = {}


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClients] = weakref.WeakKeyDictionary()

# A first client, built at import: it imports openai's HTTP stack and chat resources (~75 ms of CPU) and loads the
# TLS context, here, before `agl runner --processes` forks its runners, instead of once in each of them. It opens
# no connection (aiohttp's session is made on a first request) and is not used.
AsyncOpenAI(api_key="unused", http_client=DefaultAioHttpClient(verify=_tls())).chat.completions  # noqa: B018


def client_for(base_url: str, api_key: str) -> AsyncOpenAI:
    """The client for ``base_url`` on the running event loop, reused from one rollout to the next."""
    loop = asyncio.get_running_loop()
    clients = _CLIENTS.get(loop)
    if clients is None:
        clients = _CLIENTS[loop] = _LoopClients()
    client = clients.openai.get((base_url, api_key))
    if client is None:
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2, http_client=clients.http)
        clients.openai[(base_url, api_key)] = client
    return client


async def aclose_clients() -> None:
    """Close the running event loop's clients and their connections (an app calls it before its loop ends)."""
    clients = _CLIENTS.pop(asyncio.get_running_loop(), None)
    if clients is not None:
        await clients.http.aclose()


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
    messages: list[Any] = [*PROMPT, {"role": "user", "content": task["question"]}]
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
