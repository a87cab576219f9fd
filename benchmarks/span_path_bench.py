"""CPU per span of Agent Lightning's own spans: the OpenTelemetry SDK's span objects vs the light path.

One "rollout" here records what the runner and the openai hook record for an agent making ``--llm-calls`` calls:
the root span (current while the agent runs), one LLM span per call (attributes at the start, the response id,
model and token usage at the end) and the final reward span, then flushes them into a `MemoryStore` (conversion to
`agentlightning.Span` records and the store write included). The same rollouts are recorded through the SDK tracer
and through the light tracer (`agentlightning.tracing._light`), in alternating blocks (a shared machine's speed
drifts), and the process CPU time per span and per LLM call is printed for each, with the saving.

    .venv/bin/python benchmarks/span_path_bench.py [--rollouts 2000] [--llm-calls 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from opentelemetry import trace
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from agentlightning import semconv
from agentlightning.store import MemoryStore, RetryPolicy
from agentlightning.testing import start_attempts
from agentlightning.tracing import aflush, get_span_processor, get_tracer, rollout_context
from agentlightning.tracing._light import LightTracer


def record_rollout(tracer: trace.Tracer, llm_calls: int) -> None:
    """The spans of one rollout, as the runner, the openai hook and the reward make them."""
    with tracer.start_as_current_span(
        "agentlightning.rollout",
        attributes={semconv.SPAN_KIND: semconv.KIND_ROLLOUT, semconv.GEN_AI_AGENT_NAME: "calc"},
        record_exception=False,
        set_status_on_exception=False,
    ):
        for index in range(llm_calls):
            span = tracer.start_span(
                "chat toy",
                attributes={
                    semconv.ADAPTER_NAME: "openai",
                    semconv.GEN_AI_SYSTEM: "openai",
                    semconv.GEN_AI_OPERATION: "chat",
                    semconv.SPAN_KIND: semconv.KIND_LLM,
                    semconv.GEN_AI_REQUEST_MODEL: "toy",
                },
            )
            span.set_attributes(
                {
                    semconv.GEN_AI_RESPONSE_ID: f"chatcmpl-{index}",
                    semconv.GEN_AI_RESPONSE_MODEL: "toy",
                    semconv.GEN_AI_USAGE_INPUT_TOKENS: 40,
                    semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 12,
                }
            )
            span.end()
        at = time.time_ns()
        reward = tracer.start_span(
            "agentlightning.reward",
            attributes={semconv.SPAN_KIND: semconv.KIND_REWARD, semconv.REWARD_VALUE: 1.0, semconv.REWARD_FINAL: True},
            start_time=at,
        )
        reward.end(end_time=at)


async def block(store: MemoryStore, tracer: trace.Tracer, rollouts: int, llm_calls: int) -> float:
    """CPU seconds of ``rollouts`` rollouts' spans, flushed into ``store``."""
    attempts = await start_attempts(store, [f"r{time.monotonic_ns()}-{i}" for i in range(rollouts)])
    started = time.process_time()
    for rollout_id, attempt_id in attempts.items():
        with rollout_context(store, rollout_id, attempt_id):
            record_rollout(tracer, llm_calls)
        await aflush()
    return time.process_time() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000, help="rollouts per path")
    parser.add_argument("--llm-calls", type=int, default=2, help="LLM spans per rollout")
    parser.add_argument("--block", type=int, default=200, help="rollouts per alternating block")
    args = parser.parse_args()
    scope = "agentlightning.bench"
    sdk = get_tracer(scope)
    tracers = {
        "sdk": LightTracer(sdk, get_span_processor(), InstrumentationScope(scope), lambda: False),
        "light": LightTracer(sdk, get_span_processor(), InstrumentationScope(scope), lambda: True),
    }
    store = MemoryStore(RetryPolicy(heartbeat_timeout=24 * 3600))
    for tracer in tracers.values():  # warm up both paths
        await block(store, tracer, 50, args.llm_calls)
    per_block: dict[str, list[float]] = {name: [] for name in tracers}
    for _ in range(max(1, args.rollouts // args.block)):
        for name, tracer in tracers.items():
            per_block[name].append(await block(store, tracer, args.block, args.llm_calls))
    spans_per_rollout = args.llm_calls + 2
    figures: dict[str, float] = {"llm_calls_per_rollout": args.llm_calls, "spans_per_rollout": spans_per_rollout}
    for name, seconds in per_block.items():
        per_rollout = statistics.median(seconds) / args.block
        figures[f"{name}_us_per_span"] = round(per_rollout / spans_per_rollout * 1e6, 1)
        figures[f"{name}_us_per_rollout"] = round(per_rollout * 1e6, 1)
    saved_span = figures["sdk_us_per_span"] - figures["light_us_per_span"]
    figures["saved_us_per_span"] = round(saved_span, 1)
    figures["saved_us_per_rollout"] = round(figures["sdk_us_per_rollout"] - figures["light_us_per_rollout"], 1)
    figures["light_vs_sdk"] = round(figures["light_us_per_span"] / figures["sdk_us_per_span"], 2)
    print(f"{'path':>6}{'us/span':>10}{'us/rollout':>12}   (CPU, median block; {spans_per_rollout} spans per rollout)")
    for name in tracers:
        print(f"{name:>6}{figures[f'{name}_us_per_span']:>10.1f}{figures[f'{name}_us_per_rollout']:>12.1f}")
    print(
        f"light path saves {saved_span:.1f} us per span ({figures['light_vs_sdk']:.2f}x the SDK's cost), "
        f"{figures['saved_us_per_rollout']:.0f} us per rollout"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
