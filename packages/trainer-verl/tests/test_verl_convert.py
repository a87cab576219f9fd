"""to_data_proto: every tensor of a small batch checked by hand (padding, masks, positions, groups, score)."""

from __future__ import annotations

import logging

import pytest
import torch

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_verl import SequenceTooLongError, to_data_proto

torch.set_num_threads(1)


def close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32))


def sample(prompt, response, mask, credit, group, *, logprobs=None, advantage=0.0, rollout="r", step=0, agent=None):
    return TrainingSample(
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        credit=credit,
        advantage=advantage,
        group_id=group,
        rollout_id=rollout,
        attempt_id=f"{rollout}-a1",
        step_index=step,
        agent_name=agent,
    )


@pytest.fixture
def batch() -> TrainingBatch:
    return TrainingBatch(
        samples=[
            sample([11, 12, 13], [21, 22], [1, 1], 1.0, "g1", logprobs=[-0.1, -0.2], advantage=0.7, rollout="ra"),
            # trajectory mode: 31 generated, 32 33 an observation, 34 generated, 35 observation at the end
            sample(
                [14],
                [31, 32, 33, 34, 35],
                [1, 0, 0, 1, 0],
                0.5,
                "g2",
                logprobs=[-1.0, 0, 0, -2.0, 0],
                advantage=-0.3,
                rollout="rb",
                step=2,
                agent="coder",
            ),
        ]
    )


