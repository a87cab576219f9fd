"""Should the judge be trusted? Its agreement with a checker on rollouts that have both.

`calibrate` judges finished rollouts as groups (the judge never sees the checker's reward) and compares each
rollout's judge score with the final reward its checker gave: accuracy when the checker says pass/fail (rewards 0
or 1; the judge passes a rollout at a score of 0.5 or more), Spearman's rank correlation for graded rewards (and
for pass/fail too, when both vary). Rollouts the judge could not score are counted, never guessed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentlightning.judge._config import JudgeConfig
from agentlightning.judge._judge import LLMJudge
from agentlightning.store import LightningStore
from agentlightning.transitions import TransitionConfig, results_from_store

__all__ = ["CalibrationReport", "agreement", "calibrate", "spearman"]


@dataclass
class CalibrationReport:
    """The judge against the checker.

    Attributes:
        rollouts: Rollouts compared (both a judge score and a checker reward).
        binary: Whether every checker reward is 0 or 1 (pass/fail).
        accuracy: With a pass/fail checker: the fraction where the judge's pass (score >= 0.5) is the checker's.
        spearman: Spearman's rank correlation of judge scores and checker rewards (``None``: one of them is
            constant, or fewer than 2 rollouts).
        judge_missing: Rollouts the judge could not score.
        checker_missing: Rollouts without a checker reward.
        pairs: ``(rollout id, judge score, checker reward)`` of every compared rollout.
        reasons: Why the judge could not score the ``judge_missing`` ones.
    """

    rollouts: int
    binary: bool
    accuracy: float | None
    spearman: float | None
    judge_missing: int
    checker_missing: int
    pairs: list[tuple[str, float, float]] = field(default_factory=list[tuple[str, float, float]])
    reasons: list[str] = field(default_factory=list[str])

    def summary(self) -> str:
        """One line for people."""
        accuracy = "n/a (graded checker)" if self.accuracy is None else f"{self.accuracy:.3f}"
        rho = "n/a" if self.spearman is None else f"{self.spearman:+.3f}"
        return (
            f"judge vs checker on {self.rollouts} rollouts: accuracy {accuracy}, Spearman {rho}; "
            f"{self.judge_missing} not judged, {self.checker_missing} without a checker reward"
        )

    def write(self, path: Path) -> Path:
        """Store the report as JSON at ``path``; returns it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return path


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on ranks, ties averaged); ``None`` when undefined."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return None if vx == 0 or vy == 0 else cov / (vx * vy)


def agreement(
    pairs: Sequence[tuple[str, float, float]], judge_missing: int = 0, checker_missing: int = 0
) -> CalibrationReport:
    """The report for ``(rollout id, judge score, checker reward)`` pairs."""
    checker = [c for _, _, c in pairs]
    judged = [j for _, j, _ in pairs]
    binary = bool(pairs) and all(c in (0.0, 1.0) for c in checker)
    accuracy = None
    if binary:
        accuracy = sum(1 for j, c in zip(judged, checker, strict=True) if (j >= 0.5) == (c >= 0.5)) / len(pairs)
    return CalibrationReport(
        len(pairs), binary, accuracy, spearman(judged, checker), judge_missing, checker_missing, list(pairs)
    )


async def calibrate(store: LightningStore, rollout_ids: Sequence[str], config: JudgeConfig) -> CalibrationReport:
    """Judge finished rollouts as groups and compare with their checker's final rewards.

    Raises:
        ValueError: No rollout has both a judge score and a checker reward.
    """
    judge = LLMJudge(config.model_copy(update={"mode": "group", "weight": 1.0}))
    try:
        outcome = await judge.judge(store, rollout_ids)
    finally:
        await judge.close()
    results = await results_from_store(store, rollout_ids, TransitionConfig(on_missing="skip"))
    checker = {r.rollout_id: r.final_reward for r in results if r.rollout_id is not None}
    pairs: list[tuple[str, float, float]] = []
    checker_missing = 0
    for rollout_id in rollout_ids:
        judgement = outcome.judgements.get(rollout_id)
        reward = checker.get(rollout_id)
        if reward is None:
            checker_missing += 1
        elif judgement is not None and judgement.score is not None:
            pairs.append((rollout_id, judgement.score, reward))
    report = agreement(pairs, len(outcome.missing), checker_missing)
    report.reasons = [f"{j.rollout_id}: {j.missing}" for j in outcome.missing]
    if not pairs:
        raise ValueError(f"no rollout has both a judge score and a checker reward ({report.summary()})")
    return report
