"""A training run evaluates the last weights once: when the loop's last evaluation was greedy and scored the weights
the run ended with (the ``eval_every`` point of the last iteration, or the evaluation before RL when no update changed
the weights), it is the evaluation after RL too (the quickstart test checks it end to end)."""

from __future__ import annotations

from types import SimpleNamespace

from agentlightning import IterationReport
from agentlightning_torch.runkit._run import scored_last_weights


def _eval(iteration: int, version: int, *, greedy: bool = True) -> IterationReport:
    return IterationReport(
        iteration=iteration, model_version=version, rollouts=4, finished=4, reward_mean=0.5, calls_per_rollout=1.0,
        multi_call_rate=0.0, seconds=1.0, metrics={"greedy": float(greedy)}, kind="eval",
    )  # fmt: skip


def _loop(version: int, *evaluations: IterationReport) -> SimpleNamespace:
    return SimpleNamespace(model_version=version, evaluations=list(evaluations))


def test_the_last_iterations_evaluation_is_the_one_after_rl() -> None:
    last = _eval(4, 3)
    assert scored_last_weights(_loop(3, _eval(0, 0), _eval(2, 2), last)) is last


def test_weights_changed_since_the_last_evaluation_need_an_evaluation() -> None:
    assert scored_last_weights(_loop(4, _eval(0, 0), _eval(2, 2))) is None  # updates after iteration 2
    assert scored_last_weights(_loop(0)) is None  # no evaluation at all


def test_a_sampled_evaluation_is_not_the_greedy_one_after_rl() -> None:
    assert scored_last_weights(_loop(3, _eval(0, 0), _eval(4, 3, greedy=False))) is None


def test_no_update_at_all_reuses_the_evaluation_before_rl() -> None:
    before = _eval(0, 0)  # every iteration skipped its update (no training sample): the weights never changed
    assert scored_last_weights(_loop(0, before)) is before