def test_layout_is_left_padded_prompts_and_right_padded_responses(batch: TrainingBatch) -> None:
    dp = to_data_proto(batch, max_prompt_length=4, max_response_length=6, pad_token_id=0)
    b = dp.batch
    assert len(dp) == 2
    assert b["prompts"].tolist() == [[0, 11, 12, 13], [0, 0, 0, 14]]
    assert b["responses"].tolist() == [[21, 22, 0, 0, 0, 0], [31, 32, 33, 34, 35, 0]]
    assert b["input_ids"].tolist() == [[0, 11, 12, 13, 21, 22, 0, 0, 0, 0], [0, 0, 0, 14, 31, 32, 33, 34, 35, 0]]
    # observation tokens are real tokens for attention; only padding is 0
    assert b["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1, 1, 0]]
    # clip(cumsum - 1, 0): 0 on left padding, counting from the first real token, flat on right padding
    assert b["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 4, 4, 4, 4], [0, 0, 0, 0, 1, 2, 3, 4, 5, 5]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0, 0, 0], [1, 0, 0, 1, 0, 0]]
    assert b["input_ids"].dtype == torch.long and b["token_level_scores"].dtype == torch.float32


def test_score_lands_on_last_trained_token(batch: TrainingBatch) -> None:
    dp = to_data_proto(batch, max_prompt_length=4, max_response_length=6, pad_token_id=0)
    # sample 2 ends on an observation token (index 4): the credit goes to index 3, the last generated token
    expected = [[0, 1.0, 0, 0, 0, 0], [0, 0, 0, 0.5, 0, 0]]
    assert dp.batch["token_level_scores"].tolist() == expected
    assert dp.batch["token_level_rewards"].tolist() == expected


def test_logprobs_advantages_and_ids(batch: TrainingBatch) -> None:
    dp = to_data_proto(batch, max_prompt_length=4, max_response_length=6, pad_token_id=0)
    b = dp.batch
    close(b["rollout_log_probs"], [[-0.1, -0.2, 0, 0, 0, 0], [-1.0, 0, 0, -2.0, 0, 0]])
    assert torch.equal(b["old_log_probs"], b["rollout_log_probs"])
    close(b["advantages"], [[0.7, 0.7, 0, 0, 0, 0], [-0.3, 0, 0, -0.3, 0, 0]])
    close(b["returns"], [[1.0, 1.0, 0, 0, 0, 0], [0.5, 0, 0, 0.5, 0, 0]])
    nt = dp.non_tensor_batch
    assert nt["uid"].tolist() == ["g1", "g2"]
    assert nt["rollout_id"].tolist() == ["ra", "rb"]
    assert nt["attempt_id"].tolist() == ["ra-a1", "rb-a1"]
    assert nt["step_index"].tolist() == [0, 2]
    assert nt["agent_name"].tolist() == [None, "coder"]
    assert dp.meta_info["agentlightning/num_prompts_truncated"] == 0


def test_options_pad_to_batch_and_leave_out_optional_keys(batch: TrainingBatch) -> None:
    dp = to_data_proto(
        batch,
        max_prompt_length=64,
        max_response_length=64,
        pad_token_id=7,
        pad_to_max=False,
        include_old_log_probs=False,
        include_advantages=False,
        meta_info={"temperature": 0.7},
    )
    assert dp.batch["prompts"].shape == (2, 3) and dp.batch["responses"].shape == (2, 5)
    assert dp.batch["prompts"][1].tolist() == [7, 7, 14]
    keys = set(dp.batch.keys())  # TensorDict refuses `in`; compare a set of keys
    assert "old_log_probs" not in keys and "advantages" not in keys and "rollout_log_probs" in keys
    assert dp.meta_info["temperature"] == 0.7


def test_without_logprobs_no_logprob_keys() -> None:
    b = TrainingBatch(samples=[sample([1], [2, 3], [1, 1], 1.0, "g")])
    dp = to_data_proto(b, max_prompt_length=2, max_response_length=2, pad_token_id=0)
    keys = set(dp.batch.keys())
    assert "rollout_log_probs" not in keys and "old_log_probs" not in keys


def test_too_long_errors_by_default(batch: TrainingBatch) -> None:
    with pytest.raises(SequenceTooLongError, match=r"sample 1 \(rollout 'rb', step 2\).*5 tokens"):
        to_data_proto(batch, max_prompt_length=4, max_response_length=4, pad_token_id=0)


def test_truncate_keeps_prompt_tail_and_response_head(batch: TrainingBatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        dp = to_data_proto(batch, max_prompt_length=2, max_response_length=3, pad_token_id=0, truncation="truncate")
    assert dp.batch["prompts"].tolist() == [[12, 13], [0, 14]]
    assert dp.batch["responses"].tolist() == [[21, 22, 0], [31, 32, 33]]
    assert dp.batch["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0]]
    # the last kept trained token of sample 2 is now index 0
    assert dp.batch["token_level_scores"].tolist() == [[0, 1.0, 0], [0.5, 0, 0]]
    assert dp.meta_info["agentlightning/num_prompts_truncated"] == 1
    assert dp.meta_info["agentlightning/num_responses_truncated"] == 1
    assert "truncated 1 prompt(s)" in caplog.text


def test_truncation_that_removes_every_trained_token_is_an_error() -> None:
    b = TrainingBatch(samples=[sample([1], [2, 3, 4], [0, 0, 1], 1.0, "g", rollout="rz")])
    with pytest.raises(ValueError, match=r"rollout 'rz'.*no trained token.*after truncation"):
        to_data_proto(b, max_prompt_length=2, max_response_length=2, pad_token_id=0, truncation="truncate")


@pytest.mark.parametrize(
    ("samples", "kwargs", "message"),
    [
        ([], {}, "empty TrainingBatch"),
        ([sample([1], [2], [1], 1.0, "g")], {"max_prompt_length": 0}, "must be >= 1"),
        ([sample([1], [2], [1], 1.0, "g")], {"truncation": "drop"}, "truncation must be"),
        ([sample([], [2], [1], 1.0, "g")], {}, "empty prompt"),
        ([sample([1], [2, 3], [0, 0], 1.0, "g")], {}, "no trained token"),
        ([sample([1], [2], [2], 1.0, "g")], {}, "only 0 and 1"),
        ([sample([1], [2], [1], 1.0, "g", logprobs=[-1.0]), sample([1], [2], [1], 0.0, "g")], {}, "1 of 2 samples"),
    ],
)
def test_bad_input_is_refused_with_a_named_problem(samples, kwargs, message) -> None:
    args = {"max_prompt_length": 4, "max_response_length": 4, "pad_token_id": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        to_data_proto(TrainingBatch(samples=samples), **args)
