"""One name per concept: a renamed public name is renamed everywhere, with no deprecated alias (0.1.0 was never
published; ``CHANGELOG.md`` lists the renames)."""

from __future__ import annotations

from types import ModuleType

import pytest
from pydantic import ValidationError

import agentlightning as agl
from agentlightning import runner as runner_module
from agentlightning import store as store_module
from agentlightning import testing as testing_module
from agentlightning.credit import (
    advantage_estimator_names,
    canonical_estimator_name,
    get_advantage_estimator,
    is_group_estimator,
)

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


def test_transition_and_sample_refuse_their_old_field_names() -> None:
    """Renamed before any release: an old field name is an unknown field (refused, naming it), not an alias."""
    for old in ("prompt_ids", "response_ids", "logprobs", "reward"):
        with pytest.raises(ValidationError, match=old):
            agl.Transition.model_validate({**TRANSITION, "prompt_token_ids": [1], "response_token_ids": [2, 3], old: 1})
    for old in ("prompt_ids", "response_ids", "old_logprobs", "returns"):
        with pytest.raises(ValidationError, match=old):
            agl.TrainingSample.model_validate({**SAMPLE, "prompt_token_ids": [1], "response_token_ids": [2], old: 1})
    transition = agl.Transition.model_validate({**TRANSITION, "prompt_token_ids": [1], "response_token_ids": [2, 3]})
    sample = agl.TrainingSample.model_validate({**SAMPLE, "prompt_token_ids": [1], "response_token_ids": [2]})
    assert not any(hasattr(transition, old) for old in ("prompt_ids", "response_ids", "logprobs", "reward"))
    assert not any(hasattr(sample, old) for old in ("prompt_ids", "response_ids", "old_logprobs", "returns"))


@pytest.mark.parametrize(
    ("module", "old"),
    [
        (agl, "StoreServer"),
        (store_module, "StoreServer"),
        (runner_module, "final_reward"),
        (testing_module, "ServedStoreProcess"),
        (agl, "Algorithm"),
    ],
)
def test_the_old_module_names_are_gone(module: ModuleType, old: str) -> None:
    with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
        getattr(module, old)


def test_one_estimator_name_and_one_definition_of_group_estimators() -> None:
    assert canonical_estimator_name("reinforce_plus_plus") == "reinforce_pp"
    assert get_advantage_estimator("reinforce_plus_plus") is get_advantage_estimator("reinforce_pp")
    assert "reinforce_plus_plus" not in advantage_estimator_names()
    assert [name for name in advantage_estimator_names() if is_group_estimator(name)] == ["grpo", "rloo"]
    assert is_group_estimator(get_advantage_estimator("grpo")) and not is_group_estimator("reinforce_plus_plus")
    assert not is_group_estimator("no-such-estimator")
    with pytest.raises(ValueError, match="samples_per_task=1 with estimator='rloo'"):
        agl.LoopConfig(samples_per_task=1, estimator="rloo")
