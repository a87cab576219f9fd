"""Our DataProto through verl 0.9.1's own advantage estimators and PPO loss, checked against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.config import omega_conf_to_dataclass

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_verl import VerlTrainerConfig, to_data_proto

torch.set_num_threads(1)
S = 1 / math.sqrt(2)  # 0.5 / std([1, 0]) with torch's unbiased std


def sample(group: str, credit: float, mask: list[int], rollout: str) -> TrainingSample:
    return TrainingSample(
        prompt_token_ids=[5, 6],
        response_token_ids=list(range(10, 10 + len(mask))),
        response_mask=mask,
        response_logprobs=[-1.0] * len(mask),
        credit=credit,
        advantage=0.0,
        group_id=group,
        rollout_id=rollout,
        attempt_id=rollout + "-a",
        step_index=0,
    )


@pytest.fixture
def two_groups():
    """Group A: rewards 1, 0. Group B: rewards 2, 0, 1. Ragged lengths, one observation token."""
    batch = TrainingBatch(
        samples=[
            sample("A", 1.0, [1, 1], "a0"),
            sample("B", 2.0, [1, 0, 1], "b0"),
            sample("A", 0.0, [1, 1, 1], "a1"),
            sample("B", 0.0, [1], "b1"),
            sample("B", 1.0, [1, 1], "b2"),
        ]
    )
    return to_data_proto(batch, max_prompt_length=2, max_response_length=4, pad_token_id=0)


def expected_grpo() -> torch.Tensor:
    # A: mean 0.5, std 0.7071 -> +-0.7071 ; B: mean 1, std 1 -> 1, -1, 0 ; broadcast over response_mask
    return torch.tensor([[S, S, 0, 0], [1, 0, 1, 0], [-S, -S, -S, 0], [-1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)


def test_grpo_outcome_advantage_groups_by_uid(two_groups) -> None:
    adv, ret = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=two_groups.batch["token_level_rewards"],
        response_mask=two_groups.batch["response_mask"],
        index=two_groups.non_tensor_batch["uid"],
    )
    torch.testing.assert_close(adv, expected_grpo(), atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, adv)


def test_compute_advantage_from_ray_trainer_uses_uid(two_groups) -> None:
    cfg = omega_conf_to_dataclass(VerlTrainerConfig(model_path="unused").to_verl_config().algorithm)
    out = compute_advantage(two_groups, adv_estimator="grpo", config=cfg)
    torch.testing.assert_close(out.batch["advantages"], expected_grpo(), atol=1e-5, rtol=0)


def test_grouping_really_comes_from_uid(two_groups) -> None:
    # one group for everyone: mean 0.8, std of [1, 2, 0, 0, 1] = 0.8367
    everyone = np.array(["same"] * 5, dtype=object)
    adv, _ = core_algos.compute_grpo_outcome_advantage(
        two_groups.batch["token_level_rewards"], two_groups.batch["response_mask"], everyone
    )
    std = float(torch.tensor([1.0, 2, 0, 0, 1]).std())
    assert adv[0, 0].item() == pytest.approx((1 - 0.8) / std, abs=1e-5)
    assert adv[1, 0].item() == pytest.approx((2 - 0.8) / std, abs=1e-5)


def test_rloo_accepts_the_batch(two_groups) -> None:
    cfg = omega_conf_to_dataclass(VerlTrainerConfig(model_path="unused").to_verl_config().algorithm)
    out = compute_advantage(two_groups, adv_estimator="rloo", config=cfg)
    adv = out.batch["advantages"]
    # leave-one-out baseline: A: 1 - 0 = 1 and 0 - 1 = -1 ; B: 2 - 0.5 = 1.5, 0 - 1.5, 1 - 1
    assert adv[0, 0].item() == pytest.approx(1.0) and adv[2, 2].item() == pytest.approx(-1.0)
    assert adv[1, 2].item() == pytest.approx(1.5) and adv[3, 0].item() == pytest.approx(-1.5)
    assert adv[4, 1].item() == pytest.approx(0.0)


def test_reinforce_plus_plus_returns_skip_observations_and_whiten() -> None:
    batch = TrainingBatch(samples=[sample("A", 1.0, [1, 0, 1], "x"), sample("A", 0.0, [1, 1], "y")])
    dp = to_data_proto(batch, max_prompt_length=2, max_response_length=3, pad_token_id=0)
    cfg = omega_conf_to_dataclass(
        VerlTrainerConfig(model_path="unused", algorithm="reinforce_pp").to_verl_config().algorithm
    )
    out = compute_advantage(dp, adv_estimator="reinforce_plus_plus", config=cfg)
    # gamma 1: every trained token's return is the sample's credit; 0 on the observation and padding
    torch.testing.assert_close(out.batch["returns"], torch.tensor([[1.0, 0, 1], [0, 0, 0]]))
    # whiten over the 4 trained tokens [1, 1, 0, 0]: mean 0.5, unbiased std sqrt(1/3)
    a = 0.5 / math.sqrt(1 / 3)
    torch.testing.assert_close(out.batch["advantages"], torch.tensor([[a, 0, a], [-a, -a, 0]]), atol=1e-4, rtol=0)


def test_gae_with_a_critic_hand_computed() -> None:
    batch = TrainingBatch(samples=[sample("A", 1.0, [1, 0, 1], "x"), sample("A", 0.0, [1, 1], "y")])
    dp = to_data_proto(batch, max_prompt_length=2, max_response_length=3, pad_token_id=0)
    dp.batch["values"] = torch.tensor([[0.5, 9.0, 0.25], [0.1, 0.2, 7.0]])
    cfg = omega_conf_to_dataclass(VerlTrainerConfig(model_path="unused", algorithm="ppo").to_verl_config().algorithm)
    out = compute_advantage(dp, adv_estimator="gae", gamma=1.0, lam=1.0, config=cfg)
    ret = out.batch["returns"]
    # x: t2 delta 1 - 0.25 = 0.75; t1 is an observation (skipped); t0 delta 0.25 - 0.5 = -0.25 -> 0.5
    #    returns = adv + value = 1.0 on both trained tokens
    # y: t1 delta 0 - 0.2 = -0.2; t0 delta 0.2 - 0.1 = 0.1 -> -0.1 ; returns 0.0 on both
    assert ret[0, 0].item() == pytest.approx(1.0) and ret[0, 2].item() == pytest.approx(1.0)
    assert ret[1, 0].item() == pytest.approx(0.0, abs=1e-6) and ret[1, 1].item() == pytest.approx(0.0, abs=1e-6)
    raw = torch.tensor([0.5, 0.75, -0.1, -0.2])  # trained positions (0,0) (0,2) (1,0) (1,1)
    white = (raw - raw.mean()) / raw.std()
    got = out.batch["advantages"][dp.batch["response_mask"].bool()]
    torch.testing.assert_close(got, white, atol=1e-4, rtol=0)


def test_vanilla_ppo_clip_loss_hand_computed() -> None:
    batch = TrainingBatch(samples=[sample("A", 1.0, [1, 1, 0], "x")])
    dp = to_data_proto(batch, max_prompt_length=2, max_response_length=4, pad_token_id=0)
    dp.batch["advantages"] = torch.ones(1, 4) * dp.batch["response_mask"]
    old = dp.batch["old_log_probs"]
    # ratios 1.5 and 0.5 on the two trained tokens; 1 elsewhere
    new = old + torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.0]]))
    actor = omega_conf_to_dataclass(VerlTrainerConfig(model_path="unused").to_verl_config().actor_rollout_ref.actor)
    loss_fn = core_algos.get_policy_loss_fn("vanilla")
    loss, metrics = loss_fn(
        old_log_prob=old,
        log_prob=new,
        advantages=dp.batch["advantages"],
        response_mask=dp.batch["response_mask"],
        loss_agg_mode="token-mean",
        config=actor,
    )
    # A = 1: token 0 clipped to 1.2 -> -1.2 ; token 1 keeps -0.5 (min of ratio and clip) ; mean over 2 tokens
    assert loss.item() == pytest.approx(-0.85, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 2, abs=1e-6)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
