"""Transitions -> `TrainingBatch`: LightningRL credit assignment, then advantage estimation."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import TypeAdapter, ValidationError

from agentlightning._fast import fast_model, new_training_sample
from agentlightning._training_models import TrainingBatch, TrainingSample, TrainingSampleFields, Transition
from agentlightning.credit._advantages import (
    AdvantageEstimator,
    GroupedValues,
    get_advantage_estimator,
    grpo,
    is_group_estimator,
    passthrough,
    reinforce_pp,
    rloo,
)
from agentlightning.credit._config import CreditConfig
from agentlightning.credit._strategies import CreditStrategy, discounted, get_credit_strategy, identical, per_step
from agentlightning.store import LightningStore
from agentlightning.store._common import revalidate_unchecked
from agentlightning.transitions import TransitionConfig, TransitionDiagnostics, TransitionResult, results_from_store

__all__ = ["build_batch_from_results", "build_batch_from_store", "build_training_batch", "staleness_metrics"]

logger = logging.getLogger(__name__)

_new_sample = new_training_sample  # a module global: benchmarks/conversion_bench.py swaps in validation


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


_FLOATS = TypeAdapter(list[float])
_OURS: frozenset[object] = frozenset(
    {identical, discounted, per_step, grpo, rloo, reinforce_pp, passthrough}  # the built-in strategies/estimators
)
_FLOAT_ONLY = {float}


def _floats(values: Sequence[float], what: str) -> list[float]:
    """A strategy's or estimator's values as the floats a `TrainingSample` holds (ints, numpy floats converted).

    Raises:
        ValueError: A value is not a number (non-finite ones are refused later, naming the rollout and step).
    """
    if type(values) is list and (not values or set(map(type, values)) == _FLOAT_ONLY):
        return values
    try:
        return _FLOATS.validate_python(list(values))
    except ValidationError as exc:
        raise ValueError(f"{what} returned a value that is not a number: {exc.errors()[0]['msg']}") from None


def _step_index(transition: Transition) -> int:
    return transition.step_index


def _raise_non_finite(steps: list[Transition], credits: list[float], advantages: list[float]) -> None:
    for step, credit_value, advantage in zip(steps, credits, advantages, strict=True):
        if not (math.isfinite(credit_value) and math.isfinite(advantage)):
            raise ValueError(
                f"non-finite credit/advantage ({credit_value}, {advantage}) for rollout {step.rollout_id} "
                f"step {step.step_index}"
            )
    raise ValueError(f"credits/advantages of rollout {steps[0].rollout_id} overflow to a non-finite sum")


def staleness_metrics(samples: Sequence[TrainingSample], current_version: int) -> dict[str, float]:
    """How many versions behind ``current_version`` the samples' generating weights are.

    Returns:
        ``staleness_mean`` and ``staleness_max`` over samples with a known `TrainingSample.model_version` (0.0 when
        none is known) and ``samples_without_version``.
    """
    lags = [current_version - s.model_version for s in samples if s.model_version is not None]
    return {
        "staleness_mean": sum(lags) / len(lags) if lags else 0.0,
        "staleness_max": float(max(lags)) if lags else 0.0,
        "samples_without_version": float(len(samples) - len(lags)),
    }


_Credited = tuple[list[Transition], float, list[float]]
"""One rollout's transitions in step order, its final reward and the credit of each transition."""

_GroupKey = tuple[str, str | None]
"""A group: the rollouts' group id (or the rollout id) and the policy that generated the transitions."""


@dataclass
class _Grouped:
    """Credit assignment's output: the credited rollouts by group, and what it saw along the way."""

    groups: dict[_GroupKey, list[_Credited]] = field(default_factory=dict[_GroupKey, list[_Credited]])
    finals: list[float] = field(default_factory=list[float])  # final reward of every kept rollout
    without_reward: list[str] = field(default_factory=list[str])  # rollouts that reported no final reward


@dataclass
class _Estimated:
    """The groups that are estimated (equal groups dropped on request) and their advantages."""

    keys: list[_GroupKey]
    advantages: GroupedValues
    equal_groups: int
    dropped_samples: int


