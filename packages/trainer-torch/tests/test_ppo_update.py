"""The PPO/GRPO update on toy batches of a tiny randomly initialised Qwen2 model (token ids only)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pydantic import ValidationError

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_torch import (
    LoRASettings,
    PPOConfig,
    is_lora,
    make_optimizer,
    merged_state_dict,
    plan_micro_batches,
    ppo_update,
    prepare_policy,
    response_logprobs,
)
from agentlightning_torch.testing import tiny_qwen2, training_sample


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def total_logprobs(model: torch.nn.Module, samples: list[TrainingSample]) -> list[float]:
    return [sum(row) for row in response_logprobs(model, samples)]


GOOD, BAD = [10, 11, 12, 2], [20, 21, 22, 2]


def test_update_moves_probability_towards_positive_advantage() -> None:
    model = tiny_qwen2()
    good, bad = training_sample(GOOD, 1.0), training_sample(BAD, -1.0)
    before = total_logprobs(model, [good, bad])
    config = PPOConfig(lr=1e-2)
    metrics = ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=[good, bad]), config)
    after = total_logprobs(model, [good, bad])
    assert after[0] > before[0] and after[1] < before[1]
    # old log-probs were recomputed from the same weights: the first ratio is exactly 1
    assert metrics["clip_fraction"] == 0.0 and abs(metrics["approx_kl"]) < 1e-5
    assert metrics["optimizer_steps"] == 1 and metrics["num_tokens"] == 8 and metrics["grad_norm"] > 0


def test_lora_step_moves_probability_towards_positive_advantage_and_leaves_the_base_alone() -> None:
    pytest.importorskip("peft")
    base = tiny_qwen2()
    frozen = snapshot(base)
    config = PPOConfig(lr=5e-2, lora=LoRASettings(r=4, alpha=8))
    policy = prepare_policy(base, config)
    assert is_lora(policy)
    trainable = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    good, bad = training_sample(GOOD, 1.0), training_sample(BAD, -1.0)
    before = total_logprobs(policy, [good, bad])
    optimizer = make_optimizer(policy, config)
    for _ in range(2):  # LoRA's B starts at zero: the first step moves B only, the second moves the output
        ppo_update(policy, optimizer, TrainingBatch(samples=[good, bad]), config)
    after = total_logprobs(policy, [good, bad])
    assert after[0] > before[0] and after[1] < before[1]
    merged = merged_state_dict(policy)
    assert set(merged) == set(frozen)
    assert any(not torch.equal(frozen[k], merged[k]) for k in frozen)
    # the merged weights serve what the adapter-wrapped policy computes
    plain = tiny_qwen2(seed=3)
    plain.load_state_dict(merged)
    assert total_logprobs(plain, [good, bad]) == pytest.approx(after, abs=1e-4)


def test_recorded_old_logprobs_are_used() -> None:
    model = tiny_qwen2()
    good = training_sample(GOOD, 1.0)
    stale = [value - 1.0 for value in response_logprobs(model, [good])[0]]  # ratio e: far outside the clip range
    config = PPOConfig(lr=1e-3)
    metrics = ppo_update(
        model,
        make_optimizer(model, config),
        TrainingBatch(samples=[good.model_copy(update={"response_logprobs": stale})]),
        config,
    )
    assert metrics["clip_fraction"] == 1.0
    assert metrics["grad_norm"] == 0.0  # every token clipped: no gradient


def test_observation_tokens_are_not_trained() -> None:
    model = tiny_qwen2()
    masked = training_sample(GOOD, 1.0, response_mask=[0, 0, 0, 0])
    before = snapshot(model)
    config = PPOConfig()
    metrics = ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=[masked]), config)
    assert metrics["optimizer_steps"] == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=[]), config)["num_samples"] == 0


def test_micro_batching_by_tokens_gives_the_same_update() -> None:
    # Different prompt and response lengths, a masked observation span, mixed advantages: padding and the
    # accumulation's normalisation both matter here.
    samples = [
        training_sample([10, 11, 2], 1.0),
        training_sample([20, 21, 22, 23, 24, 2], -0.5, prompt=[1, 5, 6]),
        training_sample(
            [30, 31, 32, 33, 34, 35, 36, 2], 0.7, prompt=[1, *range(5, 13)], response_mask=[1, 1, 1, 0, 0, 0, 1, 1]
        ),
    ]
    start = snapshot(tiny_qwen2())
    results: list[dict[str, torch.Tensor]] = []
    for micro_rows, micro_tokens in ((64, 16384), (64, 17)):
        model = tiny_qwen2()
        config = PPOConfig(micro_batch_size=micro_rows, micro_batch_tokens=micro_tokens)
        # plain SGD: the weight change is the accumulated gradient itself (Adam would blur what is compared)
        sgd = torch.optim.SGD(model.parameters(), lr=1.0)
        metrics = ppo_update(model, sgd, TrainingBatch(samples=samples), config)
        assert metrics["optimizer_steps"] == 1
        assert metrics["micro_batches"] == (1 if micro_tokens > 100 else 3)
        results.append(snapshot(model))
    moved = max((results[0][k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-3  # the update did something...
    for key, value in results[0].items():  # ...and micro-batching did not change it
        torch.testing.assert_close(value, results[1][key], atol=1e-6, rtol=1e-5)


def test_a_large_model_gets_micro_batches_its_activations_fit_in() -> None:
    """The default 16,384 tokens per pass kept ~30 GB of activations for SmolLM2-135M (out of memory on a 24 GB
    machine): the token budget follows the model's size and ``activation_memory_gib``."""
    from transformers import LlamaConfig

    from agentlightning_torch.training._ppo import activation_bytes_per_token, fit_micro_batches

    smollm2 = torch.nn.Module()
    smollm2.config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)  # no weights needed
    assert activation_bytes_per_token(smollm2) == 1_843_200
    assert fit_micro_batches(smollm2, PPOConfig(), torch.device("cpu")).micro_batch_tokens == 2330  # 4 GiB
    assert fit_micro_batches(smollm2, PPOConfig(activation_memory_gib=1), torch.device("cpu")).micro_batch_tokens == 582
    small = fit_micro_batches(tiny_qwen2(), PPOConfig(), torch.device("cpu"))
    assert small.micro_batch_tokens == 16384  # a small model keeps the setting
    # through ppo_update: a budget of 17 tokens' activations plans the same 3 micro-batches as micro_batch_tokens=17
    per_token = activation_bytes_per_token(tiny_qwen2())
    assert per_token == 6144
    samples = [training_sample([10, 11, 2], 1.0), training_sample([20, 21, 22, 23, 24, 2], -0.5, prompt=[1, 5, 6])]
    samples.append(training_sample([30, 31, 2], 0.7, prompt=[1, *range(5, 13)]))
    model = tiny_qwen2()
    config = PPOConfig(activation_memory_gib=17 * per_token / 2**30)
    metrics = ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=samples), config)
    assert metrics["micro_batches"] == 3 and metrics["max_micro_batch_tokens"] <= 17


