"""Spans -> transitions -> training batch: conversion rate in LLM calls per second.

Run: ``.venv/bin/python benchmarks/conversion_bench.py [--quick] [--rollouts N] [--calls N]``

Workload: ``--rollouts`` rollouts (default 1,000) in groups of 8, each with ``--calls`` LLM calls (default 8)
made by one agent, with a tool span after every call, an intermediate reward after every other tool and a
final reward: ``2 * calls + 3 + calls // 2`` spans per rollout, delivered in shuffled order (as exporters do).
Prompts grow like a real conversation (each prompt = previous prompt + response + observation), so the
trajectory mode really merges. The data is built once up front; only the conversion is timed.

Prints a table (best and median of ``--repeat`` runs) and ends with ONE line: a JSON object of every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import statistics
import time
from collections.abc import Iterator
from typing import Any

from agentlightning import (
    CreditConfig,
    LLMCall,
    Span,
    TrainingSample,
    Transition,
    TransitionBuilder,
    TransitionConfig,
    build_training_batch,
)
from agentlightning import semconv as sc
from agentlightning.credit import _batch as batch_module
from agentlightning.transitions import TransitionDiagnostics
from agentlightning.transitions import _builder as builder_module

Attempt = tuple[list[Span], list[LLMCall], str]


def make_workload(n_rollouts: int, n_calls: int, seed: int = 0) -> list[Attempt]:
    rng = random.Random(seed)
    out: list[Attempt] = []
    for r in range(n_rollouts):
        rollout_id, attempt_id = f"ro-{r:06d}", f"at-{r:06d}"
        spans: list[Span] = []
        calls: list[LLMCall] = []
        clock = 1_000.0 + r

        def span(
            name: str,
            parent: str | None,
            attrs: dict[str, Any],
            spans: list[Span] = spans,
            rollout_id: str = rollout_id,
            attempt_id: str = attempt_id,
            r: int = r,
        ) -> str:
            nonlocal clock
            clock += 0.01
            span_id = f"{len(spans) + 1:016x}"
            spans.append(
                Span(
                    rollout_id=rollout_id,
                    attempt_id=attempt_id,
                    sequence_id=len(spans),
                    trace_id=f"{r + 1:032x}",
                    span_id=span_id,
                    parent_id=parent,
                    name=name,
                    start_time=clock,
                    end_time=clock + 0.005,
                    attributes=attrs,
                )
            )
            return span_id

        root = span("rollout", None, {sc.SPAN_KIND: sc.KIND_ROLLOUT})
        agent = span("agent", root, {sc.SPAN_KIND: sc.KIND_AGENT, sc.GEN_AI_AGENT_NAME: "solver"})
        prompt = [rng.randrange(50_000) for _ in range(200)]
        for c in range(n_calls):
            response = [rng.randrange(50_000) for _ in range(50)]
            response_id = f"chatcmpl-{r}-{c}"
            span("chat", agent, {sc.SPAN_KIND: sc.KIND_LLM, sc.GEN_AI_RESPONSE_ID: response_id})
            calls.append(
                LLMCall(
                    call_id=f"call-{r}-{c}",
                    rollout_id=rollout_id,
                    attempt_id=attempt_id,
                    response_id=response_id,
                    prompt_token_ids=prompt,
                    response_token_ids=response,
                    response_logprobs=[-0.25] * len(response),
                    model_version=1,
                    start_time=clock,
                )
            )
            if c < n_calls - 1:
                tool = span("calculator", agent, {sc.SPAN_KIND: sc.KIND_TOOL, sc.GEN_AI_TOOL_NAME: "calculator"})
                if c % 2 == 1:
                    span("reward", tool, {sc.SPAN_KIND: sc.KIND_REWARD, sc.REWARD_VALUE: 0.1})
                observation = [rng.randrange(50_000) for _ in range(20)]
                prompt = prompt + response + observation
        span(
            "reward",
            root,
            {sc.SPAN_KIND: sc.KIND_REWARD, sc.REWARD_VALUE: float(rng.random() < 0.5), sc.REWARD_FINAL: True},
        )
        rng.shuffle(spans)
        out.append((spans, calls, f"task-{r // 8}"))
    return out


def convert(workload: list[Attempt], mode: str, credit: str, estimator: str) -> dict[str, float]:
    """One pass; wall and CPU seconds of building transitions and of building the batch, calls and samples."""
    builder = TransitionBuilder(TransitionConfig(mode=mode))  # type: ignore[arg-type]
    diagnostics = TransitionDiagnostics()
    transitions: list[Transition] = []
    w0, c0 = time.perf_counter(), time.process_time()
    for spans, calls, group_id in workload:
        result = builder.build(spans, calls, group_id=group_id)
        diagnostics.add(result.diagnostics)
        transitions.extend(result.transitions)
    w1, c1 = time.perf_counter(), time.process_time()
    batch = build_training_batch(transitions, credit, estimator, CreditConfig(), diagnostics=diagnostics)
    w2, c2 = time.perf_counter(), time.process_time()
    return {
        "build_wall": w1 - w0,
        "batch_wall": w2 - w1,
        "build_cpu": c1 - c0,
        "batch_cpu": c2 - c1,
        "calls": diagnostics.calls_trained,
        "samples": len(batch.samples),
    }


@contextlib.contextmanager
def validated_models() -> Iterator[None]:
    """Swap the hot path's unvalidated model construction for ordinary pydantic validation (for comparison)."""
    saved = (builder_module._new_transition, batch_module._new_sample)
    builder_module._new_transition = Transition.model_validate  # type: ignore[assignment]
    batch_module._new_sample = TrainingSample.model_validate  # type: ignore[assignment]
    try:
        yield
    finally:
        builder_module._new_transition, batch_module._new_sample = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 rollouts, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.rollouts, args.repeat = 200, 3

    t = time.perf_counter()
    workload = make_workload(args.rollouts, args.calls)
    setup_s = time.perf_counter() - t
    # The input stays alive for the whole run (as it would in a trainer); freezing it keeps the collector from
    # re-scanning it on every collection, which otherwise makes the figures depend on how much was built.
    gc.collect()
    gc.freeze()
    n_spans = sum(len(spans) for spans, _, _ in workload)
    print(f"workload: {args.rollouts} rollouts x {args.calls} LLM calls, {n_spans} spans (built in {setup_s:.1f} s)")

    scenarios: list[tuple[str, str, str, bool]] = [
        ("per_call", "identical", "grpo", False),
        ("per_call", "per_step", "grpo", False),
        ("per_call", "discounted", "rloo", False),
        ("trajectory", "identical", "grpo", False),
        ("per_call", "identical", "grpo", True),
    ]
    figures: dict[str, float] = {"rollouts": args.rollouts, "calls_per_rollout": args.calls, "spans": n_spans}
    header = (
        f"{'scenario':<42}{'samples':>8}{'build/s cpu':>13}{'batch/s cpu':>13}{'total/s cpu':>13}"
        f"{'total/s wall':>14}{'median wall':>13}"
    )
    print("LLM calls converted per second (best of", args.repeat, "runs; 'median wall' is the median run)")
    print(header)
    print("-" * len(header))
    for mode, credit, estimator, validated in scenarios:
        gc.collect()
        with validated_models() if validated else contextlib.nullcontext():
            runs = [convert(workload, mode, credit, estimator) for _ in range(args.repeat)]
        calls = runs[0]["calls"]
        name = f"{mode}.{credit}.{estimator}" + (".validated_models" if validated else "")
        row = {
            "samples": runs[0]["samples"],
            "build_calls_per_s_cpu": calls / min(r["build_cpu"] for r in runs),
            "batch_calls_per_s_cpu": calls / min(r["batch_cpu"] for r in runs),
            "total_calls_per_s_cpu": calls / min(r["build_cpu"] + r["batch_cpu"] for r in runs),
            "total_calls_per_s_wall": calls / min(r["build_wall"] + r["batch_wall"] for r in runs),
            "median_total_calls_per_s_wall": calls / statistics.median(r["build_wall"] + r["batch_wall"] for r in runs),
        }
        figures.update({f"{name}.{k}": round(v) for k, v in row.items()})
        print(
            f"{name:<42}{row['samples']:>8}{row['build_calls_per_s_cpu']:>13,.0f}{row['batch_calls_per_s_cpu']:>13,.0f}"
            f"{row['total_calls_per_s_cpu']:>13,.0f}{row['total_calls_per_s_wall']:>14,.0f}"
            f"{row['median_total_calls_per_s_wall']:>13,.0f}"
        )
    fast = figures["per_call.identical.grpo.total_calls_per_s_cpu"]
    slow = figures["per_call.identical.grpo.validated_models.total_calls_per_s_cpu"]
    figures["speedup_vs_validated_models"] = round(fast / slow, 2)
    print(f"unvalidated construction of already-validated data: {fast / slow:.2f}x faster than validating again")
    print("target: >= 50,000 LLM calls/s end to end (cpu figures are the fair ones on a shared machine)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
