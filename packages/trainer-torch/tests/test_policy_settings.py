"""Per-policy settings (learning rate, KL weight, LoRA shape) reach each policy, and a policy that does not move is
named (its drift or its reward flat while another policy's moves)."""

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
from agentlightning_torch.training._lora_policies import LoRAPolicies, policy_metric
from agentlightning_torch.training._policy_progress import PolicyProgress, lora_drift
from agentlightning_torch.training._policy_settings import LORA_LR_SCALE, PolicySettings, parse_policy_settings
from agentlightning_torch.training._ppo import PPOConfig
from agentlightning_torch.training._trainer_config import TorchTrainerConfig

RUN = PPOConfig(lr=1e-3, kl_coef=0.05, lora=LoRASettings(r=4, alpha=8, target_modules=("q_proj", "v_proj")))


def _batch(policies: list[str], seed: int) -> TrainingBatch:
    return TrainingBatch(samples=[policy_sample(p, 1.0 if i % 2 else -1.0, i + seed) for i, p in enumerate(policies)])


def test_each_policy_gets_its_own_learning_rate_kl_and_rank(
    make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast
) -> None:
    settings = {"writer": PolicySettings(lr=2e-4, kl_coef=0.0, lora=LoRASettings(r=2, alpha=4))}
    adapters = LoRAPolicies(make_small_model(tokenizer, seed=5), ["writer", "rewriter"], RUN, settings)
    # the optimizer of each adapter holds its own rate; an unset one is the LoRA default (10x the run's)
    assert adapters.optimizers["writer"].param_groups[0]["lr"] == 2e-4
    assert adapters.optimizers["rewriter"].param_groups[0]["lr"] == pytest.approx(RUN.lr * LORA_LR_SCALE)
    assert (adapters.ppo["writer"].kl_coef, adapters.ppo["rewriter"].kl_coef) == (0.0, 0.05)
    # ...and each adapter its own shape: rank 2 on the default targets for the writer, the run's rank 4 for the other
    shapes = {n: p.shape for n, p in adapters.model.named_parameters() if "lora_A" in n and ".layers.0." in n}
    writer = {n.split(".")[-4]: s for n, s in shapes.items() if ".writer." in n}
    rewriter = {n.split(".")[-4]: s for n, s in shapes.items() if ".rewriter." in n}
    assert {s[0] for s in writer.values()} == {2} and {s[0] for s in rewriter.values()} == {4}
    assert set(writer) == {"q_proj", "k_proj", "v_proj", "o_proj"} and set(rewriter) == {"q_proj", "v_proj"}
    assert adapters.max_rank == 4
    assert adapters.described["writer"]["lr"] == 2e-4 and adapters.described["rewriter"]["lr_default"] is True
    # the rate reported by the update is the one its optimizer used
    metrics = adapters.update(_batch(["writer", "rewriter"] * 4, 0))
    assert metrics[policy_metric("writer", "lr")] == 2e-4
    assert metrics[policy_metric("rewriter", "lr")] == pytest.approx(1e-2)


def test_settings_for_a_policy_that_is_not_trained_are_refused(tmp_path: Path) -> None:
    policies = PolicyMap(agents={"writer": "writer", "checker": FROZEN})
    with pytest.raises(ValueError, match=r"not trained: \['rewritr'\]"):
        TorchTrainerConfig(model_dir=tmp_path, policies=policies, policy_settings={"rewritr": PolicySettings(lr=1)})
    with pytest.raises(ValueError, match="need policies"):
        TorchTrainerConfig(model_dir=tmp_path, policy_settings={"writer": PolicySettings(lr=1e-3)})
    with pytest.raises(ValueError, match="vLLM serves LoRA ranks up to 512, got r=600"):  # the largest rank counts
        TorchTrainerConfig(
            model_dir=tmp_path,
            backend="vllm",
            policies=policies,
            policy_settings={"writer": PolicySettings(lora=LoRASettings(r=600))},
        )


