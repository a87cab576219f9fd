"""Time each adapter adds per LLM call: the same agent call traced vs untraced against one local model server.

Every adapter runs a one-LLM-call agent of its framework against the same `ScriptedModelServer` on 127.0.0.1
(no proxy, so only the adapter's cost differs). Untraced: the adapter is not instrumented. Traced: instrumented,
inside a rollout context writing to a MemoryStore. Blocks of untraced and traced calls alternate to cancel
drift; AutoGen runs last because instrumenting it makes Agent Lightning's tracer provider global for good.
``openai_stream`` is the plain openai client again, streaming a 50-chunk answer.

Span sources (``src_*`` rows): the app's own GenAI instrumentation read as our spans. Traced: their instrumentor
instrumented (OpenLLMetry's OpenAI / LangChain / OpenAI Agents instrumentation, OpenTelemetry's openai-v2) and our
`SpanSource` for it in use; untraced: neither. Compare each with our own hook's row for the same call (``openai``,
``langchain``, ``openai_agents``) of the same run. Their ``uninstrument()`` leaves wrappers behind in these
versions, so every attribute their ``instrument()`` patched is put back after each traced block (`SourceToggle`).

CPU figures count the whole process (the in-process model server too, the same both ways): on a shared, loaded
machine they are steadier than wall time, but still read them as rough figures and compare runs made together.
Two estimates of the CPU added per call: the difference of the per-call medians (``cpu added``), and
``blocks added``: the median over alternation rounds of (traced block mean - untraced block mean), each block's
closing span flush included; it counts the span writer's work that lands in a minority of calls (which a median
leaves out) and cancels drift between rounds; ``blocks q1``/``q3`` show its spread. On a loaded 2-core machine
either moves by a few tenths of a millisecond between runs of 200 calls: run ``--calls 1000`` or more.

Prints a table, then one JSON line with every figure (milliseconds).

    .venv/bin/python benchmarks/tracing_bench.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agentlightning.adapters import Adapter, OpenAIAdapter
from agentlightning.store import MemoryStore, RetryPolicy
from agentlightning.testing import ScriptedModelServer, start_attempts
from agentlightning.tracing import aflush, rollout_context

Call = Callable[[], Awaitable[Any]]


def make_openai(url: str) -> tuple[Adapter, Call]:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="b")
    return OpenAIAdapter.default(), lambda: client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "hi"}]
    )


def make_openai_stream(url: str) -> tuple[Adapter, Call]:
    """A streamed call: the echo server answers the 200-character prompt in 50 chunks."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="b")
    prompt = "stream " * 28 + "end"

    async def call() -> Any:
        stream = await client.chat.completions.create(
            model="toy", messages=[{"role": "user", "content": prompt}], stream=True
        )
        async for _ in stream:
            pass

    return OpenAIAdapter.default(), call


def make_langchain(url: str) -> tuple[Adapter, Call]:
    from langchain_openai import ChatOpenAI

    from agentlightning_langchain import LangChainAdapter

    llm = ChatOpenAI(base_url=url, api_key="b", model="toy")
    return LangChainAdapter.default(), lambda: llm.ainvoke("hi")


def make_openai_agents(url: str) -> tuple[Adapter, Call]:
    from agents import Agent, OpenAIChatCompletionsModel, Runner
    from openai import AsyncOpenAI

    from agentlightning_openai_agents import OpenAIAgentsAdapter

    model = OpenAIChatCompletionsModel(model="toy", openai_client=AsyncOpenAI(base_url=url, api_key="b"))
    agent = Agent(name="bench", instructions="answer", model=model)
    adapter = OpenAIAgentsAdapter.default()
    adapter.instrument()  # the processor replaces OpenAI's trace upload once; untraced runs then disable it
    adapter.uninstrument()
    return adapter, lambda: Runner.run(agent, "hi")


def make_litellm(url: str) -> tuple[Adapter, Call]:
    import litellm

    from agentlightning.adapters import LiteLLMAdapter

    return LiteLLMAdapter.default(), lambda: litellm.acompletion(
        model="openai/toy", api_base=url, api_key="b", messages=[{"role": "user", "content": "hi"}]
    )


