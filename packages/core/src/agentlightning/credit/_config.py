"""Settings of LightningRL credit assignment and advantage estimation."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CreditConfig"]


class CreditConfig(BaseModel):
    """How rewards become per-transition credit and advantages.

    Attributes:
        gamma: Discount per step, in (0, 1]. Used by the ``discounted`` and ``per_step`` strategies
            (1.0: no discount).
        eps: Added to the standard deviation before dividing (> 0), so equal-reward groups give 0, not NaN.
        normalize_by_std: ``grpo`` and ``reinforce_pp`` divide by the (group or batch) standard deviation;
            ``False`` only subtracts the mean (Dr. GRPO style, no bias towards easy or hard groups).
        drop_equal_groups: Drop groups whose credits are all equal (they carry no signal for group
            estimators and only dilute the batch).
        equal_tolerance: Credits within this distance of each other count as equal (>= 0).
        missing_final_reward: A rollout that reported no final reward: count it as ``zero`` reward (a failed
            episode usually earns nothing; a warning says how many), ``drop`` it, or ``raise``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gamma: float = Field(default=1.0, gt=0.0, le=1.0)
    eps: float = Field(default=1e-6, gt=0.0, allow_inf_nan=False)
    normalize_by_std: bool = True
    drop_equal_groups: bool = False
    equal_tolerance: float = Field(default=1e-9, ge=0.0, allow_inf_nan=False)
    missing_final_reward: Literal["zero", "drop", "raise"] = "zero"
