"""Per-rollout cost of an ordinary LangGraph agent: its runner slot's URL vs a per-rollout URL.

langchain-openai caches its httpx clients per base URL. With a new URL per rollout it builds new clients (TLS
context and connection pool included) for every rollout; the runner slot's URL (what ``agl.llm_base_url()`` returns
under a runner) stays the same, so the cache works. This runs the quickstart's own agent
(``examples/calc/calc_agent.py``: LangGraph, ``ChatOpenAI`` built per rollout, no shared client) under ``agl.Runner``,
instrumented as ``agl runner --instrument langchain`` does, against a scripted model behind the LLM proxy on
loopback (two LLM calls and one tool call per rollout), in three ways:

- ``slot URL``: the agent as written (``base_url=agl.llm_base_url()``);
- ``per-rollout URL``: the same agent given ``.../rollout/{id}/attempt/{id}/v1`` instead;
- ``per-rollout URL + shared clients``: the workaround the quickstart used to carry (one httpx client pair per
  process passed to ``ChatOpenAI``).

Prints wall and CPU seconds per rollout (one worker, rollouts one after another; the proxy and the scripted model
run in this process too, the same for all three) and ends with one JSON line.

    .venv/bin/python benchmarks/slot_url_bench.py --rollouts 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import openai
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI

import agentlightning as agl
from agentlightning.proxy import LLMProxy, rollout_base_url
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, ScriptedReply
from agentlightning.tracing import current_rollout

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "calc"))
from calc_agent import GRAPH, calc_agent, score  # pyright: ignore[reportMissingImports]  # the quickstart agent

TOKEN = "bench-token-0123456789"


def _reply(body: dict[str, Any]) -> ScriptedReply:
    """First call: the calculator tool; second call (a tool result is in the messages): the answer."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return ScriptedReply(content=f"A:{messages[-1]['content']}")
    expression = str(messages[-1]["content"]).removeprefix("Q:").removesuffix("=")
    return ScriptedReply(tool_calls=[{"name": "calculator", "arguments": {"expression": expression}}])


@cache
def _shared_clients() -> tuple[Any, Any]:
    return openai.DefaultHttpxClient(), openai.DefaultAsyncHttpxClient()


async def _per_rollout_agent(task: dict[str, Any], resources: agl.Resources, shared: bool) -> float:
    """``calc_agent`` with the per-rollout URL (and, with ``shared``, the old shared-client workaround)."""
    llm_resource, ctx = resources.llm, current_rollout()
    assert llm_resource is not None and ctx is not None
    clients = {"http_client": _shared_clients()[0], "http_async_client": _shared_clients()[1]} if shared else {}
    llm = ChatOpenAI(
        model=llm_resource.model,
        base_url=rollout_base_url(llm_resource.endpoint, ctx.rollout_id, ctx.attempt_id),
        api_key=llm_resource.api_key or "not-needed",  # pyright: ignore[reportArgumentType]
        max_retries=2,
        **clients,
        **llm_resource.sampling_parameters,
    )
    result = await GRAPH.ainvoke({"messages": [HumanMessage(task["question"])]}, {"configurable": {"llm": llm}})
    return score(result["messages"][-1], int(task["answer"]))


@agl.rollout
async def per_rollout_url(task: dict[str, Any], resources: agl.Resources) -> float:
    """The calculator agent on the per-rollout URL, no shared client."""
    return await _per_rollout_agent(task, resources, shared=False)


@agl.rollout
async def per_rollout_url_shared_clients(task: dict[str, Any], resources: agl.Resources) -> float:
    """The calculator agent on the per-rollout URL with the old shared-client workaround."""
    return await _per_rollout_agent(task, resources, shared=True)


async def _measure(agent: Any, n: int, backend: str) -> dict[str, float]:
    store = MemoryStore(retry_policy=agl.RetryPolicy(max_attempts=1))
    proxy = LLMProxy(store, [backend], token=TOKEN)
    await proxy.start()
    try:
        llm = proxy.llm_resource("toy", sampling_parameters={"temperature": 1})  # runners register slots with it
        await store.add_resources(agl.Resources(resources_id="r", items={"llm": llm}))
        tasks = [{"question": f"Q:{i}*{i + 7}+3=", "answer": i * (i + 7) + 3} for i in range(n)]
        for task in tasks:
            await store.enqueue_rollout(task)
        wall, cpu = time.perf_counter(), time.process_time()
        await agl.Runner(agent, store, n_workers=1, worker_mode="async", stop_when_idle=True).arun()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        done = await store.query_rollouts(status=["succeeded"])
        if len(done) != n:
            raise RuntimeError(f"expected {n} succeeded rollouts, got {len(done)}")
        for rollout in done[:: max(n // 10, 1)]:  # a sample: each rollout's two calls were recorded under it
            calls = await store.query_llm_calls(rollout.rollout_id)
            if len(calls) != 2:
                raise RuntimeError(f"rollout {rollout.rollout_id}: expected 2 recorded LLM calls, got {len(calls)}")
    finally:
        await proxy.stop()
    return {"wall_s_per_rollout": wall / n, "cpu_s_per_rollout": cpu / n}


async def _run(n: int, repeats: int) -> dict[str, dict[str, float]]:
    from agentlightning_langchain import instrument

    instrument()
    variants = {
        "slot URL (agent as written)": calc_agent,
        "per-rollout URL": per_rollout_url,
        "per-rollout URL + shared clients": per_rollout_url_shared_clients,
    }
    best: dict[str, dict[str, float]] = {}
    with ScriptedModelServer(_reply) as backend:
        await _measure(calc_agent, 5, backend.url)  # warm imports and the first client
        for _ in range(repeats):  # interleaved, best of: the machine is shared
            for name, agent in variants.items():
                figures = await _measure(agent, n, backend.url)
                if name not in best or figures["cpu_s_per_rollout"] < best[name]["cpu_s_per_rollout"]:
                    best[name] = figures
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many interleaved runs per variant")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    best = asyncio.run(_run(args.rollouts, args.repeats))
    print(f"{'':36}{'wall s/rollout':>16}{'CPU s/rollout':>16}")
    for name, figures in best.items():
        print(f"{name:36}{figures['wall_s_per_rollout']:>16.4f}{figures['cpu_s_per_rollout']:>16.4f}")
    print(
        json.dumps({"rollouts": args.rollouts, **{k: {m: round(v, 4) for m, v in f.items()} for k, f in best.items()}})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