def make_autogen(url: str) -> tuple[Adapter, Call]:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    from agentlightning_autogen import AutoGenAdapter

    info: Any = {
        "vision": False,
        "function_calling": True,
        "json_output": False,
        "family": "unknown",
        "structured_output": False,
    }
    client = OpenAIChatCompletionClient(model="toy", base_url=url, api_key="b", model_info=info)

    async def call() -> Any:
        return await AssistantAgent("bench", model_client=client).run(task="hi")

    return AutoGenAdapter.default(), call


_MISSING = object()


class SourceToggle:
    """Their instrumentor + our span source, switched on and off as one adapter (fully undone when off)."""

    def __init__(self, instrumentor: Any, source: Any) -> None:
        self.instrumentor = instrumentor
        self.source = source
        self.patched: list[tuple[Any, str, Any]] = []

    def instrument(self) -> None:
        import wrapt.patches

        apply_patch = wrapt.patches.apply_patch

        def recording(parent: Any, attribute: str, replacement: Any) -> Any:
            self.patched.append((parent, attribute, vars(parent).get(attribute, _MISSING)))
            return apply_patch(parent, attribute, replacement)

        wrapt.patches.apply_patch = recording
        try:
            self.instrumentor().instrument()
        finally:
            wrapt.patches.apply_patch = apply_patch
        self.source.default().instrument()

    def uninstrument(self) -> None:
        from agents import set_trace_processors

        self.source.default().uninstrument()
        self.instrumentor().uninstrument()
        for parent, attribute, prior in reversed(self.patched):
            if prior is _MISSING:
                delattr(parent, attribute)
            else:
                setattr(parent, attribute, prior)
        self.patched.clear()
        set_trace_processors([])  # the Agents SDK instrumentation leaves its processor registered

    async def adrain(self) -> bool:
        return True


def source_factory(make: Callable[[str], tuple[Adapter, Call]], module: str, instrumentor: str, source: str) -> Any:
    """A bench factory: the call of ``make`` with their instrumentation + our span source as the adapter."""

    def factory(url: str) -> tuple[Any, Call]:
        import importlib

        import agentlightning.adapters as adapters

        _, call = make(url)
        return SourceToggle(getattr(importlib.import_module(module), instrumentor), getattr(adapters, source)), call

    return factory


