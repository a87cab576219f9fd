"""Full weights of its own per policy, beside LoRA ones: an update moves only its copy; checkpoints hold both kinds."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from agentlightning import FROZEN, PolicyMap, TrainingBatch
from agentlightning_torch.models._lora import LoRASettings
from agentlightning_torch.testing import policy_sample
from agentlightning_torch.training._lora_policies import policy_metric
from agentlightning_torch.training._policy_set import TrainedPolicies
from agentlightning_torch.training._policy_settings import PolicySettings, parse_policy_settings
from agentlightning_torch.training._ppo import PPOConfig
from agentlightning_torch.training._trainer_config import TorchTrainerConfig

PPO = PPOConfig(lr=1e-3, lora=LoRASettings(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
FULL = PolicySettings(weights="full")
SETTINGS = {"writer": PolicySettings(weights="full", kl_coef=0.1), "editor": FULL}
"""writer and editor: full weights (writer with a KL penalty to the frozen base); rewriter: a LoRA adapter."""


def _step(policies: TrainedPolicies, names: list[str | None]) -> dict[str, float]:
    samples = [policy_sample(p, 1.0 if i % 2 else -1.0, i) for i, p in enumerate(names)]
    return policies.update(TrainingBatch(samples=samples))


def _snapshot(policies: TrainedPolicies) -> dict[str, dict[str, torch.Tensor]]:
    """Every weight of the run, by owner: each full policy's copy, each adapter, the frozen base."""
    assert policies.full is not None and policies.lora is not None
    out = {name: {k: v.detach().clone() for k, v in m.state_dict().items()} for name, m in policies.full.models.items()}
    named = list(policies.base.named_parameters())
    out["rewriter"] = {n: p.detach().clone() for n, p in named if ".rewriter." in n and "lora_" in n}
    out["base"] = {n: p.detach().clone() for n, p in named if "lora_" not in n}
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def policies(make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast) -> TrainedPolicies:
    torch.manual_seed(0)
    return TrainedPolicies(make_small_model(tokenizer, seed=5), ["writer", "rewriter", "editor"], PPO, SETTINGS)


def test_a_full_policys_update_leaves_every_other_policy_and_the_base_bit_identical(
    policies: TrainedPolicies,
) -> None:
    _step(policies, ["writer", "rewriter", "editor", "rewriter"])  # LoRA B is no longer zero after this
    before = _snapshot(policies)
    metrics = _step(policies, ["writer", "writer", FROZEN, "writer"])
    after = _snapshot(policies)
    assert not _same(before["writer"], after["writer"])
    for owner in ("editor", "rewriter", "base"):
        assert _same(before[owner], after[owner]), owner  # bit-identical
    assert policies.updated == ["writer"]
    assert metrics[policy_metric("writer", "samples")] == 3.0 and metrics[policy_metric("writer", "kl")] >= 0.0
    assert metrics[policy_metric("editor", "skipped")] == 1.0 and metrics[policy_metric("rewriter", "skipped")] == 1.0
    assert metrics["policies_updated"] == 1.0 and metrics["samples_untrained"] == 1.0
    assert metrics[policy_metric("writer", "drift")] > 0.0 and metrics[policy_metric("editor", "drift")] > 0.0
    assert policies.skipped == {"writer": 0, "rewriter": 1, "editor": 1}
    # and a LoRA policy's update leaves both full copies as they were
    before = _snapshot(policies)
    _step(policies, ["rewriter", "rewriter"])
    after = _snapshot(policies)
    assert not _same(before["rewriter"], after["rewriter"])
    assert all(_same(before[o], after[o]) for o in ("writer", "editor", "base"))


def test_a_full_policys_learning_rate_defaults_to_the_runs_and_reaches_its_optimizer(
    make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast
) -> None:
    settings = {"writer": FULL, "editor": PolicySettings(weights="full", lr=2e-4)}
    policies = TrainedPolicies(make_small_model(tokenizer), ["writer", "editor", "rewriter"], PPO, settings)
    lrs = {name: [g["lr"] for g in optimizer.param_groups] for name, optimizer in policies.optimizers.items()}
    assert lrs == {"writer": [1e-3], "editor": [2e-4], "rewriter": [1e-2]}  # LoRA: 10x the run's
    assert policies.described["writer"] == {"weights": "full", "lr": 1e-3, "lr_default": True, "kl_coef": 0.0}
    assert policies.described["rewriter"]["weights"] == "lora"
    assert policies.full is not None
    trainable = sum(p.numel() for p in policies.full.models["writer"].parameters() if p.requires_grad)
    assert trainable == sum(p.numel() for p in policies.full.models["writer"].parameters())  # every weight trains
    assert all(not p.requires_grad for n, p in policies.base.named_parameters() if "lora_" not in n)


def test_a_full_policy_that_lags_is_named_with_the_setting_to_look_at(
    policies: TrainedPolicies, caplog: pytest.LogCaptureFixture
) -> None:
    policies.progress.window = 2
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            _step(policies, ["writer", "editor", "rewriter", "rewriter"])
            with torch.no_grad():  # the editor's full copy moves far, the writer's takes small steps
                for parameter in policies.full.models["editor"].parameters():  # type: ignore[union-attr]
                    parameter.mul_(1.5)
    text = " ".join(r.getMessage() for r in caplog.records if r.getMessage().startswith("policy 'writer'"))
    assert "against" in text and "policy 'editor'" in text  # a full policy lagging another full one
    assert "lr=" in text and "LoRA rank" not in text
    assert "writer" in policies.progress.flat


