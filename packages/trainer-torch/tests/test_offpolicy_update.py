"""Off-policy correction of the PPO update: truncated importance sampling from the recorded behaviour log-probs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from agentlightning import TrainingBatch
from agentlightning_torch import PPOConfig, TorchTrainerConfig, make_optimizer, ppo_update, response_logprobs
from agentlightning_torch.testing import make_tiny_chat_model, tiny_qwen2, training_sample
from agentlightning_torch.training._offpolicy import truncated_importance_weights


def test_truncated_importance_weights_against_hand_computed_values() -> None:
    # ratios exp(prox - behav): 0.5/0.25 = 2, 0.2/0.4 = 0.5, 0.9/0.3 = 3 (masked out: not in the statistics)
    weights = truncated_importance_weights(
        proximal=[[math.log(0.5), math.log(0.2)], [math.log(0.9)]],
        behaviour=[[math.log(0.25), math.log(0.4)], [math.log(0.3)]],
        masks=[[1, 1], [0]],
        cap=1.5,
    )
    assert [pytest.approx(row) for row in ([1.5, 0.5], [1.5])] == weights.weights
    assert weights.ratio_mean == pytest.approx(1.25) and weights.ratio_max == pytest.approx(2.0)
    assert weights.truncated_fraction == pytest.approx(0.5)
    assert weights.metrics() == pytest.approx(
        {"is_ratio_mean": 1.25, "is_ratio_max": 2.0, "is_truncated_fraction": 0.5}
    )
    with pytest.raises(ValueError, match="sample 0: log-prob rows and mask differ in length"):
        truncated_importance_weights([[0.0]], [[0.0, 0.0]], [[1]], cap=2.0)


def test_the_update_weights_each_tokens_surrogate_by_its_truncated_ratio() -> None:
    model = tiny_qwen2()
    responses, advantages = [[10, 11, 12], [13, 14]], [1.0, -0.5]
    plain = [training_sample(r, a) for r, a in zip(responses, advantages, strict=True)]
    proximal = response_logprobs(model, plain, bf16=False)  # the weights before the update
    # behaviour log-probs chosen so each token's ratio pi_prox / pi_behav is known: 3, 0.5, 1 | 1.25, 4
    ratios = [[3.0, 0.5, 1.0], [1.25, 4.0]]
    behaviour = [
        [p - math.log(r) for p, r in zip(row, rs, strict=True)] for row, rs in zip(proximal, ratios, strict=True)
    ]
    samples = [
        training_sample(r, a, response_logprobs=b) for r, a, b in zip(responses, advantages, behaviour, strict=True)
    ]
    config = PPOConfig(is_correction=True, is_cap=2.0, lr=1e-3, bf16=False)
    metrics = ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=samples), config)

    flat = [r for row in ratios for r in row]
    assert metrics["is_ratio_mean"] == pytest.approx(sum(flat) / 5, rel=1e-4)
    assert metrics["is_ratio_max"] == pytest.approx(4.0, rel=1e-4)
    assert metrics["is_truncated_fraction"] == pytest.approx(2 / 5)  # 3 and 4 exceed the cap of 2
    # One step from the weights the ratio is taken against: pi_theta / pi_prox = 1 (inside the clip), so each
    # token's surrogate is -advantage x min(ratio, cap), averaged over the 5 tokens.
    weights = [[2.0, 0.5, 1.0], [1.25, 2.0]]
    expected = -sum(a * w for a, row in zip(advantages, weights, strict=True) for w in row) / 5
    assert metrics["pg_loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["clip_fraction"] == 0.0


def test_a_sample_without_behaviour_logprobs_is_refused_with_a_reason() -> None:
    model = tiny_qwen2()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    samples = [
        training_sample([10, 11], 1.0, response_logprobs=[-1.0, -1.0]),
        training_sample([12], -1.0, rollout_id="ro-7", step_index=2),
    ]
    config = PPOConfig(is_correction=True, bf16=False)
    with pytest.raises(ValueError, match=r"sample 1 \(rollout ro-7, step 2\) has no behaviour log-probs: truncated"):
        ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=samples), config)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())  # nothing changed
    # without the correction (synchronous training) the same batch trains, the missing log-probs recomputed
    plain = ppo_update(model, make_optimizer(model, PPOConfig(bf16=False)), TrainingBatch(samples=samples))
    assert plain["optimizer_steps"] == 1.0 and "is_ratio_mean" not in plain


def test_the_trainer_corrects_off_policy_samples_when_its_bound_allows_them(tmp_path: Path) -> None:
    make_tiny_chat_model(tmp_path / "model")
    model_dir = tmp_path / "model"
    assert TorchTrainerConfig(model_dir=model_dir).update_settings().is_correction is False
    assert TorchTrainerConfig(model_dir=model_dir, max_staleness=4).update_settings().is_correction is True
    forced = TorchTrainerConfig(model_dir=model_dir, max_staleness=4, ppo=PPOConfig(is_correction=False))
    assert forced.update_settings().is_correction is False
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        TorchTrainerConfig(model_dir=model_dir, max_staleness=-1)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        PPOConfig(is_cap=0.5)