@dataclass
class _Samples:
    """The samples and the values of the kept ones, for the metrics."""

    samples: list[TrainingSample] = field(default_factory=list[TrainingSample])
    advantages: list[float] = field(default_factory=list[float])
    credits: list[float] = field(default_factory=list[float])
    response_tokens: int = 0
    trained_tokens: int = 0
    empty: int = 0


def _by_rollout(transitions: Sequence[Transition]) -> dict[tuple[str, str], list[Transition]]:
    """Group phase: transitions by (rollout_id, attempt_id), in input order."""
    rollouts: dict[tuple[str, str], list[Transition]] = {}
    for transition in transitions:
        values = transition.__dict__  # faster than attribute reads on a pydantic model (it defines __getattr__)
        key = (values["rollout_id"], values["attempt_id"])
        bucket = rollouts.get(key)
        if bucket is None:
            rollouts[key] = [transition]
        else:
            bucket.append(transition)
    return rollouts


def _in_step_order(rollout_id: str, steps: list[Transition]) -> float | None:
    """Sort one rollout's steps (in place, when needed) and return the final reward they all carry.

    Raises:
        ValueError: The steps disagree on the final reward (they come from several attempts).
    """
    final = steps[0].final_reward
    previous = steps[0].step_index
    unordered = disagree = False
    for step in steps:  # one pass: are the steps in order, and do they agree on the final reward?
        values = step.__dict__
        step_index = values["step_index"]
        if step_index < previous:
            unordered = True
        previous = step_index
        if values["final_reward"] != final:
            disagree = True
    if unordered:
        steps.sort(key=_step_index)
        final = steps[0].final_reward
    if disagree:
        for step in steps:
            if step.final_reward != final:
                raise ValueError(
                    f"transitions of rollout {rollout_id} disagree on the final reward ({final} vs "
                    f"{step.final_reward}); they must come from one attempt"
                )
    return final


def _by_policy(steps: list[Transition], credits: list[float]) -> list[tuple[str | None, list[Transition], list[float]]]:
    """A rollout's steps and credits split by policy (one part, in order, when every step has the same one)."""
    first = steps[0].policy
    if all(step.policy == first for step in steps):
        return [(first, steps, credits)]
    parts: dict[str | None, tuple[list[Transition], list[float]]] = {}
    for step, credit in zip(steps, credits, strict=True):
        part = parts.setdefault(step.policy, ([], []))
        part[0].append(step)
        part[1].append(credit)
    return [(policy, part[0], part[1]) for policy, part in parts.items()]


def _assign_credit(
    rollouts: dict[tuple[str, str], list[Transition]], strategy: CreditStrategy, config: CreditConfig, check: bool
) -> _Grouped:
    """Credit phase: each rollout's rewards become one credit per transition; rollouts are grouped by group_id."""
    grouped = _Grouped()
    groups = grouped.groups
    for (rollout_id, _), steps in rollouts.items():
        final = _in_step_order(rollout_id, steps)
        if final is None:
            grouped.without_reward.append(rollout_id)
            if config.missing_final_reward == "drop":
                continue
            final = 0.0
        credits = strategy(steps, final, config)
        if check:
            credits = _floats(credits, "credit strategy")
        if len(credits) != len(steps):
            raise ValueError(f"credit strategy returned {len(credits)} values for {len(steps)} transitions")
        grouped.finals.append(final)
        group_id = steps[0].group_id or rollout_id
        for policy, policy_steps, policy_credits in _by_policy(steps, credits):
            group = groups.get((group_id, policy))
            if group is None:
                groups[(group_id, policy)] = [(policy_steps, final, policy_credits)]
            else:
                group.append((policy_steps, final, policy_credits))
    _report_missing_rewards(grouped.without_reward, config)
    return grouped


def _report_missing_rewards(without_reward: list[str], config: CreditConfig) -> None:
    if not without_reward:
        return
    if config.missing_final_reward == "raise":
        raise ValueError(f"{len(without_reward)} rollout(s) reported no final reward: {', '.join(without_reward[:10])}")
    logger.warning(
        "%d rollout(s) reported no final reward (%s); %s",
        len(without_reward),
        ", ".join(without_reward[:5]),
        "dropped" if config.missing_final_reward == "drop" else "counted as reward 0",
    )