def test_a_long_trajectory_gets_a_micro_batch_of_its_own() -> None:
    long = training_sample(list(range(10, 38)) * 3 + [2], 1.0)  # 6 + 85 = 91 tokens
    shorts = [training_sample([10 + i, 2], -1.0 if i % 2 else 1.0) for i in range(8)]  # 8 tokens each
    config = PPOConfig(lr=1e-3, micro_batch_tokens=32)
    model = tiny_qwen2()
    metrics = ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=[*shorts, long]), config)
    # the long one alone (91 padded tokens); the shorts four at a time (32), never padded to 91
    assert metrics["micro_batches"] == 3 and metrics["max_micro_batch_tokens"] == 91
    assert plan_micro_batches([8, 91, 8, 8], max_rows=64, max_tokens=16) == [[1], [0, 2], [3]]
    assert plan_micro_batches([5, 5, 5], max_rows=2, max_tokens=1000) == [[0, 1], [2]]


def test_gradient_checkpointing_gives_the_same_update() -> None:
    samples = [training_sample(GOOD, 1.0), training_sample(BAD, -1.0)]
    start = snapshot(tiny_qwen2())
    results = []
    for checkpointing in (False, True):
        model = tiny_qwen2()
        config = PPOConfig(gradient_checkpointing=checkpointing)
        policy = prepare_policy(model, config)
        assert policy.is_gradient_checkpointing == checkpointing  # type: ignore[union-attr]
        ppo_update(policy, torch.optim.SGD(policy.parameters(), lr=1.0), TrainingBatch(samples=samples), config)
        results.append(snapshot(policy))
    assert max((results[0][k] - start[k]).abs().max().item() for k in start) > 1e-3  # the update did something...
    for key, value in results[0].items():  # ...and checkpointing did not change it
        torch.testing.assert_close(value, results[1][key], atol=1e-6, rtol=1e-5)


