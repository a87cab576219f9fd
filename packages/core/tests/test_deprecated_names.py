"""One name per concept: the renamed public names still work for a release, with a DeprecationWarning."""

from __future__ import annotations

import warnings

import pytest

import agentlightning as agl
from agentlightning import runner as runner_module
from agentlightning import store as store_module
from agentlightning.credit import (
    advantage_estimator_names,
    canonical_estimator_name,
    get_advantage_estimator,
    is_group_estimator,
)
from agentlightning.runner import reward_from_result

TRANSITION = {
    "rollout_id": "ro",
    "attempt_id": "at",
    "step_index": 0,
    "response_mask": [1, 1],
    "final_reward": 1.0,
}
SAMPLE = {
    "response_mask": [1],
    "credit": 0.5,
    "advantage": 0.25,
    "group_id": "g",
    "rollout_id": "ro",
    "attempt_id": "at",
    "step_index": 0,
}


def test_transition_takes_and_gives_its_old_field_names_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning) as record:
        old = agl.Transition(**TRANSITION, prompt_ids=[1], response_ids=[2, 3], logprobs=[-0.5, -0.25], reward=0.5)  # pyright: ignore[reportCallIssue]
    assert [str(w.message) for w in record] == [
        f"Transition({old_name}=...) is deprecated: use {new_name}= (same meaning); it is removed in 0.3.0"
        for old_name, new_name in (
            ("prompt_ids", "prompt_token_ids"),
            ("response_ids", "response_token_ids"),
            ("logprobs", "response_logprobs"),
            ("reward", "intermediate_reward"),
        )
    ]
    new = agl.Transition(
        **TRANSITION,
        prompt_token_ids=[1],
        response_token_ids=[2, 3],
        response_logprobs=[-0.5, -0.25],
        intermediate_reward=0.5,
    )
    assert old == new
    for name, value in (("prompt_ids", [1]), ("response_ids", [2, 3]), ("logprobs", [-0.5, -0.25]), ("reward", 0.5)):
        with pytest.warns(DeprecationWarning, match=f"Transition.{name} is deprecated"):
            assert getattr(new, name) == value
    assert "prompt_ids" not in new.model_dump() and new.model_dump()["prompt_token_ids"] == [1]


def test_the_warning_points_at_the_callers_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agl.Transition(**TRANSITION, prompt_ids=[1], response_token_ids=[2, 3])  # pyright: ignore[reportCallIssue]
    assert [w.filename for w in caught] == [__file__]


def test_an_old_and_a_new_name_together_are_refused() -> None:
    with pytest.raises(ValueError, match="pass prompt_token_ids only"):
        agl.Transition(**TRANSITION, prompt_ids=[1], prompt_token_ids=[1], response_token_ids=[2, 3])  # pyright: ignore[reportCallIssue]


def test_training_sample_old_names_and_returns_is_the_credit() -> None:
    with pytest.warns(DeprecationWarning) as record:
        old = agl.TrainingSample(**SAMPLE, prompt_ids=[1], response_ids=[2], old_logprobs=[-1.0], returns=0.5)  # pyright: ignore[reportCallIssue]
    assert len(record) == 4
    new = agl.TrainingSample(**SAMPLE, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-1.0])
    assert old == new
    with pytest.warns(DeprecationWarning, match="TrainingSample.returns is deprecated: use TrainingSample.credit"):
        assert new.returns == new.credit == 0.5
    with pytest.warns(DeprecationWarning, match="TrainingSample.old_logprobs is deprecated"):
        assert new.old_logprobs == [-1.0]
    # a returns that is not the credit would be silently dropped: refused instead
    with (
        pytest.raises(ValueError, match=r"returns \(0.75\) differs from credit \(0.5\)"),
        pytest.warns(DeprecationWarning),
    ):
        agl.TrainingSample(**SAMPLE, prompt_token_ids=[1], response_token_ids=[2], returns=0.75)  # pyright: ignore[reportCallIssue]


def test_store_server_and_final_reward_aliases() -> None:
    with pytest.warns(DeprecationWarning, match="agentlightning.StoreServer is deprecated"):
        assert agl.StoreServer is agl.StoreServerProcess  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.warns(DeprecationWarning, match="agentlightning.store.StoreServer is deprecated"):
        assert store_module.StoreServer is agl.StoreServerProcess  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.warns(DeprecationWarning, match="use agentlightning.runner.reward_from_result"):
        from agentlightning.runner import final_reward  # pyright: ignore[reportAttributeAccessIssue]
    assert final_reward is reward_from_result
    with pytest.raises(AttributeError, match="no attribute 'StoreServe'"):
        _ = agl.StoreServe  # pyright: ignore[reportAttributeAccessIssue]


def test_served_store_process_is_the_store_server_for_tests() -> None:
    import agentlightning.testing as testing

    with pytest.warns(DeprecationWarning, match="agentlightning.testing.ServedStoreProcess is deprecated: use "):
        old = testing.ServedStoreProcess  # pyright: ignore[reportAttributeAccessIssue]
    assert old is testing.StoreServerProcessForTests and issubclass(old, agl.StoreServerProcess)
    with pytest.warns(DeprecationWarning, match="removed in 0.3.0"):
        from agentlightning.testing import ServedStoreProcess  # pyright: ignore[reportAttributeAccessIssue]
    assert ServedStoreProcess is testing.StoreServerProcessForTests
    assert "ServedStoreProcess" not in testing.__all__  # `import *` does not warn


def test_every_old_name_says_when_it_is_removed() -> None:
    """The warning names the removal version (0.3.0, as in CHANGELOG.md's "Deprecated" table)."""
    sample = agl.TrainingSample.model_validate({**SAMPLE, "prompt_token_ids": [1], "response_token_ids": [2]})
    transition = agl.Transition.model_validate({**TRANSITION, "prompt_token_ids": [1], "response_token_ids": [2, 3]})
    with pytest.warns(DeprecationWarning) as record:
        _ = agl.StoreServer  # pyright: ignore[reportAttributeAccessIssue]
        _ = store_module.StoreServer  # pyright: ignore[reportAttributeAccessIssue]
        _ = runner_module.final_reward  # pyright: ignore[reportAttributeAccessIssue]
        _ = (transition.prompt_ids, transition.response_ids, transition.logprobs, transition.reward)
        _ = (sample.prompt_ids, sample.response_ids, sample.old_logprobs, sample.returns)
    messages = [str(w.message) for w in record]
    assert len(messages) >= 11 and all(m.endswith("; it is removed in 0.3.0") for m in messages), messages


def test_one_estimator_name_and_one_definition_of_group_estimators() -> None:
    assert canonical_estimator_name("reinforce_plus_plus") == "reinforce_pp"
    assert get_advantage_estimator("reinforce_plus_plus") is get_advantage_estimator("reinforce_pp")
    assert "reinforce_plus_plus" not in advantage_estimator_names()
    assert [name for name in advantage_estimator_names() if is_group_estimator(name)] == ["grpo", "rloo"]
    assert is_group_estimator(get_advantage_estimator("grpo")) and not is_group_estimator("reinforce_plus_plus")
    assert not is_group_estimator("no-such-estimator")
    with pytest.raises(ValueError, match="samples_per_task=1 with estimator='rloo'"):
        agl.LoopConfig(samples_per_task=1, estimator="rloo")