def test_full_weights_settings_parse_describe_and_refuse_what_does_not_fit(tmp_path: Path) -> None:
    parsed = parse_policy_settings(["writer:weights=full,lr=3e-4", "rewriter:rank=4"])
    assert parsed["writer"] == PolicySettings(weights="full", lr=3e-4)
    assert parsed["rewriter"].weights == "lora"
    assert parsed["writer"].ppo(PPOConfig(lr=5e-4)).lr == 3e-4
    assert PolicySettings(weights="full").ppo(PPOConfig(lr=5e-4)).lr == 5e-4
    with pytest.raises(ValueError, match="takes no LoRA shape"):
        PolicySettings(weights="full", lora=LoRASettings())
    with pytest.raises(ValueError, match=r"policy 'writer': .*takes no LoRA shape"):
        parse_policy_settings(["writer:weights=full,rank=4"])
    with pytest.raises(ValueError, match="weights"):
        parse_policy_settings(["writer:weights=half"])
    from agentlightning_torch.testing import make_tiny_chat_model

    make_tiny_chat_model(tmp_path / "model")
    policies = PolicyMap(agents={"writer": "writer", "rewriter": "rewriter"})
    base = {"model_dir": tmp_path / "model", "policies": policies, "policy_settings": {"writer": FULL}}
    with pytest.raises(ValueError, match="vLLM serves LoRA policies only"):
        TorchTrainerConfig(**base, backend="vllm")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="in-process only"):
        TorchTrainerConfig(**base, backend_http=True)  # pyright: ignore[reportArgumentType]


def test_a_trainer_resumes_both_kinds_of_policy(tmp_path: Path) -> None:
    from agentlightning_torch import TorchTrainer
    from agentlightning_torch.testing import make_tiny_chat_model

    make_tiny_chat_model(tmp_path / "model")
    config = TorchTrainerConfig(
        model_dir=tmp_path / "model",
        output_dir=tmp_path / "run",
        ppo=PPO.model_copy(update={"kl_coef": 0.05}),
        policies=PolicyMap(agents={"writer": "writer", "rewriter": "rewriter", "checker": FROZEN}),
        policy_settings={"writer": FULL},
    )
    trainer = TorchTrainer(config)
    trained = trainer.engine.trained
    assert trained is not None and trained.full is not None and trained.full.names == ["writer"]
    _step(trained, ["writer", "rewriter", "writer", "rewriter"])
    _step(trained, ["writer", "writer"])
    trainer.iteration, trainer.model_version = 2, 2
    folder = trainer.save_checkpoint()
    assert (folder / "policies" / "writer" / "config.json").is_file()
    assert (folder / "adapters" / "rewriter" / "adapter_config.json").is_file()
    saved = _owners(trained)

    resumed = TorchTrainer(config.model_copy(update={"resume": True}))
    again = resumed.engine.trained
    assert again is not None and (resumed.iteration, resumed.model_version) == (2, 2)
    loaded = _owners(again)
    assert all(_same(saved[owner], loaded[owner]) for owner in ("writer", "rewriter", "base"))
    for name, expected in (("writer", 2), ("rewriter", 1)):
        steps = [s["step"] for s in again.optimizers[name].state_dict()["state"].values()]
        assert steps and all(float(step) == expected for step in steps)
    assert again.skipped == {"writer": 0, "rewriter": 1}


def _owners(policies: TrainedPolicies) -> dict[str, dict[str, torch.Tensor]]:
    assert policies.full is not None
    named = list(policies.base.named_parameters())
    return {
        "writer": {k: v.detach().clone() for k, v in policies.full.models["writer"].state_dict().items()},
        "rewriter": {n: p.detach().clone() for n, p in named if ".rewriter." in n and "lora_" in n},
        "base": {n: p.detach().clone() for n, p in named if "lora_" not in n},
    }


async def test_the_endpoint_lists_every_policys_model_and_routes_by_model(
    make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast
) -> None:
    import json

    from agentlightning_torch.serving._backend import LocalBackend
    from agentlightning_torch.serving._endpoint import OpenAIEndpoint
    from agentlightning_torch.serving._policy_endpoint import PolicyEndpoint

    base = OpenAIEndpoint(LocalBackend(make_small_model(tokenizer), tokenizer, model_name="base"))
    writer = OpenAIEndpoint(LocalBackend(make_small_model(tokenizer), tokenizer, model_name="writer"))
    endpoint = PolicyEndpoint(base, {"writer": writer})
    reply = await endpoint.request("GET", "/v1/models", b"")
    assert reply.status == 200
    assert [m["id"] for m in json.loads(await reply.read())["data"]] == ["base", "writer"]
    assert endpoint.endpoint("writer") is writer
    assert (
        endpoint.endpoint("base") is base and endpoint.endpoint("checker") is base and endpoint.endpoint(None) is base
    )
    health = await endpoint.request("GET", "/health", b"")
    assert health.status == 200
