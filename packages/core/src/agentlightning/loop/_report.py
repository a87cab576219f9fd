"""What one iteration or evaluation of `RLLoop` reports (one line of ``metrics.jsonl`` each)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentlightning.transitions._config import TransitionResult

__all__ = ["IterationReport", "held_out_score", "summarize_results"]


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
