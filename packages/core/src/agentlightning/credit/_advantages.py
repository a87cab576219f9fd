"""Advantage estimators: credits -> advantages, per group of rollouts of the same task.

An estimator gets the batch as ``groups -> rollouts -> credits`` (one credit per transition, step order)
and returns advantages of the same shape. Which to use:

* ``grpo`` (default): group-relative. Each rollout counts once in the group's mean and standard deviation,
  whatever its length, so long rollouts do not dominate; with ``identical`` credit this is exactly
  ``(score - mean) / (std + eps)`` over the rollouts' scores, broadcast to the rollout's transitions. With
  credit that varies inside a rollout (``per_step``, ``discounted``) every step return is normalised with
  the same rollout-weighted group statistics. Population standard deviation (ddof 0).
* ``rloo``: leave-one-out; a rollout's baseline is the mean score of the *other* rollouts of its group
  (a rollout's score is the mean of its credits). Not divided by a std. A group of one gets 0.
* ``reinforce_pp``: REINFORCE++; credits are whitened over the whole batch (no groups needed). Also accepted as
  ``reinforce_plus_plus`` (verl's spelling; `ESTIMATOR_ALIASES`).

``grpo`` and ``rloo`` compare the rollouts of a group (`is_group_estimator`): a group of one rollout gives
advantage 0.
* ``passthrough``: advantage = credit, for trainers with a critic (PPO/GAE computes its own advantages).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from agentlightning.credit._config import CreditConfig
from agentlightning.credit._registry import Registry

__all__ = [
    "ESTIMATOR_ALIASES",
    "AdvantageEstimator",
    "GroupedValues",
    "advantage_estimator_names",
    "canonical_estimator_name",
    "get_advantage_estimator",
    "is_group_estimator",
    "register_advantage_estimator",
]

GroupedValues = list[list[list[float]]]
"""``groups -> rollouts -> one value per transition``."""

AdvantageEstimator = Callable[[GroupedValues, CreditConfig], GroupedValues]
"""``(credits by group and rollout, config) -> advantages of the same shape``."""

ESTIMATOR_ALIASES: dict[str, str] = {"reinforce_plus_plus": "reinforce_pp"}
"""Other spellings accepted for a built-in estimator -> its one name (``reinforce_plus_plus`` is verl's)."""

_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", ESTIMATOR_ALIASES)
_GROUP_ESTIMATORS: set[str] = set()
"""Names of the estimators that compare the rollouts of a group (the one definition: see `is_group_estimator`)."""


def register_advantage_estimator(
    name: str, *, replace: bool = False, compares_group: bool = False
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator registering an advantage estimator under ``name``.

    Args:
        name: Name used in ``build_training_batch(estimator=name)``.
        replace: Allow replacing an estimator already registered under ``name``.
        compares_group: The estimator compares the rollouts of a group (a group of one gets advantage 0), so a
            run needs several rollouts per task (`is_group_estimator`).
    """
    register = _ESTIMATORS.register(name, replace=replace)

    def decorator(fn: AdvantageEstimator) -> AdvantageEstimator:
        registered = register(fn)
        if compares_group:
            _GROUP_ESTIMATORS.add(name)
        else:
            _GROUP_ESTIMATORS.discard(name)
        return registered

    return decorator


def canonical_estimator_name(name: str) -> str:
    """The registered name ``name`` stands for: itself, or the estimator an alias names (`ESTIMATOR_ALIASES`)."""
    return _ESTIMATORS.canonical(name)


def is_group_estimator(estimator: str | AdvantageEstimator) -> bool:
    """Whether ``estimator`` (a name, an alias or a registered function) compares the rollouts of a group.

    Such an estimator gives every rollout of a one-rollout group advantage 0: a run needs several rollouts per
    task. Unknown names and unregistered functions count as not comparing groups.
    """
    if isinstance(estimator, str):
        return _ESTIMATORS.canonical(estimator) in _GROUP_ESTIMATORS
    return any(_ESTIMATORS.get(name) is estimator for name in _GROUP_ESTIMATORS)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; ``ValueError`` naming the registered ones otherwise."""
    return _ESTIMATORS.get(name)


def advantage_estimator_names() -> list[str]:
    """Names of the registered advantage estimators."""
    return _ESTIMATORS.names()


def _is_constant(values: list[float]) -> bool:
    first = values[0]
    return all(v == first for v in values)


@register_advantage_estimator("grpo", compares_group=True)
def grpo(groups: GroupedValues, config: CreditConfig) -> GroupedValues:
    """Group-normalised advantages with every rollout weighted equally (see the module docstring)."""
    out: GroupedValues = []
    eps = config.eps
    by_std = config.normalize_by_std
    for group in groups:
        k = len(group)
        if k == 0:
            out.append([])
            continue
        if all(_is_constant(rollout) for rollout in group):  # the common case: one score per rollout
            scores = [rollout[0] for rollout in group]
            mean = sum(scores) / k
            denom = math.sqrt(sum((s - mean) ** 2 for s in scores) / k) + eps if by_std else 1.0
            out.append([[(s - mean) / denom] * len(rollout) for s, rollout in zip(scores, group, strict=True)])
            continue
        mean = sum(sum(rollout) / len(rollout) for rollout in group) / k
        var = sum(sum((c - mean) ** 2 for c in rollout) / len(rollout) for rollout in group) / k
        denom = math.sqrt(var) + eps if by_std else 1.0
        out.append([[(c - mean) / denom for c in rollout] for rollout in group])
    return out


@register_advantage_estimator("rloo", compares_group=True)
def rloo(groups: GroupedValues, config: CreditConfig) -> GroupedValues:
    """Leave-one-out baseline: ``credit - mean score of the other rollouts of the group``."""
    out: GroupedValues = []
    for group in groups:
        k = len(group)
        if k < 2:  # no other rollout to compare with: no signal
            out.append([[0.0] * len(rollout) for rollout in group])
            continue
        scores = [sum(rollout) / len(rollout) for rollout in group]
        total = sum(scores)
        out.append(
            [[c - (total - score) / (k - 1) for c in rollout] for score, rollout in zip(scores, group, strict=True)]
        )
    return out


@register_advantage_estimator("reinforce_pp")
def reinforce_pp(groups: GroupedValues, config: CreditConfig) -> GroupedValues:
    """REINFORCE++: whiten the credits over the whole batch (every transition weighted equally)."""
    flat = [c for group in groups for rollout in group for c in rollout]
    if not flat:
        return [[[] for _ in group] for group in groups]
    mean = sum(flat) / len(flat)
    denom = math.sqrt(sum((c - mean) ** 2 for c in flat) / len(flat)) + config.eps if config.normalize_by_std else 1.0
    return [[[(c - mean) / denom for c in rollout] for rollout in group] for group in groups]


@register_advantage_estimator("passthrough")
def passthrough(groups: GroupedValues, config: CreditConfig) -> GroupedValues:
    """Advantage = credit (a trainer with a critic computes its own advantages, taking the credit as the return)."""
    return [[list(rollout) for rollout in group] for group in groups]
