"""LightningRL credit strategies, advantage estimators and batch building (worked examples)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from agentlightning import (
    CreditConfig,
    TrainingSample,
    Transition,
    build_training_batch,
    get_advantage_estimator,
    get_credit_strategy,
    register_advantage_estimator,
    register_credit_strategy,
)
from agentlightning.credit import advantage_estimator_names, credit_strategy_names
from agentlightning.transitions import TransitionDiagnostics


def tr(
    rollout: str,
    step: int,
    final: float | None,
    reward: float | None = None,
    group: str | None = "g",
    response: Sequence[int] = (5, 6),
) -> Transition:
    return Transition(
        rollout_id=rollout,
        attempt_id=f"at-{rollout}",
        group_id=group,
        agent_name="a",
        step_index=step,
        prompt_token_ids=[1, 2],
        response_token_ids=list(response),
        response_mask=[1] * len(response),
        response_logprobs=[-0.5] * len(response),
        intermediate_reward=reward,
        final_reward=final,
    )


def rollout(name: str, n: int, final: float | None, rewards: Sequence[float | None] = (), group: str | None = "g"):
    rewards = list(rewards) + [None] * (n - len(rewards))
    return [tr(name, i, final, rewards[i], group) for i in range(n)]


def by_rollout(samples: Sequence[TrainingSample], field: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for s in samples:
        out.setdefault(s.rollout_id, []).append(getattr(s, field))
    return out


def test_strategies_worked_examples() -> None:
    steps = rollout("r", 3, 2.0, [0.5, None, 1.0])
    config = CreditConfig(gamma=0.5)
    assert get_credit_strategy("identical")(steps, 2.0, config) == [2.0, 2.0, 2.0]
    assert get_credit_strategy("discounted")(steps, 2.0, config) == [0.5, 1.0, 2.0]
    # G2 = 1 + 2 = 3; G1 = 0 + 0.5 * 3 = 1.5; G0 = 0.5 + 0.5 * 1.5 = 1.25
    assert get_credit_strategy("per_step")(steps, 2.0, config) == [1.25, 1.5, 3.0]
    assert get_credit_strategy("per_step")(steps, 2.0, CreditConfig()) == [3.5, 3.0, 3.0]


def test_grpo_normalises_per_rollout_not_per_transition() -> None:
    # a long failing rollout must not pull the mean towards failure
    batch = build_training_batch(rollout("long", 10, 0.0) + rollout("short", 1, 1.0))
    adv = by_rollout(batch.samples, "advantage")
    assert adv["short"] == [pytest.approx(1.0, abs=1e-4)]
    assert adv["long"] == [pytest.approx(-1.0, abs=1e-4)] * 10
    assert batch.metrics["n_samples"] == 11 and batch.metrics["n_rollouts"] == 2
    assert batch.metrics["reward_mean"] == 0.5 and batch.metrics["zero_std_group_fraction"] == 0.0


def test_grpo_without_std_only_centres() -> None:
    batch = build_training_batch(
        rollout("a", 2, 3.0) + rollout("b", 1, 1.0), config=CreditConfig(normalize_by_std=False)
    )
    assert by_rollout(batch.samples, "advantage") == {"a": [1.0, 1.0], "b": [-1.0]}
    assert by_rollout(batch.samples, "credit") == {"a": [3.0, 3.0], "b": [1.0]}


def test_grpo_per_step_uses_rollout_weighted_group_statistics() -> None:
    steps = rollout("a", 2, 0.0, [1.0, None]) + rollout("b", 1, 0.0)
    batch = build_training_batch(steps, credit="per_step", config=CreditConfig(normalize_by_std=False))
    # credits a: [1, 0], b: [0]; rollout means 0.5 and 0 -> group mean 0.25
    assert by_rollout(batch.samples, "advantage") == {"a": [0.75, -0.25], "b": [-0.25]}


def test_groups_are_separate_and_ungrouped_rollouts_stand_alone() -> None:
    steps = rollout("a", 1, 1.0, group="g1") + rollout("b", 1, 0.0, group="g1")
    steps += rollout("c", 1, 5.0, group="g2") + rollout("d", 1, 5.0, group="g2") + rollout("e", 1, 1.0, group=None)
    batch = build_training_batch(steps)
    adv = by_rollout(batch.samples, "advantage")
    assert adv["a"][0] > 0 > adv["b"][0]
    assert adv["c"] == adv["d"] == adv["e"] == [0.0]
    assert {s.rollout_id: s.group_id for s in batch.samples} == {"a": "g1", "b": "g1", "c": "g2", "d": "g2", "e": "e"}
    assert batch.metrics["n_groups"] == 3 and batch.metrics["zero_std_group_fraction"] == pytest.approx(2 / 3)


def test_drop_equal_groups() -> None:
    steps = rollout("a", 2, 1.0, group="g1") + rollout("b", 1, 0.0, group="g1") + rollout("c", 3, 1.0, group="g2")
    steps += rollout("d", 1, 1.0, group="g2")
    batch = build_training_batch(steps, config=CreditConfig(drop_equal_groups=True))
    assert {s.rollout_id for s in batch.samples} == {"a", "b"}
    assert batch.metrics["dropped_groups"] == 1 and batch.metrics["dropped_samples"] == 4


def test_rloo_and_reinforce_pp_and_passthrough() -> None:
    steps = rollout("a", 1, 3.0) + rollout("b", 2, 1.0) + rollout("c", 1, 2.0)
    rloo = by_rollout(build_training_batch(steps, estimator="rloo").samples, "advantage")
    assert rloo == {"a": [1.5], "b": [-1.5, -1.5], "c": [0.0]}  # 3 - (1+2)/2, 1 - (3+2)/2, 2 - (3+1)/2
    single = build_training_batch(rollout("x", 2, 1.0, group="solo"), estimator="rloo")
    assert [s.advantage for s in single.samples] == [0.0, 0.0]
    rpp = build_training_batch(steps, estimator="reinforce_pp", config=CreditConfig(normalize_by_std=False))
    # batch mean over the 4 transitions: (3 + 1 + 1 + 2) / 4 = 1.75
    assert by_rollout(rpp.samples, "advantage") == {"a": [1.25], "b": [-0.75, -0.75], "c": [0.25]}
    passthrough = build_training_batch(steps, estimator="passthrough")
    assert [s.advantage for s in passthrough.samples] == [3.0, 1.0, 1.0, 2.0]


def test_all_equal_groups_warn_that_learning_stalled(caplog: pytest.LogCaptureFixture) -> None:
    steps = rollout("a", 1, 1.0, group="g1") + rollout("b", 2, 1.0, group="g1") + rollout("c", 1, 0.0, group="g2")
    steps += rollout("d", 1, 0.0, group="g2")
    with caplog.at_level(logging.WARNING, logger="agentlightning"):
        batch = build_training_batch(steps)
    assert any("learning has stalled" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert batch.metrics["zero_std_group_fraction"] == 1.0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentlightning"):
        build_training_batch(steps + rollout("e", 1, 0.0, group="g1"))  # one group now has signal
    assert not any("learning has stalled" in r.getMessage() for r in caplog.records)


def test_missing_final_reward_policies(caplog: pytest.LogCaptureFixture) -> None:
    steps = rollout("a", 1, 1.0) + rollout("b", 1, None)
    with caplog.at_level(logging.WARNING, logger="agentlightning"):
        zero = build_training_batch(steps)
    assert by_rollout(zero.samples, "credit") == {"a": [1.0], "b": [0.0]}
    assert zero.metrics["rollouts_without_reward"] == 1
    assert any("no final reward" in r.getMessage() for r in caplog.records)
    dropped = build_training_batch(steps, config=CreditConfig(missing_final_reward="drop"))
    assert {s.rollout_id for s in dropped.samples} == {"a"}
    with pytest.raises(ValueError, match="b"):
        build_training_batch(steps, config=CreditConfig(missing_final_reward="raise"))


def test_inconsistent_final_rewards_are_rejected() -> None:
    with pytest.raises(ValueError, match="disagree on the final reward"):
        build_training_batch([tr("a", 0, 1.0), tr("a", 1, 0.0)])


def test_steps_are_sorted_and_samples_validate() -> None:
    steps = rollout("a", 3, 1.0, [0.5, 0.0, 0.0]) + rollout("b", 1, 0.0)
    batch = build_training_batch(list(reversed(steps)), credit="per_step", estimator="passthrough")
    assert [(s.rollout_id, s.step_index, s.credit) for s in batch.samples] == [
        ("b", 0, 0.0),
        ("a", 0, 1.5),
        ("a", 1, 1.0),
        ("a", 2, 1.0),
    ]
    for sample in batch.samples:
        assert TrainingSample.model_validate(sample.model_dump()) == sample
    assert batch.metrics["response_tokens"] == 8 and batch.metrics["trained_tokens"] == 8


def test_samples_carry_their_model_version_and_the_batch_reports_staleness() -> None:
    steps = [
        t.model_copy(update={"model_version": v})
        for t, v in zip(
            rollout("a", 2, 1.0) + rollout("b", 1, 0.0) + rollout("c", 1, 0.5), [5, 3, 4, None], strict=True
        )
    ]
    batch = build_training_batch(steps, current_version=5)
    assert [s.model_version for s in batch.samples] == [5, 3, 4, None]
    for sample in batch.samples:
        assert TrainingSample.model_validate(sample.model_dump()) == sample
    assert batch.metrics["staleness_mean"] == pytest.approx(1.0)  # lags 0, 2, 1 (one unknown)
    assert batch.metrics["staleness_max"] == 2.0 and batch.metrics["samples_without_version"] == 1.0
    assert "staleness_mean" not in build_training_batch(steps).metrics  # no current version: not measured


def test_diagnostics_fold_into_metrics() -> None:
    diag = TransitionDiagnostics(trajectory_breaks=3, missing_token_ids=1)
    batch = build_training_batch(rollout("a", 1, 1.0), diagnostics=diag)
    assert batch.metrics["trajectory_breaks"] == 3 and batch.metrics["missing_token_ids"] == 1


def test_registries() -> None:
    assert {"identical", "discounted", "per_step"} <= set(credit_strategy_names())
    assert {"grpo", "rloo", "reinforce_pp", "passthrough"} <= set(advantage_estimator_names())
    with pytest.raises(ValueError, match=r"unknown credit strategy 'nope'; registered: .*identical"):
        get_credit_strategy("nope")
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        build_training_batch(rollout("a", 1, 1.0), estimator="nope")

    @register_credit_strategy("test_last_only")
    def last_only(transitions: Sequence[Transition], final: float, config: CreditConfig) -> list[float]:
        return [0.0] * (len(transitions) - 1) + [final]

    @register_advantage_estimator("test_double")
    def double(groups: list[list[list[float]]], config: CreditConfig) -> list[list[list[float]]]:
        return [[[2 * c for c in r] for r in g] for g in groups]

    batch = build_training_batch(rollout("a", 2, 1.5), credit="test_last_only", estimator="test_double")
    assert [s.advantage for s in batch.samples] == [0.0, 3.0]
    assert get_advantage_estimator("test_double") is double
    with pytest.raises(ValueError, match="already registered"):
        register_credit_strategy("test_last_only")(get_credit_strategy("identical"))
    register_credit_strategy("test_last_only", replace=True)(get_credit_strategy("identical"))
    assert get_credit_strategy("test_last_only") is get_credit_strategy("identical")


def test_bad_strategy_output_is_rejected() -> None:
    with pytest.raises(ValueError, match="returned 1 values for 2"):
        build_training_batch(rollout("a", 2, 1.0), credit=lambda steps, final, config: [final])
    with pytest.raises(ValueError, match="non-finite"):
        build_training_batch(rollout("a", 1, 1.0), credit=lambda steps, final, config: [float("inf")])


def test_samples_keep_training_sample_rules_on_the_fast_path() -> None:
    # Samples are built without validation (agentlightning._fast): what a strategy or estimator returns is made
    # the floats a TrainingSample holds, and a caller's transitions made without validation are validated first.
    batch = build_training_batch(
        rollout("a", 2, 1.0),
        credit=lambda steps, final, config: [1, True],  # ints: pydantic would make them floats
        estimator=lambda groups, config: [[[0, 2] for _ in group] for group in groups],
    )
    assert [(type(s.credit), s.credit, type(s.advantage), s.advantage) for s in batch.samples] == [
        (float, 1.0, float, 0.0),
        (float, 1.0, float, 2.0),
    ]
    for sample in batch.samples:
        assert TrainingSample.model_validate(sample.model_dump()).model_dump_json() == sample.model_dump_json()
    with pytest.raises(ValueError, match="credit strategy returned a value that is not a number"):
        build_training_batch(rollout("a", 1, 1.0), credit=lambda steps, final, config: ["lots"])
    with pytest.raises(ValueError, match="advantage estimator returned a value that is not a number"):
        build_training_batch(rollout("a", 1, 1.0), estimator=lambda groups, config: [[[None]] for _ in groups])
    unchecked = tr("a", 0, 1.0).model_copy(update={"response_mask": [1]})  # two response tokens, one mask entry
    with pytest.raises(ValidationError, match="response_mask must have one entry per response token"):
        build_training_batch([unchecked])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gamma": 0.0},
        {"gamma": 1.5},
        {"eps": 0.0},
        {"eps": -1.0},
        {"equal_tolerance": -1.0},
        {"missing_final_reward": "x"},
    ],
)
def test_credit_config_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=next(iter(kwargs))):
        CreditConfig(**kwargs)


def test_empty_input() -> None:
    batch = build_training_batch([])
    assert batch.samples == [] and batch.metrics["n_samples"] == 0


async def test_build_batch_from_store() -> None:
    from agentlightning import LLMCall, Span, build_batch_from_store
    from agentlightning import semconv as sc
    from agentlightning.store import MemoryStore

    store = MemoryStore()
    ids = []
    for i, reward in enumerate([1.0, 0.0, 1.0, 1.0]):
        ro = await store.enqueue_rollout({"i": i}, group_id=f"task-{i // 2}", rollout_id=f"ro-{i}")
        claim = await store.dequeue_rollout("w")
        assert claim is not None
        att = claim.attempt.attempt_id
        common = {"rollout_id": ro.rollout_id, "attempt_id": att, "trace_id": "ef" * 16}
        spans = [
            Span(**common, sequence_id=0, span_id="1" * 16, name="chat", start_time=1.0, end_time=2.0,
                 attributes={sc.SPAN_KIND: sc.KIND_LLM, sc.GEN_AI_RESPONSE_ID: f"resp-{i}"}),
            Span(**common, sequence_id=1, span_id="2" * 16, name="reward", start_time=3.0, end_time=3.0,
                 attributes={sc.SPAN_KIND: sc.KIND_REWARD, sc.REWARD_VALUE: reward, sc.REWARD_FINAL: True}),
        ]  # fmt: skip
        await store.add_spans(spans)
        await store.add_llm_calls(
            [
                LLMCall(call_id=f"c-{i}", rollout_id=ro.rollout_id, attempt_id=att, response_id=f"resp-{i}",
                        prompt_token_ids=[1, 2], response_token_ids=[3 + i], response_logprobs=[-0.1])
            ]
        )  # fmt: skip
        await store.finish_attempt(ro.rollout_id, att, "succeeded")
        ids.append(ro.rollout_id)
    batch = await build_batch_from_store(store, ids, config=CreditConfig(drop_equal_groups=True))
    assert [s.rollout_id for s in batch.samples] == ["ro-0", "ro-1"]
    assert batch.samples[0].advantage > 0 > batch.samples[1].advantage
    assert batch.metrics["dropped_groups"] == 1 and batch.metrics["joined_by_response_id"] == 4
    assert batch.metrics["trajectory_breaks"] == 0
    await store.close()


def test_each_policy_is_normalised_within_its_own_groups() -> None:
    """A rollout's writer and rewriter steps train two adapters: each is compared with its own policy's steps only."""

    def step(name: str, index: int, final: float, policy: str) -> Transition:
        return tr(name, index, final).model_copy(update={"policy": policy, "agent_name": policy})

    transitions = [
        step("A", 0, 1.0, "writer"),
        step("A", 1, 1.0, "rewriter"),
        step("B", 0, 0.0, "writer"),
        step("B", 1, 0.0, "rewriter"),
        step("C", 0, 1.0, "writer"),  # only the writer acted in C
    ]
    batch = build_training_batch(transitions)
    adv = {(s.rollout_id, s.policy): s.advantage for s in batch.samples}
    # rewriter: A and B only (rewards 1, 0): +1 / -1; pooled with the writer's C it would be +0.71 / -1.41
    assert adv[("A", "rewriter")] == pytest.approx(1.0, abs=1e-4)
    assert adv[("B", "rewriter")] == pytest.approx(-1.0, abs=1e-4)
    # writer: A, B, C (rewards 1, 0, 1)
    assert adv[("A", "writer")] == pytest.approx(adv[("C", "writer")]) == pytest.approx(0.7071, abs=1e-3)
    assert adv[("B", "writer")] == pytest.approx(-1.4142, abs=1e-3)
    assert {s.group_id for s in batch.samples} == {"g"}