async def timed(
    call: Call, n: int, traced: bool, store: MemoryStore, adapter: Adapter
) -> tuple[list[tuple[float, float]], float]:
    """(wall, cpu) seconds per call, and the CPU seconds of the block's closing drain and flush.

    cpu is this process's CPU time (server thread included, same both ways), which other processes on a shared
    machine disturb far less than wall time. The span writer's batched store writes happen after the timed call
    and are counted through the CPU time of the following calls; the block's last batch is written by the closing
    flush, whose CPU is returned apart (the block-mean figures add it, the per-call medians cannot)."""
    out: list[tuple[float, float]] = []
    attempts = await start_attempts(store, [f"r{time.monotonic_ns()}-{i}" for i in range(n)]) if traced else {}
    for rollout_id, attempt_id in attempts.items() if traced else [("", "")] * n:
        if traced:
            with rollout_context(store, rollout_id, attempt_id):
                t0, c0 = time.perf_counter(), time.process_time()
                await call()
                out.append((time.perf_counter() - t0, time.process_time() - c0))
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            await call()
            out.append((time.perf_counter() - t0, time.process_time() - c0))
    c0 = time.process_time()
    await adapter.adrain()
    await aflush()
    return out, time.process_time() - c0


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def bench(
    name: str, factory: Callable[[str], tuple[Adapter, Call]], url: str, calls: int, block: int
) -> dict[str, float]:
    adapter, call = factory(url)
    store = MemoryStore(RetryPolicy(heartbeat_timeout=24 * 3600))  # attempts left running are never retried
    for _ in range(10):  # warm up both paths
        await call()
    adapter.instrument()
    await timed(call, 10, True, store, adapter)
    adapter.uninstrument()
    untraced: list[tuple[float, float]] = []
    traced: list[tuple[float, float]] = []
    pairs: list[float] = []  # traced - untraced CPU per call, block means of one alternation round
    while len(traced) < calls:
        off, off_flush = await timed(call, block, False, store, adapter)
        adapter.instrument()
        on, on_flush = await timed(call, block, True, store, adapter)
        adapter.uninstrument()
        untraced += off
        traced += on
        pairs.append((sum(x[1] for x in on) + on_flush) / len(on) - (sum(x[1] for x in off) + off_flush) / len(off))
    out: dict[str, float] = {}
    for which, index in (("wall", 0), ("cpu", 1)):
        u = [x[index] for x in untraced]
        t = [x[index] for x in traced]
        out[f"{name}_{which}_untraced_median_ms"] = p(u, 0.5)
        out[f"{name}_{which}_traced_median_ms"] = p(t, 0.5)
        out[f"{name}_{which}_added_median_ms"] = p(t, 0.5) - p(u, 0.5)
        out[f"{name}_{which}_added_p90_ms"] = p(t, 0.9) - p(u, 0.9)
    out[f"{name}_cpu_added_blocks_ms"] = p(pairs, 0.5)
    out[f"{name}_cpu_added_blocks_q1_ms"] = p(pairs, 0.25)
    out[f"{name}_cpu_added_blocks_q3_ms"] = p(pairs, 0.75)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="traced calls per adapter (and as many untraced)")
    parser.add_argument("--block", type=int, default=25, help="calls per alternating block")
    parser.add_argument("--only", nargs="*", default=None, help="adapters to run")
    args = parser.parse_args()
    factories = {
        "openai": make_openai,
        "openai_stream": make_openai_stream,
        "langchain": make_langchain,
        "openai_agents": make_openai_agents,
        "litellm": make_litellm,
        # their instrumentation + our span source, against our own hook's row of the same call above
        "src_openllmetry_openai": source_factory(
            make_openai, "opentelemetry.instrumentation.openai", "OpenAIInstrumentor", "OpenLLMetryOpenAISource"
        ),
        "src_otel_openai_v2": source_factory(
            make_openai, "opentelemetry.instrumentation.openai_v2", "OpenAIInstrumentor", "OpenAIV2Source"
        ),
        "src_openllmetry_langchain": source_factory(
            make_langchain, "opentelemetry.instrumentation.langchain", "LangchainInstrumentor",
            "OpenLLMetryLangChainSource",
        ),
        "src_openllmetry_openai_agents": source_factory(
            make_openai_agents, "opentelemetry.instrumentation.openai_agents", "OpenAIAgentsInstrumentor",
            "OpenLLMetryAgentsSource",
        ),
        "autogen": make_autogen,  # last: instrumenting it makes our provider global
    }  # fmt: skip
    figures: dict[str, float] = {"calls_per_adapter": float(args.calls)}
    rows: list[tuple[str, dict[str, float]]] = []
    with ScriptedModelServer() as server:
        for name, factory in factories.items():
            if args.only and name not in args.only:
                continue
            result = await bench(name, factory, server.base_url, args.calls, args.block)
            figures.update(result)
            rows.append((name, result))
    head = ["adapter/source", "cpu untraced", "cpu traced", "cpu added", "cpu add p90", "wall added", "wall add p90"]
    head += ["blocks added", "blocks q1", "blocks q3"]
    print(f"{head[0]:>30}" + "".join(f"{h:>14}" for h in head[1:]))
    for name, r in rows:
        keys = [
            "cpu_untraced_median",
            "cpu_traced_median",
            "cpu_added_median",
            "cpu_added_p90",
            "wall_added_median",
            "wall_added_p90",
            "cpu_added_blocks",
            "cpu_added_blocks_q1",
            "cpu_added_blocks_q3",
        ]
        print(f"{name:>30}" + "".join(f"{r[f'{name}_{k}_ms']:>12.3f}ms" for k in keys))
    print("(target: 0.1 ms added per call; peers report 1-2 ms. Shared 2-core machine: read as rough figures.)")
    for ours, theirs in (
        ("openai", "src_openllmetry_openai"),
        ("openai", "src_otel_openai_v2"),
        ("langchain", "src_openllmetry_langchain"),
        ("openai_agents", "src_openllmetry_openai_agents"),
    ):
        if f"{ours}_cpu_added_median_ms" in figures and f"{theirs}_cpu_added_median_ms" in figures:
            extra = figures[f"{theirs}_cpu_added_median_ms"] - figures[f"{ours}_cpu_added_median_ms"]
            figures[f"{theirs}_cpu_added_vs_{ours}_ms"] = extra
            print(f"{theirs}: {extra:+.3f} ms CPU per call vs our own {ours} hook")
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))


if __name__ == "__main__":
    asyncio.run(main())