def test_policy_settings_parse_from_the_command_line_form() -> None:
    parsed = parse_policy_settings(["writer:lr=3e-3,rank=16", "rewriter:kl=0", "writer:targets=q_proj+v_proj"], RUN)
    assert parsed["writer"].lr == 3e-3 and parsed["writer"].lora is not None
    assert parsed["writer"].lora.r == 16 and parsed["writer"].lora.alpha == 8  # the run's alpha kept
    assert parsed["writer"].lora.target_modules == ("q_proj", "v_proj")
    assert parsed["rewriter"] == PolicySettings(kl_coef=0.0)
    for bad, message in [
        ("writer", "POLICY:KEY=VALUE"),
        ("writer:lr", "is not KEY=VALUE"),
        ("writer:speed=3", "unknown key 'speed'"),
        ("writer:lr=-1", "policy 'writer': lr: Input should be greater than 0"),
        ("writer:rank=x", "policy 'writer': r: Input should be a valid integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_policy_settings([bad], RUN)


def test_drift_is_zero_at_the_start_and_grows_with_the_learning_rate(
    make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast
) -> None:
    torch.manual_seed(0)
    settings = {"slow": PolicySettings(lr=1e-5), "fast": PolicySettings(lr=1e-2)}
    adapters = LoRAPolicies(make_small_model(tokenizer, seed=5), ["slow", "fast"], RUN, settings)
    assert lora_drift(adapters.model, "slow") == lora_drift(adapters.model, "fast") == 0.0
    for seed in range(3):
        metrics = adapters.update(_batch(["slow", "fast"] * 4, seed))
    slow, fast = metrics[policy_metric("slow", "drift")], metrics[policy_metric("fast", "drift")]
    assert 0.0 < slow < fast / 100


def test_a_policy_whose_weights_lag_far_behind_anothers_is_named_once() -> None:
    progress = PolicyProgress(["writer", "rewriter"], window=4)
    for step in range(1, 4):  # not before `window` updates
        assert progress.record(["writer", "rewriter"], {"writer": 0.001 * step, "rewriter": 0.1}) == {}
    warned = progress.record(["writer", "rewriter"], {"writer": 0.004, "rewriter": 0.2})
    assert list(warned) == ["writer"]
    assert (
        "in its 4 updates: its weights drifted 0.004 from the start against 0.2 for policy 'rewriter'"
        in (warned["writer"])
    )
    assert progress.flat == {"writer"}
    assert progress.record(["writer", "rewriter"], {"writer": 0.005, "rewriter": 0.2}) == {}  # once
    progress.record(["writer", "rewriter"], {"writer": 0.1, "rewriter": 0.2})  # it moves: not flat any more
    assert progress.flat == set()
    assert list(progress.record(["writer"], {"writer": 0.1, "rewriter": 0.9})) == ["writer"]  # stalled anew


def test_updates_without_samples_do_not_count_and_a_lone_policy_is_never_flat() -> None:
    progress = PolicyProgress(["writer", "rewriter"], window=3)
    for _ in range(5):  # the rewriter gets no samples: not judged, however little it moved
        assert progress.record(["writer"], {"writer": 0.3, "rewriter": 0.0}) == {}
    alone = PolicyProgress(["writer"], window=1)
    assert alone.record(["writer"], {"writer": 0.0}) == {} and alone.flat == set()


def test_policies_are_compared_within_their_kind_only() -> None:
    """A full copy's drift (over every weight) and an adapter's (over its layers) are not on one scale."""
    kinds = {"writer": "full", "rewriter": "lora", "checker": "lora"}
    progress = PolicyProgress(list(kinds), window=1, kinds=kinds)
    warned = progress.record(list(kinds), {"writer": 0.039, "rewriter": 0.2, "checker": 0.01})
    assert list(warned) == ["checker"] and "against 0.2 for policy 'rewriter'" in warned["checker"]


def test_the_sql_runs_that_learned_raise_no_warning() -> None:
    """Writer and rewriter drifts per iteration of examples/sql's seed-0 run (LoRA 3e-3; held-out 0.00 -> 0.88)."""
    writer = [0.045, 0.068, 0.091, 0.114, 0.137, 0.16, 0.186, 0.212, 0.235, 0.248, 0.258, 0.266, 0.279, 0.287, 0.294]
    rewriter = [0.045, 0.072, 0.087, 0.105, 0.124, 0.139, 0.139, 0.155, 0.174, 0.187, 0.194, 0.207, 0.22, 0.222, 0.222]
    progress = PolicyProgress(["writer", "rewriter"])
    for w, r in zip(writer, rewriter, strict=True):
        assert progress.record(["writer", "rewriter"], {"writer": w, "rewriter": r}) == {}


def test_the_adapters_log_the_warning_with_the_setting_to_look_at(
    make_small_model: Callable[..., PreTrainedModel],
    tokenizer: PreTrainedTokenizerFast,
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    settings = {"slow": PolicySettings(lr=1e-6), "fast": PolicySettings(lr=1e-2)}
    adapters = LoRAPolicies(make_small_model(tokenizer, seed=5), ["slow", "fast"], RUN, settings)
    adapters.progress = PolicyProgress(adapters.names, window=2)
    with caplog.at_level(logging.WARNING, logger="agentlightning_torch.training._lora_policies"):
        for seed in range(3):
            metrics = adapters.update(_batch(["slow", "fast"] * 4, seed))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("policy 'slow' has barely moved in its 2 updates")
    assert "look at its learning rate (now 1e-06" in warnings[0] and "--policy-settings POLICY:lr=" in warnings[0]
    assert metrics[policy_metric("slow", "flat")] == 1.0 and metrics[policy_metric("fast", "flat")] == 0.0
