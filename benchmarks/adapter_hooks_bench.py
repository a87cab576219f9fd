"""CPU of the adapters' own hooks per LLM call, driven as each framework drives them, without the framework's call.

What an adapter adds to a call is its hooks' work plus what the framework does because a hook is there; on a
shared 2-core machine the whole call (`tracing_bench.py`, `adapter_cost_bench.py`) costs milliseconds that move by
tenths of a millisecond from run to run, so the hooks' share is measured here alone:

- ``openai_agents``: the Agents SDK's own trace and spans of one run (workflow, task, agent, turn, generation) made
  through ``agents.tracing``, our processor enabled vs disabled (the SDK's span objects cost the same both ways);
- ``langchain``: our callback handler's start and end of one chat model call (a real ``LLMResult``);
- ``litellm``: our LiteLLM callback's pre-call and success report of one call (a real ``ModelResponse``).

Each runs inside rollouts, its spans flushed into a `MemoryStore` inside the timed block (the span writer's
conversion and store writes counted). The openai client relay of the Agents SDK's and LangChain's calls is not
included (see ``openai`` in `tracing_bench.py` for the client hook). CPU per call: median and minimum of the block
means.

    .venv/bin/python benchmarks/adapter_hooks_bench.py [--blocks 20] [--block 100]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agentlightning.store import MemoryStore, RetryPolicy
from agentlightning.testing import start_attempts
from agentlightning.tracing import aflush, rollout_context

Step = Callable[[], None]


def agents_setup() -> tuple[Step, Callable[[bool], None]]:
    from agents.tracing import agent_span, custom_span, generation_span, trace

    from agentlightning_openai_agents import OpenAIAgentsAdapter

    adapter = OpenAIAgentsAdapter.default()

    def run() -> None:
        with (
            trace("Agent workflow"),
            custom_span("Agent workflow"),
            agent_span(name="bench"),
            custom_span("turn"),
            generation_span(model="toy") as generation,
        ):
            generation.span_data.usage = {"input_tokens": 3, "output_tokens": 1}

    def switch(on: bool) -> None:
        adapter.instrument() if on else adapter.uninstrument()

    return run, switch


def langchain_setup() -> tuple[Step, Callable[[bool], None]]:
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, LLMResult

    from agentlightning_langchain import LightningCallbackHandler

    handler = LightningCallbackHandler()
    usage: Any = {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}
    message = AIMessage(content="ok", response_metadata={"id": "chatcmpl-1", "model_name": "toy"}, usage_metadata=usage)
    result = LLMResult(generations=[[ChatGeneration(message=message)]], llm_output={"id": "chatcmpl-1"})
    params = {"model": "toy", "stream": False}
    metadata = {"ls_provider": "openai", "ls_model_name": "toy"}
    enabled = [False]

    def call() -> None:
        if not enabled[0]:  # not instrumented: LangChain calls no handler
            return
        run_id = uuid.uuid4()
        handler.on_chat_model_start({}, [[]], run_id=run_id, metadata=metadata, invocation_params=params)
        handler.on_llm_end(result, run_id=run_id)

    def switch(on: bool) -> None:
        enabled[0] = on

    return call, switch


def litellm_setup() -> tuple[Step, Callable[[bool], None]]:
    from litellm.types.utils import ModelResponse

    from agentlightning.adapters import LiteLLMAdapter

    adapter = LiteLLMAdapter.default()
    adapter.instrument()
    callback: Any = adapter._callback  # pyright: ignore[reportPrivateUsage] - the object LiteLLM calls
    adapter.uninstrument()
    response = ModelResponse(
        id="chatcmpl-1",
        model="toy",
        choices=[{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    )
    count = [0]

    def call() -> None:
        count[0] += 1
        kwargs = {"litellm_call_id": f"c{count[0]}", "model": "toy", "custom_llm_provider": "openai"}
        callback.log_pre_api_call("toy", [], kwargs)  # inline in the caller (its rollout context)
        now = dt.datetime.now()
        callback.log_success_event(kwargs, response, now, now)  # reported later, in the captured context

    def switch(on: bool) -> None:
        callback.enabled = on

    return call, switch


async def _block(store: MemoryStore, step: Step, n: int) -> float:
    attempts = await start_attempts(store, [f"r{time.monotonic_ns()}-{i}" for i in range(n)])
    c0 = time.process_time()
    for rollout_id, attempt_id in attempts.items():
        with rollout_context(store, rollout_id, attempt_id):
            step()
    await aflush()
    return (time.process_time() - c0) / n


async def bench(
    name: str, setup: Callable[[], tuple[Step, Callable[[bool], None]]], blocks: int, n: int
) -> dict[str, float]:
    step, switch = setup()
    store = MemoryStore(RetryPolicy(heartbeat_timeout=24 * 3600))  # attempts left running are never retried
    switch(True)
    await _block(store, step, 20)  # warm up
    on: list[float] = []
    off: list[float] = []
    for _ in range(blocks):
        switch(False)
        off.append(await _block(store, step, n))
        switch(True)
        on.append(await _block(store, step, n))
    switch(False)
    us = 1e6
    return {
        f"{name}_added_median_us": (statistics.median(on) - statistics.median(off)) * us,
        f"{name}_added_min_us": (min(on) - min(off)) * us,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20, help="alternating off/on block pairs")
    parser.add_argument("--block", type=int, default=100, help="calls per block")
    args = parser.parse_args()
    figures: dict[str, float] = {}
    names = {"openai_agents": agents_setup, "langchain": langchain_setup, "litellm": litellm_setup}
    for name, setup in names.items():
        figures.update(await bench(name, setup, args.blocks, args.block))
    print(f"{'adapter':>16}{'added median µs':>18}{'added min µs':>16}")
    for name in names:
        print(f"{name:>16}{figures[f'{name}_added_median_us']:>18.1f}{figures[f'{name}_added_min_us']:>16.1f}")
    print("(CPU per LLM call of the adapter's hooks alone, spans stored; goal: 100 µs.)")
    print(json.dumps({k: round(v, 1) for k, v in figures.items()}))


if __name__ == "__main__":
    asyncio.run(main())