def _estimate_advantages(
    groups: dict[_GroupKey, list[_Credited]], estimate: AdvantageEstimator, config: CreditConfig
) -> _Estimated:
    """Estimate phase: drop equal groups on request, then the estimator turns credits into advantages.

    Raises:
        ValueError: The estimator's answer has another shape than the credits it was given.
    """
    tol = config.equal_tolerance
    keys: list[_GroupKey] = []
    kept_credits: GroupedValues = []
    equal_groups = 0
    dropped_samples = 0
    for key, members in groups.items():
        values = [c for _, _, credits in members for c in credits]
        if not values or max(values) - min(values) <= tol:
            equal_groups += 1
            if config.drop_equal_groups:
                dropped_samples += len(values)
                continue
        keys.append(key)
        kept_credits.append([credits for _, _, credits in members])
    advantages = estimate(kept_credits, config)
    if len(advantages) != len(kept_credits) or any(
        len(a) != len(c) or any(len(x) != len(y) for x, y in zip(a, c, strict=True))
        for a, c in zip(advantages, kept_credits, strict=True)
    ):
        raise ValueError("advantage estimator returned a different shape than the credits it was given")
    return _Estimated(keys, advantages, equal_groups, dropped_samples)


def _make_samples(groups: dict[_GroupKey, list[_Credited]], estimated: _Estimated, check: bool) -> _Samples:
    """Samples phase: one `TrainingSample` per transition with a response, its credit and advantage.

    Raises:
        ValueError: A credit or advantage is not a finite number.
    """
    out = _Samples()
    new_sample = _new_sample
    add_sample = out.samples.append
    isfinite = math.isfinite
    response_tokens = trained_tokens = 0  # locals in the per-sample loop, stored once at the end
    for key, group_adv in zip(estimated.keys, estimated.advantages, strict=True):
        for (steps, _, credits), rollout_adv in zip(groups[key], group_adv, strict=True):
            if check:
                rollout_adv = _floats(rollout_adv, "advantage estimator")
            if not isfinite(sum(credits) + sum(rollout_adv)):  # any inf or nan makes the sum non-finite
                _raise_non_finite(steps, credits, rollout_adv)
            dropped = 0
            for step, credit_value, advantage in zip(steps, credits, rollout_adv, strict=True):
                values = step.__dict__  # faster than attribute reads on a pydantic model (it defines __getattr__)
                response = values["response_token_ids"]
                if not response:
                    dropped += 1
                    continue
                mask = values["response_mask"]
                fields: TrainingSampleFields = {
                    "prompt_token_ids": values["prompt_token_ids"],
                    "response_token_ids": response,
                    "response_mask": mask,
                    "response_logprobs": values["response_logprobs"],
                    "credit": credit_value,
                    "advantage": advantage,
                    "group_id": key[0],
                    "rollout_id": values["rollout_id"],
                    "attempt_id": values["attempt_id"],
                    "step_index": values["step_index"],
                    "agent_name": values["agent_name"],
                    "model_version": values["model_version"],
                    "policy": values["policy"],
                }
                add_sample(new_sample(fields))
                response_tokens += len(response)
                trained_tokens += sum(mask)
            if dropped:
                out.empty += dropped
                kept = [bool(step.response_token_ids) for step in steps]
                out.advantages.extend(a for a, keep in zip(rollout_adv, kept, strict=True) if keep)
                out.credits.extend(c for c, keep in zip(credits, kept, strict=True) if keep)
            else:
                out.advantages.extend(rollout_adv)
                out.credits.extend(credits)
    out.response_tokens, out.trained_tokens = response_tokens, trained_tokens
    return out


