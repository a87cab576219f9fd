"""One adapter per policy: an update moves only the adapters whose policy has samples; checkpoints hold them all."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from agentlightning import FROZEN, PolicyMap, TrainingBatch
from agentlightning_torch.models._lora import LoRASettings
from agentlightning_torch.testing import policy_sample
from agentlightning_torch.training._lora_policies import LoRAPolicies, policy_metric
from agentlightning_torch.training._ppo import PPOConfig
from agentlightning_torch.training._trainer_config import TorchTrainerConfig
from agentlightning_torch.vllm._lora import vllm_lora_args

SETTINGS = LoRASettings(r=4, alpha=8, target_modules=("q_proj", "v_proj"))
PPO = PPOConfig(lr=1e-3, lora=SETTINGS)
"""Every adapter's shape is SETTINGS; its learning rate the LoRA default, 10x the run's: 1e-2."""


def _weights(adapters: LoRAPolicies, name: str) -> dict[str, torch.Tensor]:
    marker = f".{name}."
    return {n: p.detach().clone() for n, p in adapters.model.named_parameters() if marker in n and "lora_" in n}


def _base(adapters: LoRAPolicies) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in adapters.model.named_parameters() if "lora_" not in n}


@pytest.fixture
def adapters(make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast) -> LoRAPolicies:
    torch.manual_seed(0)
    return LoRAPolicies(make_small_model(tokenizer, seed=5), ["writer", "rewriter"], PPO)


def _step(adapters: LoRAPolicies, policies: list[str | None]) -> dict[str, float]:
    samples = [policy_sample(p, 1.0 if i % 2 else -1.0, i) for i, p in enumerate(policies)]
    return adapters.update(TrainingBatch(samples=samples))


def test_an_update_changes_only_the_adapter_whose_policy_has_samples(adapters: LoRAPolicies) -> None:
    # a first update of both, so that LoRA B is no longer zero and a change of A shows in the outputs
    _step(adapters, ["writer", "rewriter", "writer", "rewriter"])
    writer, rewriter, base = _weights(adapters, "writer"), _weights(adapters, "rewriter"), _base(adapters)
    metrics = _step(adapters, ["writer", "writer", FROZEN, "writer"])
    after_writer, after_rewriter = _weights(adapters, "writer"), _weights(adapters, "rewriter")
    assert any(not torch.equal(writer[k], after_writer[k]) for k in writer)
    assert all(torch.equal(rewriter[k], after_rewriter[k]) for k in rewriter)  # bit-identical
    assert all(torch.equal(base[k], v) for k, v in _base(adapters).items())
    assert adapters.updated == ["writer"]
    assert metrics[policy_metric("writer", "samples")] == 3.0
    assert metrics[policy_metric("rewriter", "samples")] == 0.0
    assert metrics[policy_metric("rewriter", "skipped")] == 1.0 and adapters.skipped == {"writer": 0, "rewriter": 1}
    assert metrics["policies_skipped"] == 1.0 and metrics["samples_untrained"] == 1.0
    assert policy_metric("writer", "kl") in metrics and policy_metric("writer", "reward_mean") in metrics
    assert policy_metric("rewriter", "kl") not in metrics


def test_a_checkpoint_holds_every_adapter_and_optimizer_and_peft_loads_each(
    adapters: LoRAPolicies,
    make_small_model: Callable[..., PreTrainedModel],
    tokenizer: PreTrainedTokenizerFast,
    tmp_path: Path,
) -> None:
    _step(adapters, ["writer", "rewriter", "writer", "rewriter"])
    _step(adapters, ["writer", "writer"])
    adapters.save(tmp_path)
    saved = {name: _weights(adapters, name) for name in adapters.names}
    torch.manual_seed(1)
    restored = LoRAPolicies(make_small_model(tokenizer, seed=5), ["writer", "rewriter"], PPO)
    assert any(not torch.equal(saved["writer"][k], v) for k, v in _weights(restored, "writer").items())
    restored.load(tmp_path)
    for name in adapters.names:
        assert all(torch.equal(saved[name][k], v) for k, v in _weights(restored, name).items())
        mine, theirs = restored.optimizers[name].state_dict(), adapters.optimizers[name].state_dict()
        assert mine["state"].keys() == theirs["state"].keys()
    assert restored.skipped == {"writer": 0, "rewriter": 1}
    # each adapter folder is a plain peft adapter: peft loads it onto a fresh base
    folder = LoRAPolicies.lora_folder(tmp_path, "rewriter")
    loaded = PeftModel.from_pretrained(make_small_model(tokenizer, seed=5), str(folder))
    state = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert len(state) == len(saved["rewriter"])
    for (_, mine), (_, theirs) in zip(sorted(saved["rewriter"].items()), sorted(state.items()), strict=True):
        assert torch.equal(mine, theirs.detach())


def test_frozen_cannot_be_a_trained_adapter(
    make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(ValueError, match="distinct trained policies"):
        LoRAPolicies(make_small_model(tokenizer), ["writer", FROZEN], PPO)


def test_a_multi_policy_trainer_resumes_every_adapter_and_optimizer(tmp_path: Path) -> None:
    from agentlightning import PolicyMap
    from agentlightning_torch import TorchTrainer, TorchTrainerConfig
    from agentlightning_torch.testing import make_tiny_chat_model

    make_tiny_chat_model(tmp_path / "model")
    config = TorchTrainerConfig(
        model_dir=tmp_path / "model",
        output_dir=tmp_path / "run",
        ppo=PPO,
        policies=PolicyMap(agents={"writer": "writer", "rewriter": "rewriter", "checker": FROZEN}),
    )
    trainer = TorchTrainer(config)
    adapters = trainer.engine.loras
    assert adapters is not None and adapters.names == ["writer", "rewriter"]
    _step(adapters, ["writer", "rewriter", "writer", "rewriter"])
    _step(adapters, ["writer", "writer"])
    trainer.iteration, trainer.model_version = 2, 2
    folder = trainer.save_checkpoint()
    assert (folder / "adapters" / "writer" / "adapter_config.json").is_file()
    assert (folder / "adapters" / "rewriter" / "adapter_config.json").is_file()

    resumed = TorchTrainer(config.model_copy(update={"resume": True}))
    again = resumed.engine.loras
    assert again is not None and (resumed.iteration, resumed.model_version) == (2, 2)
    for name in ("writer", "rewriter"):
        saved, loaded = _weights(adapters, name), _weights(again, name)
        assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
        steps = [s["step"] for s in again.optimizers[name].state_dict()["state"].values()]
        assert steps and all(float(step) == (2 if name == "writer" else 1) for step in steps)
    assert again.skipped == {"writer": 0, "rewriter": 1}


def test_vllm_serves_every_policys_adapter_at_a_rank_it_accepts(tmp_path: Path) -> None:
    assert vllm_lora_args(2, 4) == ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8")
    assert vllm_lora_args(5, 16)[2:] == ("5", "--max-lora-rank", "16")
    assert vllm_lora_args(1, 17)[-1] == "32"  # rounded up to a rank vLLM accepts
    policies = PolicyMap(agents={"writer": "writer"})
    with pytest.raises(ValueError, match="vLLM serves LoRA ranks up to 512, got r=600"):
        TorchTrainerConfig(
            model_dir=tmp_path, backend="vllm", policies=policies, ppo=PPOConfig(lora=LoRASettings(r=600))
        )
    # the same map and rank on LocalBackend is fine
    TorchTrainerConfig(model_dir=tmp_path, policies=policies, ppo=PPOConfig(lora=LoRASettings(r=600)))
