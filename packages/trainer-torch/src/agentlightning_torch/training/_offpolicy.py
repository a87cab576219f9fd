"""Off-policy correction of the policy-gradient loss: truncated importance sampling against the behaviour policy.

With a staleness bound k > 0 (`LoopConfig.max_staleness`) a sample may come from weights up to k versions older
than the ones being updated. The update then works with three policies, as decoupled PPO does (AReaL):

- the behaviour policy ``pi_behav``: the weights that generated the sample (its recorded `response_logprobs`);
- the proximal policy ``pi_prox``: the weights before this update (log-probs recomputed without gradients); the PPO
  ratio ``pi_theta / pi_prox`` is clipped around it, so the trust region is the same whatever the sample's age;
- the policy being trained ``pi_theta``.

Each token's clipped surrogate is weighted by ``w = min(pi_prox / pi_behav, cap)``: the importance weight from the
behaviour to the proximal policy, truncated at ``cap`` (truncated IS) so a token the old weights found unlikely
cannot dominate the step. A sample of the current version has ``w`` = 1 up to the backend's numerics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentlightning import TrainingSample

__all__ = ["ImportanceWeights", "check_behaviour_logprobs", "truncated_importance_weights"]


@dataclass(frozen=True)
class ImportanceWeights:
    """Per sample and token, the truncated importance weight, and its statistics over the trained tokens.

    Attributes:
        weights: ``min(exp(prox - behav), cap)`` per response token of each sample.
        ratio_mean: Mean of the untruncated ratio ``exp(prox - behav)`` over trained tokens (mask 1).
        ratio_max: Its largest value over trained tokens.
        truncated_fraction: The fraction of trained tokens whose ratio exceeds ``cap``.
    """

    weights: list[list[float]]
    ratio_mean: float
    ratio_max: float
    truncated_fraction: float

    def metrics(self) -> dict[str, float]:
        """``is_ratio_mean``, ``is_ratio_max`` and ``is_truncated_fraction`` (a `ppo_update` metric each)."""
        return {
            "is_ratio_mean": self.ratio_mean,
            "is_ratio_max": self.ratio_max,
            "is_truncated_fraction": self.truncated_fraction,
        }


def check_behaviour_logprobs(samples: Sequence[TrainingSample]) -> None:
    """Refuse a sample without behaviour log-probs (the importance weight needs them).

    Raises:
        ValueError: Naming the first such sample and why it is refused.
    """
    for index, sample in enumerate(samples):
        if sample.response_logprobs is None:
            raise ValueError(
                f"sample {index} (rollout {sample.rollout_id}, step {sample.step_index}) has no behaviour log-probs: "
                "truncated importance sampling needs the log-probs of the weights that generated it (does the "
                "backend return logprobs?); with PPOConfig.is_correction=False the update recomputes them instead"
            )


def truncated_importance_weights(
    proximal: Sequence[Sequence[float]],
    behaviour: Sequence[Sequence[float]],
    masks: Sequence[Sequence[int]],
    cap: float,
) -> ImportanceWeights:
    """The truncated importance weights ``min(exp(proximal - behaviour), cap)`` of every response token.

    Args:
        proximal: Per sample, the response tokens' log-probs under the weights before the update.
        behaviour: Per sample, their log-probs under the weights that generated them.
        masks: Per sample, 1 for the trained tokens (the statistics cover those only).
        cap: The truncation (``PPOConfig.is_cap``).

    Raises:
        ValueError: Rows of different lengths, or a non-finite ratio.
    """
    weights: list[list[float]] = []
    trained: list[float] = []
    for index, (prox_row, behav_row, mask) in enumerate(zip(proximal, behaviour, masks, strict=True)):
        if not len(prox_row) == len(behav_row) == len(mask):
            raise ValueError(f"sample {index}: log-prob rows and mask differ in length")
        row: list[float] = []
        for prox, behav, keep in zip(prox_row, behav_row, mask, strict=True):
            ratio = math.exp(min(prox - behav, 700.0))  # exp overflows past ~709; such a ratio is capped anyway
            if not math.isfinite(ratio):
                raise ValueError(f"sample {index}: non-finite importance ratio (log-probs {prox}, {behav})")
            row.append(min(ratio, cap))
            if keep:
                trained.append(ratio)
        weights.append(row)
    if not trained:
        return ImportanceWeights(weights, 0.0, 0.0, 0.0)
    truncated = sum(1 for ratio in trained if ratio > cap)
    return ImportanceWeights(weights, sum(trained) / len(trained), max(trained), truncated / len(trained))