def _warn_no_signal(
    grouped: _Grouped, estimated: _Estimated, made: _Samples, estimator: str | AdvantageEstimator, tol: float
) -> int:
    """Warn when no sample moves the policy (groups of one under a group estimator, or only equal groups).

    Returns:
        The number of groups holding a single rollout.
    """
    n_groups = len(grouped.groups)
    single = sum(1 for members in grouped.groups.values() if len(members) == 1)
    if not n_groups or not all(abs(a) <= tol for a in made.advantages):
        return single
    if single == n_groups and is_group_estimator(estimator):
        logger.warning(
            "no learning signal: every one of the %d group(s) holds ONE rollout, and the %s estimator compares "
            "rollouts within a group, so every advantage is 0. Run each task several times under one group_id "
            "(e.g. enqueue it N times with the same group_id) or use estimator='reinforce_pp'.",
            n_groups,
            estimator if isinstance(estimator, str) else "group",
        )
    elif estimated.equal_groups == n_groups:
        logger.warning(
            "learning has stalled: every one of the %d group(s) in the batch has equal rewards, so no sample has a "
            "non-zero advantage (all successes or all failures; try easier/harder tasks, more samples per task, "
            "or a lower learning rate)",
            n_groups,
        )
    return single


def _batch_metrics(
    grouped: _Grouped, estimated: _Estimated, made: _Samples, single: int, config: CreditConfig
) -> dict[str, float]:
    """Metrics phase: what the batch holds and how its rewards, credits and advantages are spread."""
    finals = grouped.finals
    n_groups = len(grouped.groups)
    reward_mean, reward_std = _mean_std(finals)
    adv_mean, adv_std = _mean_std(made.advantages)
    return {
        "n_samples": float(len(made.samples)),
        "n_rollouts": float(len(finals)),
        "n_groups": float(n_groups),
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "reward_min": min(finals) if finals else 0.0,
        "reward_max": max(finals) if finals else 0.0,
        "credit_mean": sum(made.credits) / len(made.credits) if made.credits else 0.0,
        "advantage_mean": adv_mean,
        "advantage_std": adv_std,
        "zero_std_group_fraction": estimated.equal_groups / n_groups if n_groups else 0.0,
        "single_rollout_groups": float(single),
        "dropped_groups": float(estimated.equal_groups if config.drop_equal_groups else 0),
        "dropped_samples": float(estimated.dropped_samples),
        "empty_responses_dropped": float(made.empty),
        "rollouts_without_reward": float(len(grouped.without_reward)),
        "response_tokens": float(made.response_tokens),
        "trained_tokens": float(made.trained_tokens),
    }


