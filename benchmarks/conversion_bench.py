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
import gc
import json
import random
import statistics
import time
from typing import Any

from agentlightning import (
    CreditConfig,
    LLMCall,
    Span,
    Transition,
    TransitionBuilder,
    TransitionConfig,
    build_training_batch,
)
from agentlightning import semconv as sc
from agentlightning.transitions import TransitionDiagnostics

Attempt = tuple[list[Span], list[LLMCall], str]


def make_workload(n_rollouts: int, n_calls: int, seed: int = 0) -> list[Attempt]:
    rng = random.Random(seed)
    out: list[Attempt] = []
    for r in range(n_rollouts):
        rollout_id, attempt_id = f"ro-{r:06d}", f"at-{r:06d}"
        spans: list[Span] = []
        calls: list[LLMCall] = []
        clock = 1_000.0 + r

        def span(name: str, parent: str | None, attrs: dict[str, Any]) -> str:
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


def convert(workload: list[Attempt], mode: str, credit: str, estimator: str) -> tuple[float, float, int, int]:
    """One timed pass; returns (seconds building transitions, seconds building the batch, calls, samples)."""
    builder = TransitionBuilder(TransitionConfig(mode=mode))  # type: ignore[arg-type]
    diagnostics = TransitionDiagnostics()
    transitions: list[Transition] = []
    t0 = time.perf_counter()
    for spans, calls, group_id in workload:
        result = builder.build(spans, calls, group_id=group_id)
        diagnostics.add(result.diagnostics)
        transitions.extend(result.transitions)
    t1 = time.perf_counter()
    batch = build_training_batch(transitions, credit, estimator, CreditConfig(), diagnostics=diagnostics)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, diagnostics.calls_trained, len(batch.samples)


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
    n_spans = sum(len(spans) for spans, _, _ in workload)
    print(f"workload: {args.rollouts} rollouts x {args.calls} LLM calls, {n_spans} spans (built in {setup_s:.1f} s)")

    scenarios = [
        ("per_call", "identical", "grpo"),
        ("per_call", "per_step", "grpo"),
        ("per_call", "discounted", "rloo"),
        ("trajectory", "identical", "grpo"),
    ]
    figures: dict[str, float] = {"rollouts": args.rollouts, "calls_per_rollout": args.calls, "spans": n_spans}
    header = f"{'mode':<11}{'credit':<11}{'estimator':<10}{'samples':>8}{'build calls/s':>15}{'batch calls/s':>15}"
    header += f"{'total calls/s':>15}{'median total':>14}"
    print(header)
    print("-" * len(header))
    for mode, credit, estimator in scenarios:
        runs: list[tuple[float, float, int, int]] = []
        gc.collect()
        for _ in range(args.repeat):
            runs.append(convert(workload, mode, credit, estimator))
        calls = runs[0][2]
        best_build = min(r[0] for r in runs)
        best_batch = min(r[1] for r in runs)
        totals = [r[0] + r[1] for r in runs]
        key = f"{mode}.{credit}.{estimator}"
        figures[f"{key}.samples"] = runs[0][3]
        figures[f"{key}.build_calls_per_s"] = round(calls / best_build)
        figures[f"{key}.batch_calls_per_s"] = round(calls / best_batch)
        figures[f"{key}.total_calls_per_s"] = round(calls / min(totals))
        figures[f"{key}.median_total_calls_per_s"] = round(calls / statistics.median(totals))
        print(
            f"{mode:<11}{credit:<11}{estimator:<10}{runs[0][3]:>8}{calls / best_build:>15,.0f}{calls / best_batch:>15,.0f}"
            f"{calls / min(totals):>15,.0f}{calls / statistics.median(totals):>14,.0f}"
        )
    print("(best of", args.repeat, "runs unless marked median; target >= 50,000 LLM calls/s end to end)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
