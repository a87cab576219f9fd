"""Judgements → rewards on the transitions, right before credit assignment.

A group score becomes the rollout's final reward (``weight * judge + (1 - weight) * checker``); a step score is
added to the intermediate reward of the transition that trains that LLM call (found by its span id or call id), which
the ``per_step`` credit strategy turns into return-to-go. A rollout the judge could not score is left out of the
batch, with its reason logged and counted: its reward is missing, never 0 and never a guess.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import cast

from agentlightning._fast import new_transition
from agentlightning._training_models import Transition, TransitionFields
from agentlightning.judge._config import JudgeConfig
from agentlightning.judge._judge import JudgeOutcome, LLMJudge, RolloutJudgement
from agentlightning.judge._prompts import Score
from agentlightning.store import LightningStore
from agentlightning.transitions import TransitionResult

__all__ = ["JudgeFailedError", "apply_judgements", "check_failures", "final_reward", "judge_results", "rewarded"]

logger = logging.getLogger(__name__)


class JudgeFailedError(RuntimeError):
    """Most of an iteration's rollouts could not be judged: training on the rest would train on a biased few."""


def _step_score(transition: Transition, steps: dict[str, Score]) -> float | None:
    ids = [*transition.metadata.get("span_ids", []), *transition.call_ids]
    scores = [steps[i].score for i in ids if i in steps]
    return sum(scores) if scores else None


def final_reward(result: TransitionResult, judgement: RolloutJudgement, groups: bool, weight: float) -> float | str:
    """The rollout's final reward from its judgement (``groups``: the judge scored groups; ``weight``: its share,
    the checker's final reward the rest), or why it has none."""
    checker = result.final_reward
    if not groups:
        # step scores alone: the return is their sum (a checker's final reward, when there is one, is kept)
        return 0.0 if checker is None else checker
    if judgement.score is None:
        return "the judge gave the rollout no score"
    if weight == 1.0:
        return judgement.score
    if checker is None:
        return f"weight {weight} mixes in the checker's final reward, and the rollout reported none"
    return weight * judgement.score + (1.0 - weight) * checker


def rewarded(result: TransitionResult, judgement: RolloutJudgement, final: float) -> TransitionResult:
    """``result`` with ``final`` as every transition's final reward and each judged step's score added to its
    intermediate reward."""
    transitions: list[Transition] = []
    for transition in result.transitions:
        update: dict[str, object] = {"final_reward": final}
        step = _step_score(transition, judgement.steps)
        if step is not None:
            previous = transition.intermediate_reward
            update["intermediate_reward"] = step if previous is None else previous + step
        # a fast-built record (no fields set to copy): rebuilt from its values, token-id lists shared as before
        transitions.append(new_transition(cast(TransitionFields, {**transition.__dict__, **update})))
    return dataclasses.replace(result, transitions=transitions, final_reward=final)


def apply_judgements(
    results: Sequence[TransitionResult], outcome: JudgeOutcome, config: JudgeConfig
) -> tuple[list[TransitionResult], dict[str, str]]:
    """The results with the judge's rewards; rollouts without a judgement are left out.

    Returns:
        The rewarded results (input order) and, by rollout id, why each rollout left out has no reward.
    """
    kept: list[TransitionResult] = []
    missing: dict[str, str] = {}
    for result in results:
        rollout_id = result.rollout_id
        judgement = outcome.judgements.get(rollout_id) if rollout_id is not None else None
        if rollout_id is None:
            continue  # an attempt without spans or calls: nothing to train, nothing to reward
        if judgement is None:
            missing[rollout_id] = "the judge was not asked about this rollout"
            continue
        if judgement.missing is not None:
            missing[rollout_id] = judgement.missing
            continue
        final = final_reward(result, judgement, config.judges_groups, config.weight)
        if isinstance(final, str):
            missing[rollout_id] = final
            continue
        kept.append(rewarded(result, judgement, final))
    for rollout_id, reason in list(missing.items())[:5]:
        logger.warning("rollout %s has no reward (not trained): %s", rollout_id, reason)
    if len(missing) > 5:
        logger.warning("... and %d more rollout(s) without a reward from the judge", len(missing) - 5)
    return kept, missing


def check_failures(total: int, missing: dict[str, str], config: JudgeConfig) -> None:
    """Stop when more than ``max_failure_ratio`` of ``total`` rollouts have no reward from the judge.

    Raises:
        JudgeFailedError: Naming how many failed and the first reason.
    """
    if total and len(missing) > config.max_failure_ratio * total:
        rollout_id, reason = next(iter(missing.items()))
        raise JudgeFailedError(
            f"the judge could not score {len(missing)} of {total} rollouts (more than "
            f"{config.max_failure_ratio:.0%}); stopping. First: rollout {rollout_id}: {reason}"
        )


async def judge_results(
    judge: LLMJudge, store: LightningStore, rollout_ids: Sequence[str], results: Sequence[TransitionResult]
) -> tuple[list[TransitionResult], dict[str, float]]:
    """What `RLLoop` does between reading the rollouts and credit assignment: judge them, reward the results.

    Returns:
        The rewarded results (rollouts without a judgement left out) and the iteration's ``judge_*`` metrics.

    Raises:
        JudgeFailedError: More than ``max_failure_ratio`` of the rollouts could not be judged.
    """
    outcome = await judge.judge(store, rollout_ids)
    kept, missing = apply_judgements(results, outcome, judge.config)
    metrics = outcome.counters.as_metrics()
    metrics["judge_rewards_missing"] = float(len(missing))
    check_failures(len(rollout_ids), missing, judge.config)
    return kept, metrics