def test_bad_samples_are_rejected_before_anything_changes() -> None:
    model = tiny_qwen2()
    before = snapshot(model)
    config = PPOConfig()
    optimizer = make_optimizer(model, config)
    good = training_sample(GOOD, 1.0)
    out_of_vocab = good.model_copy(update={"response_token_ids": [500, 1], "response_mask": [1, 1]})
    with pytest.raises(ValueError, match="sample 1 has token ids"):
        ppo_update(model, optimizer, TrainingBatch(samples=[good, out_of_vocab]), config)
    too_long = good.model_copy(update={"prompt_token_ids": [2] * 200})
    with pytest.raises(ValueError, match="context"):
        ppo_update(model, optimizer, TrainingBatch(samples=[too_long]), config)
    with pytest.raises(ValueError, match="ref_model"):
        ppo_update(model, optimizer, TrainingBatch(samples=[good]), PPOConfig(kl_coef=0.1))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_kl_penalty_against_a_reference() -> None:
    model, reference = tiny_qwen2(seed=0), tiny_qwen2(seed=1)
    config = PPOConfig(kl_coef=0.5)
    metrics = ppo_update(
        model,
        make_optimizer(model, config),
        TrainingBatch(samples=[training_sample(GOOD, 0.0)]),
        config,
        ref_model=reference,
    )
    assert metrics["kl"] > 0 and metrics["grad_norm"] > 0  # zero advantage: only the KL term pulls


def test_lora_kl_uses_the_base_model_as_reference() -> None:
    pytest.importorskip("peft")
    config = PPOConfig(lr=5e-2, kl_coef=1.0, lora=LoRASettings(r=4, alpha=8))
    policy = prepare_policy(tiny_qwen2(), config)
    optimizer = make_optimizer(policy, config)
    batch = TrainingBatch(samples=[training_sample(GOOD, 1.0)])
    first = ppo_update(policy, optimizer, batch, config)
    assert first["kl"] == pytest.approx(0.0, abs=1e-9)  # adapters start as a no-op: policy == base
    ppo_update(policy, optimizer, batch, config)
    assert ppo_update(policy, optimizer, batch, config)["kl"] > 0  # the policy moved away from the base


@pytest.mark.parametrize(
    "setting",
    [
        {"lr": 0.0},
        {"weight_decay": -0.1},
        {"clip_ratio": 0.0},
        {"grad_clip": -1.0},
        {"kl_coef": -0.5},
        {"loss_agg": "sum"},
        {"micro_batch_size": 0},
        {"micro_batch_tokens": 0},
        {"mini_batch_size": 0},
        {"epochs": 0},
        {"num_threads": 0},
    ],
)
def test_a_bad_setting_is_refused_naming_it(setting: dict[str, Any]) -> None:
    # What each setting accepts is the project's decision (an update with lr=0 or no micro-batch cannot run);
    # the refusal must name the setting, before any model is touched.
    (name,) = setting
    with pytest.raises(ValidationError, match=rf"(?m)^{name}\b"):
        PPOConfig(**setting)


@pytest.mark.gpu
def test_bf16_autocast_step_on_cuda() -> None:
    model = tiny_qwen2().to("cuda")
    good, bad = training_sample(GOOD, 1.0), training_sample(BAD, -1.0)
    before = [sum(r) for r in response_logprobs(model, [good, bad], "cuda", bf16=False)]
    config = PPOConfig(lr=1e-2, bf16=True)
    metrics = ppo_update(model, make_optimizer(model, config), TrainingBatch(samples=[good, bad]), config, "cuda")
    after = [sum(r) for r in response_logprobs(model, [good, bad], "cuda", bf16=False)]
    assert metrics["optimizer_steps"] == 1 and after[0] > before[0] and after[1] < before[1]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast: master weights stay fp32


def test_entropy_bonus_raises_the_entropy_when_the_advantage_is_zero() -> None:
    """With zero advantage the policy gradient is zero: only the entropy bonus moves the weights, upwards in entropy."""
    batch = TrainingBatch(samples=[training_sample([5, 6, 7], 0.0), training_sample([8, 9, 2], 0.0)])
    peaked = tiny_qwen2()  # a policy that has learnt to prefer its answers: entropy well below the maximum
    preferred = TrainingBatch(samples=[training_sample([5, 6, 7], 1.0)])
    ppo_update(peaked, make_optimizer(peaked, PPOConfig(lr=1e-2)), preferred, PPOConfig(lr=1e-2, epochs=5))
    measure = PPOConfig(lr=1e-12)  # an update that changes nothing measurable: reports the entropy

    def entropy(model: torch.nn.Module) -> float:
        return ppo_update(model, make_optimizer(model, measure), batch, measure)["entropy"]

    start = entropy(peaked)
    before = snapshot(peaked)
    ppo_update(peaked, make_optimizer(peaked, PPOConfig(lr=1e-3)), batch, PPOConfig(lr=1e-3))
    assert all(torch.equal(before[k], v) for k, v in snapshot(peaked).items())  # nothing to learn without the bonus
    config = PPOConfig(lr=1e-3, entropy_coef=1.0)
    ppo_update(peaked, make_optimizer(peaked, config), batch, config)
    assert entropy(peaked) > start