def build_training_batch(
    transitions: Sequence[Transition],
    credit: str | CreditStrategy = "identical",
    estimator: str | AdvantageEstimator = "grpo",
    config: CreditConfig | None = None,
    *,
    diagnostics: TransitionDiagnostics | None = None,
    current_version: int | None = None,
) -> TrainingBatch:
    """Assign credit to transitions and estimate advantages: the LightningRL step.

    Transitions are grouped into rollouts by (rollout_id, attempt_id) and rollouts into groups by
    ``group_id`` (a rollout without a group is a group of its own). The credit strategy turns each rollout's
    final and intermediate rewards into one credit per transition (``TrainingSample.credit``); the estimator
    turns credits into advantages. Transitions of several policies (`Transition.policy`: one LoRA adapter per
    agent) are compared only with their own policy's: each group is split by policy before the estimator sees it,
    so a policy's advantages come from its own samples.

    Logs a WARNING when every group has equal rewards and no sample has a non-zero advantage: learning has
    stalled (all successes or all failures), and nothing in the batch moves the policy.

    Args:
        transitions: Transitions of any number of rollouts, e.g. from `transitions_from_store`.
        credit: A registered credit strategy name (``identical``, ``discounted``, ``per_step``) or a function.
        estimator: A registered estimator name (``grpo``, ``rloo``, ``reinforce_pp``, ``passthrough``) or a
            function.
        config: Credit settings.
        diagnostics: Conversion counts to fold into the batch metrics (trajectory breaks, missing ids...).
        current_version: The model version the trainer is about to update; with it the metrics include the
            samples' staleness (``current_version - sample.model_version``).

    Returns:
        Samples in input rollout order then step order, and metrics: ``n_samples``, ``n_rollouts``,
        ``n_groups``, ``reward_mean/std/min/max`` (final rewards per rollout), ``credit_mean``,
        ``advantage_mean/std``, ``zero_std_group_fraction``, ``dropped_groups``, ``dropped_samples``,
        ``rollouts_without_reward``, ``response_tokens``, ``trained_tokens``, the diagnostics' counts and, with
        ``current_version``, ``staleness_mean``, ``staleness_max`` (over samples whose version is known) and
        ``samples_without_version``.

    Raises:
        ValueError: Unknown strategy/estimator, a rollout whose transitions disagree on the final reward, a
            strategy or estimator returning the wrong number of values or non-finite ones, or a missing final
            reward with ``missing_final_reward='raise'``.
    """
    config = config or CreditConfig()
    strategy = get_credit_strategy(credit) if isinstance(credit, str) else credit
    estimate = get_advantage_estimator(estimator) if isinstance(estimator, str) else estimator
    # Ours return floats (tested); a caller's function may return ints or numpy numbers, made floats here.
    check_credits, check_advantages = strategy not in _OURS, estimate not in _OURS
    # A caller's transitions made without validation are validated here (see store._common.revalidate_unchecked).
    transitions = revalidate_unchecked(transitions, Transition, "transitions")

    # Phases: group by rollout -> credit per rollout, grouped by task -> estimate advantages -> samples -> metrics.
    grouped = _assign_credit(_by_rollout(transitions), strategy, config, check_credits)
    estimated = _estimate_advantages(grouped.groups, estimate, config)
    made = _make_samples(grouped.groups, estimated, check_advantages)
    single = _warn_no_signal(grouped, estimated, made, estimator, config.equal_tolerance)
    metrics = _batch_metrics(grouped, estimated, made, single, config)
    if current_version is not None:
        metrics.update(staleness_metrics(made.samples, current_version))
    if diagnostics is not None:
        metrics.update(diagnostics.as_metrics())
    return fast_model(TrainingBatch, {"samples": made.samples, "metrics": metrics})


async def build_batch_from_store(
    store: LightningStore,
    rollout_ids: Sequence[str],
    transition_config: TransitionConfig | None = None,
    credit: str | CreditStrategy = "identical",
    estimator: str | AdvantageEstimator = "grpo",
    config: CreditConfig | None = None,
    *,
    current_version: int | None = None,
) -> TrainingBatch:
    """Read the rollouts' last attempts from ``store`` and build a `TrainingBatch` (see `build_training_batch`).

    Args:
        store: Any `LightningStore`.
        rollout_ids: Finished rollouts to train on.
        transition_config: Spans -> transitions settings.
        credit: Credit strategy name or function.
        estimator: Advantage estimator name or function.
        config: Credit settings.
        current_version: The trainer's model version, for staleness metrics (see `build_training_batch`).

    Returns:
        The batch; its metrics include the conversion diagnostics (``trajectory_breaks``, ...).
    """
    results = await results_from_store(store, rollout_ids, transition_config)
    return build_batch_from_results(results, credit, estimator, config, current_version=current_version)


def build_batch_from_results(
    results: Sequence[TransitionResult],
    credit: str | CreditStrategy = "identical",
    estimator: str | AdvantageEstimator = "grpo",
    config: CreditConfig | None = None,
    *,
    current_version: int | None = None,
) -> TrainingBatch:
    """Build a `TrainingBatch` from already converted attempts (e.g. `results_from_store`), diagnostics included.

    Args:
        results: One `TransitionResult` per attempt.
        credit: Credit strategy name or function.
        estimator: Advantage estimator name or function.
        config: Credit settings.
        current_version: The trainer's model version, for staleness metrics (see `build_training_batch`).
    """
    diagnostics = TransitionDiagnostics()
    transitions: list[Transition] = []
    for result in results:
        diagnostics.add(result.diagnostics)
        transitions.extend(result.transitions)
    return build_training_batch(
        transitions, credit, estimator, config, diagnostics=diagnostics, current_version=current_version
    )
