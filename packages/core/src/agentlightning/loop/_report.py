"""What one iteration or evaluation of `RLLoop` reports (one line of ``metrics.jsonl`` each)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agentlightning.transitions import TransitionResult

__all__ = ["IterationReport", "append_metrics", "held_out_score", "make_report", "summarize_results"]

logger = logging.getLogger(__name__)


@dataclass
class IterationReport:
    """What one training iteration (or one evaluation) produced; also one line of ``metrics.jsonl``.

    Attributes:
        iteration: Iterations completed when the report was made (1 after the first).
        model_version: The version served after the iteration (the one evaluated, for evaluations).
        rollouts: Rollouts enqueued.
        finished: Rollouts that succeeded in time.
        reward_mean: Mean final reward of the finished rollouts (a missing reward counts as 0).
        calls_per_rollout: Trained LLM calls per finished rollout (before a trajectory merges them).
        multi_call_rate: Fraction of finished rollouts with more than one trained call.
        seconds: Wall time of the iteration.
        metrics: Everything else: ``accuracy`` (the fraction of finished rollouts whose reward reaches
            `LoopConfig.success_reward`), the batch's metrics (rewards, advantages,
            ``staleness_mean``/``staleness_max``...), the engine's update metrics, ``time_*`` phases and the
            engine's serving metrics.
        kind: ``train`` or ``eval``.
    """

    iteration: int
    model_version: int
    rollouts: int
    finished: int
    reward_mean: float
    calls_per_rollout: float
    multi_call_rate: float
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict[str, float])
    kind: Literal["train", "eval"] = "train"


def summarize_results(results: Sequence[TransitionResult], success_reward: float = 1.0) -> dict[str, float]:
    """Rollout-level figures of converted attempts.

    Returns:
        ``reward_mean``, ``calls_per_rollout``, ``multi_call_rate`` and ``success_rate`` (the fraction whose final
        reward is at least ``success_reward``).
    """
    rewards = [r.final_reward if r.final_reward is not None else 0.0 for r in results]
    # trained LLM calls, counted before a trajectory merges them into one transition
    calls = [r.diagnostics.calls_trained or len(r.transitions) for r in results]
    n = max(len(results), 1)
    return {
        "reward_mean": sum(rewards) / n,
        "calls_per_rollout": sum(calls) / n,
        "multi_call_rate": sum(1 for c in calls if c > 1) / n,
        "success_rate": sum(1 for r in rewards if r >= success_reward) / n,
    }


def held_out_score(report: IterationReport, metric: str = "reward_mean") -> float:
    """The figure of an evaluation report that ranks checkpoints: ``reward_mean`` or one of its ``metrics``.

    Raises:
        ValueError: ``metric`` is neither ``reward_mean`` nor in the report's metrics (the message lists them).
    """
    if metric == "reward_mean":
        return report.reward_mean
    if metric not in report.metrics:
        known = ", ".join(["reward_mean", *sorted(report.metrics)])
        raise ValueError(f"best_metric {metric!r} is not a figure of the evaluation report (it has: {known})")
    return float(report.metrics[metric])


def make_report(
    kind: Literal["train", "eval"],
    iteration: int,
    model_version: int,
    rollouts: int,
    results: Sequence[TransitionResult],
    t0: float,
    metrics: dict[str, float],
    success_reward: float,
) -> IterationReport:
    """The report of an iteration or evaluation that started at ``t0`` (``time.monotonic()``) and enqueued
    ``rollouts``, of which ``results`` finished; logs an error when rollouts were enqueued and none finished."""
    if not results and rollouts:
        failed = int(metrics.get("rollouts_failed", 0))
        why = f"{failed} failed (the warning above says why)" if failed else "are runners running?"
        logger.error("none of %d rollouts finished in %.0f s: %s", rollouts, time.monotonic() - t0, why)
    summary = summarize_results(results, success_reward)
    return IterationReport(
        iteration=iteration,
        model_version=model_version,
        rollouts=rollouts,
        finished=len(results),
        reward_mean=summary["reward_mean"],
        calls_per_rollout=summary["calls_per_rollout"],
        multi_call_rate=summary["multi_call_rate"],
        seconds=time.monotonic() - t0,
        metrics={**metrics, "accuracy": summary["success_rate"]},
        kind=kind,
    )


def append_metrics(output_dir: Path, report: IterationReport) -> None:
    """Append ``report`` as one line of ``output_dir/metrics.jsonl``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    with (output_dir / "metrics.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(report.__dict__) + "\n")
