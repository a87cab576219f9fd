"""CPU each adapter adds per LLM call, with the model answered in-process (no sockets, no server thread).

`tracing_bench.py` times real HTTP calls to a model server in the same process: on a shared, loaded 2-core machine
its per-call figures move by a few tenths of a millisecond from run to run, as much as what the adapters add. Here
the framework's own openai client gets its answer from an in-process transport (``httpx2.MockTransport``; LiteLLM
through its ``mock_response``), so a call costs a fraction of a millisecond of CPU and the adapter's share stands
out. Everything else is the real thing: the real framework (LangChain's ``ChatOpenAI``, the Agents SDK's
``Runner.run``, ``litellm.acompletion``), the real openai client and our real hooks, spans written to a
`MemoryStore` inside rollouts.

Blocks of untraced and traced calls alternate; each block is timed as a whole, its spans flushed into the store
inside the timed region (so the span writer's conversion and store writes are counted). CPU is this process's. The
figures: per side the median and the minimum of the block means (the minimum: the block least disturbed by other
processes), and added = traced - untraced for both.

    .venv/bin/python benchmarks/adapter_cost_bench.py [--blocks 20] [--block 25] [--only openai langchain ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agentlightning.adapters import Adapter, OpenAIAdapter
from agentlightning.store import MemoryStore, RetryPolicy
from agentlightning.testing import start_attempts
from agentlightning.tracing import aflush, rollout_context

Call = Callable[[], Awaitable[Any]]
_URL = "http://model.invalid/v1"  # never resolved: the transport answers

_ANSWER = {
    "object": "chat.completion",
    "created": 1,
    "model": "toy",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def _http() -> Any:
    """An HTTP client of the openai SDK answered in-process (a fresh response id per call, as a server gives)."""
    import httpx2

    count = [0]

    def answer(request: Any) -> Any:
        count[0] += 1
        return httpx2.Response(200, json={"id": f"chatcmpl-{count[0]}", **_ANSWER})

    return httpx2.AsyncClient(transport=httpx2.MockTransport(answer))


def _client() -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=_URL, api_key="b", http_client=_http())


def make_openai() -> tuple[Adapter, Call]:
    client = _client()
    return OpenAIAdapter.default(), lambda: client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "hi"}]
    )


def make_langchain() -> tuple[Adapter, Call]:
    from langchain_openai import ChatOpenAI

    from agentlightning_langchain import LangChainAdapter

    llm = ChatOpenAI(model="toy", api_key="b", base_url=_URL, http_async_client=_http())  # type: ignore[arg-type]
    return LangChainAdapter.default(), lambda: llm.ainvoke("hi")


def make_openai_agents() -> tuple[Adapter, Call]:
    from agents import Agent, OpenAIChatCompletionsModel, Runner

    from agentlightning_openai_agents import OpenAIAgentsAdapter

    model = OpenAIChatCompletionsModel(model="toy", openai_client=_client())
    agent = Agent(name="bench", instructions="answer", model=model)
    adapter = OpenAIAgentsAdapter.default()
    adapter.instrument()  # the processor replaces OpenAI's trace upload once; untraced runs then disable it
    adapter.uninstrument()
    return adapter, lambda: Runner.run(agent, "hi")


def make_litellm() -> tuple[Adapter, Call]:
    import litellm

    from agentlightning.adapters import LiteLLMAdapter

    return LiteLLMAdapter.default(), lambda: litellm.acompletion(
        model="openai/toy", api_key="b", messages=[{"role": "user", "content": "hi"}], mock_response="ok"
    )


async def _block(call: Call, n: int, adapter: Adapter, store: MemoryStore | None) -> float:
    """CPU seconds per call of ``n`` calls (inside rollouts when ``store`` is given), spans flushed."""
    attempts = await start_attempts(store, [f"r{time.monotonic_ns()}-{i}" for i in range(n)]) if store else {}
    c0 = time.process_time()
    if store is None:
        for _ in range(n):
            await call()
    else:
        for rollout_id, attempt_id in attempts.items():
            with rollout_context(store, rollout_id, attempt_id):
                await call()
    await adapter.adrain()
    await aflush()
    return (time.process_time() - c0) / n


async def bench(name: str, factory: Callable[[], tuple[Adapter, Call]], blocks: int, block: int) -> dict[str, float]:
    adapter, call = factory()
    store = MemoryStore(RetryPolicy(heartbeat_timeout=24 * 3600))  # attempts left running are never retried
    await _block(call, 10, adapter, None)  # warm up both paths
    adapter.instrument()
    await _block(call, 10, adapter, store)
    adapter.uninstrument()
    untraced: list[float] = []
    traced: list[float] = []
    for _ in range(blocks):
        untraced.append(await _block(call, block, adapter, None))
        adapter.instrument()
        traced.append(await _block(call, block, adapter, store))
        adapter.uninstrument()
    us = 1e6
    out = {
        f"{name}_untraced_median_us": statistics.median(untraced) * us,
        f"{name}_traced_median_us": statistics.median(traced) * us,
        f"{name}_untraced_min_us": min(untraced) * us,
        f"{name}_traced_min_us": min(traced) * us,
    }
    out[f"{name}_added_median_us"] = out[f"{name}_traced_median_us"] - out[f"{name}_untraced_median_us"]
    out[f"{name}_added_min_us"] = out[f"{name}_traced_min_us"] - out[f"{name}_untraced_min_us"]
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20, help="alternating untraced/traced block pairs")
    parser.add_argument("--block", type=int, default=25, help="calls per block")
    parser.add_argument("--only", nargs="*", default=None, help="adapters to run")
    args = parser.parse_args()
    factories = {
        "openai": make_openai,
        "langchain": make_langchain,
        "openai_agents": make_openai_agents,
        "litellm": make_litellm,
    }
    figures: dict[str, float] = {"calls_per_block": float(args.block), "blocks": float(args.blocks)}
    rows: list[str] = []
    for name, factory in factories.items():
        if args.only and name not in args.only:
            continue
        figures.update(await bench(name, factory, args.blocks, args.block))
        rows.append(name)
    keys = ["untraced_median", "traced_median", "added_median", "added_min"]
    print(f"{'adapter':>16}" + "".join(f"{k.replace('_', ' ') + ' µs':>18}" for k in keys))
    for name in rows:
        print(f"{name:>16}" + "".join(f"{figures[f'{name}_{k}_us']:>18.1f}" for k in keys))
    print("(CPU per call of this process; the model answers in-process. Goal: 100 µs added per call.)")
    print(json.dumps({k: round(v, 1) for k, v in figures.items()}))


if __name__ == "__main__":
    asyncio.run(main())
