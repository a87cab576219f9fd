"""The PPO/GRPO update on toy batches."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import LlamaForCausalLM

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_torch import (
    CharTokenizer,
    LocalBackend,
    LoraSettings,
    PPOConfig,
    make_optimizer,
    merged_state_dict,
    ppo_update,
    prepare_policy,
    response_logprobs,
)

SmallModel = Callable[..., LlamaForCausalLM]


def sample(tokenizer: CharTokenizer, response: str, advantage: float, **fields: object) -> TrainingSample:
    response_ids = [*tokenizer.encode(response), tokenizer.eos_token_id]
    values: dict[str, object] = {
        "prompt_ids": tokenizer.encode("Q:2*3+4=\n", add_bos=True),
        "response_ids": response_ids,
        "response_mask": [1] * len(response_ids),
        "reward": advantage,
        "advantage": advantage,
        "returns": advantage,
        "group_id": "g",
        "rollout_id": "r",
        "attempt_id": "a",
        "step_index": 0,
    }
    values.update(fields)
    return TrainingSample.model_validate(values)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_update_moves_probability_towards_positive_advantage(
    tokenizer: CharTokenizer, make_small_model: SmallModel
) -> None:
    model = make_small_model(tokenizer)
    good, bad = sample(tokenizer, "A:10", 1.0), sample(tokenizer, "A:99", -1.0)
    before_params = snapshot(model)
    before = [sum(row) for row in response_logprobs(model, [good, bad])]
    config = PPOConfig(lr=1e-2)
    optimizer = make_optimizer(model, config)
    metrics = ppo_update(model, optimizer, TrainingBatch(samples=[good, bad]), config)
    after = [sum(row) for row in response_logprobs(model, [good, bad])]
    assert after[0] > before[0] and after[1] < before[1]
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in before_params.items())
    # old log-probs were recomputed from the same weights: the first ratio is exactly 1
    assert metrics["clip_fraction"] == 0.0 and abs(metrics["approx_kl"]) < 1e-5
    assert metrics["optimizer_steps"] == 1 and metrics["num_tokens"] == 10 and metrics["grad_norm"] > 0


def test_recorded_old_logprobs_are_used(tokenizer: CharTokenizer, make_small_model: SmallModel) -> None:
    model = make_small_model(tokenizer)
    good = sample(tokenizer, "A:10", 1.0)
    stale = [value - 1.0 for value in response_logprobs(model, [good])[0]]  # ratio e: far outside the clip range
    config = PPOConfig(lr=1e-3)
    metrics = ppo_update(
        model,
        make_optimizer(model, config),
        TrainingBatch(samples=[good.model_copy(update={"old_logprobs": stale})]),
        config,
    )
    assert metrics["clip_fraction"] == 1.0
    assert metrics["grad_norm"] == 0.0  # every token clipped: no gradient


def test_observation_tokens_are_not_trained(tokenizer: CharTokenizer, make_small_model: SmallModel) -> None:
    model = make_small_model(tokenizer)
    masked = sample(tokenizer, "A:10", 1.0)
    masked = masked.model_copy(update={"response_mask": [0] * len(masked.response_ids)})
    before = snapshot(model)
    config = PPOConfig()
    metrics = ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=[masked]), config)
    assert metrics["optimizer_steps"] == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=[]), config)["num_samples"] == 0


def test_micro_batching_gives_the_same_update(tokenizer: CharTokenizer, make_small_model: SmallModel) -> None:
    samples = [sample(tokenizer, text, adv) for text, adv in [("A:10", 1.0), ("A:9", -0.5), ("CALC(2*3+4)", 0.7)]]
    results = []
    for micro in (3, 1):
        model = make_small_model(tokenizer)
        config = PPOConfig(lr=1e-2, micro_batch_size=micro)
        ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=samples), config)
        results.append(snapshot(model))
    for key, value in results[0].items():
        torch.testing.assert_close(value, results[1][key], atol=1e-5, rtol=1e-4)


def test_bad_samples_are_rejected_before_anything_changes(
    tokenizer: CharTokenizer, make_small_model: SmallModel
) -> None:
    model = make_small_model(tokenizer)
    before = snapshot(model)
    config = PPOConfig()
    optimizer = make_optimizer(model, config)
    good = sample(tokenizer, "A:10", 1.0)
    out_of_vocab = good.model_copy(update={"response_ids": [500, 1], "response_mask": [1, 1]})
    with pytest.raises(ValueError, match="sample 1 has token ids"):
        ppo_update(model, optimizer, TrainingBatch(samples=[good, out_of_vocab]), config)
    too_long = good.model_copy(update={"prompt_ids": [2] * 200})
    with pytest.raises(ValueError, match="context"):
        ppo_update(model, optimizer, TrainingBatch(samples=[too_long]), config)
    with pytest.raises(ValueError, match="ref_model"):
        ppo_update(model, optimizer, TrainingBatch(samples=[good]), PPOConfig(kl_coef=0.1))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_kl_penalty_against_a_reference(tokenizer: CharTokenizer, make_small_model: SmallModel) -> None:
    model, reference = make_small_model(tokenizer, seed=0), make_small_model(tokenizer, seed=1)
    config = PPOConfig(kl_coef=0.5)
    metrics = ppo_update(
        model,
        make_optimizer(model, config),
        TrainingBatch(samples=[sample(tokenizer, "A:10", 0.0)]),
        config,
        ref_model=reference,
    )
    assert metrics["kl"] > 0 and metrics["grad_norm"] > 0  # zero advantage: only the KL term pulls


def test_config_is_frozen_and_validated() -> None:
    config = PPOConfig()
    assert (config.lr, config.betas, config.clip_ratio, config.grad_clip, config.kl_coef) == (
        3e-4,
        (0.9, 0.99),
        0.2,
        1.0,
        0.0,
    )
    with pytest.raises(ValueError):
        PPOConfig(lr=-1)
    with pytest.raises(ValueError):
        config.lr = 1.0  # type: ignore[misc]


def test_lora_trains_adapters_only_and_merges_for_serving(
    tokenizer: CharTokenizer, make_small_model: SmallModel
) -> None:
    pytest.importorskip("peft")
    base = make_small_model(tokenizer)
    frozen = snapshot(base)
    config = PPOConfig(lr=1e-2, lora=LoraSettings(r=4, alpha=8))
    policy = prepare_policy(base, config)
    trainable = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    good = sample(tokenizer, "A:10", 1.0)
    ppo_update(policy, make_optimizer(policy, config), TrainingBatch(samples=[good]), config)
    merged = merged_state_dict(policy)
    assert set(merged) == set(frozen)
    assert any(not torch.equal(frozen[k], merged[k]) for k in frozen)
    backend = LocalBackend(make_small_model(tokenizer, seed=5), tokenizer)
    backend.update_weights(policy)
    served = backend.model.state_dict()
    assert all(torch.equal(served[k], merged[k]) for k in merged)
