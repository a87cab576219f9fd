"""Several policies on one base model: one LoRA adapter per trained policy, each with its own optimizer.

A multi-policy run (`agentlightning.PolicyMap`) trains one adapter per policy that is not `agentlightning.FROZEN`.
`LoRAPolicies` holds them on one peft model: an update splits the batch by each sample's policy and runs one PPO
update per policy with samples, with only that adapter active and trainable and only its own optimizer stepping, so
the other adapters' weights stay bit-identical. Each policy has its own `PolicySettings` (learning rate, KL weight,
LoRA shape; a LoRA learning rate defaults to 10x the run's full-weight one), and `PolicyProgress` warns when a
policy's weights barely move while another's do. A policy with no samples in an iteration is skipped and counted.
Metrics come per policy (``policy/<name>/<metric>``). Checkpoints hold every adapter as its own ``save_pretrained``
folder (``adapters/<name>/``: loadable by peft and by vLLM's ``--lora-modules``) plus each optimizer's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentlightning import FROZEN, TrainingBatch, TrainingSample
from agentlightning_torch.models._lora import LORAS_FOLDER, LoRASettings, lora_folder
from agentlightning_torch.training._policy_progress import PolicyProgress, lora_drift
from agentlightning_torch.training._policy_settings import PolicySettings, trained_names
from agentlightning_torch.training._ppo import PPOConfig, ppo_update

__all__ = ["LoRAPolicies", "policy_metric", "watch_progress"]

logger = logging.getLogger(__name__)

_OPTIMIZERS_FILE = "policy_optimizers.pt"


def policy_metric(policy: str, name: str) -> str:
    """The metrics key of one policy's metric (``policy/writer/reward_mean``)."""
    return f"policy/{policy}/{name}"


def _lora_config(settings: LoRASettings) -> Any:
    try:
        from peft import LoraConfig
    except ImportError as error:
        raise ImportError("LoRA policies need peft: pip install 'agentlightning-torch[lora]'") from error
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )


class LoRAPolicies:
    """The trained policies of a run: one LoRA adapter each on one shared base model.

    Args:
        model: The base model (wrapped in place: its layers get the adapters).
        policies: The trained policies' names (`agentlightning.PolicyMap.trained`), at least one.
        ppo: The run's update settings (betas, clipping, batching...; ``lora`` is every adapter's default shape).
        settings: Per policy, its own learning rate, KL weight and LoRA shape (`PolicySettings`); a policy without
            an entry gets ``PolicySettings()``'s defaults.

    Raises:
        ValueError: No policy, a repeated one, `agentlightning.FROZEN` among them, or settings for a policy that is
            not trained here.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        policies: Sequence[str],
        ppo: PPOConfig,
        settings: Mapping[str, PolicySettings] | None = None,
    ) -> None:
        from peft import get_peft_model

        names = trained_names("LoRAPolicies", policies, settings)
        full = sorted(name for name, entry in (settings or {}).items() if entry.weights == "full")
        if full:
            raise ValueError(f"policies {full} have full weights, not adapters: train them with TrainedPolicies")
        self.names = names
        self.settings = {name: (settings or {}).get(name) or PolicySettings() for name in names}
        self.ppo = {name: self.settings[name].ppo(ppo) for name in names}
        """Per policy, its update settings (the run's with its learning rate and KL weight)."""
        self.lora = {name: self.settings[name].lora_settings(ppo) for name in names}
        """Per policy, its adapter's shape."""
        self.described = {name: self.settings[name].describe(ppo) for name in names}
        """Per policy, the settings in use (reported by runs and comparisons)."""
        first: Any = _lora_config(self.lora[names[0]])
        peft_model: Any = get_peft_model(model, first, adapter_name=names[0])  # type: ignore[arg-type]
        for name in names[1:]:
            peft_model.add_adapter(name, _lora_config(self.lora[name]))
        self.model: Any = peft_model
        self.optimizers = {
            name: torch.optim.AdamW(
                self.parameters(name), lr=self.ppo[name].lr, betas=ppo.betas, weight_decay=ppo.weight_decay
            )
            for name in names
        }
        self.progress = PolicyProgress(names)
        for name in names:
            logger.info("policy %s: %s", name, self.described[name])
        self.skipped: dict[str, int] = dict.fromkeys(names, 0)
        """Per policy, the iterations it had no samples in (and so was not updated)."""
        self.updated: list[str] = []
        """The policies the last `update` changed."""

    def parameters(self, name: str) -> list[torch.nn.Parameter]:
        """The LoRA weights of adapter ``name`` (what its optimizer steps)."""
        marker = f".{name}."
        found = [p for n, p in self.model.named_parameters() if "lora_" in n and marker in n]
        if not found:
            raise ValueError(f"no LoRA weights for adapter {name!r}")
        return found

    def split(self, batch: TrainingBatch) -> dict[str, list[TrainingSample]]:
        """The batch's samples by policy (`split_by_policy`)."""
        return split_by_policy(batch)

    def update(self, batch: TrainingBatch, device: str | torch.device = "cpu") -> dict[str, float]:
        """One PPO update per policy with samples, each on its own adapter with its own optimizer.

        Returns:
            Per policy ``policy/<name>/<metric>``: every `ppo_update` metric (``kl``, ``loss``...), ``samples``,
            ``reward_mean`` (the mean credit of its samples), ``skipped`` (1 when it had no samples),
            ``skipped_total``, ``drift`` (how far its weights moved from the start, `lora_drift`) and ``flat``
            (1 while `PolicyProgress` calls it flat: a warning is logged when it turns flat); plus
            ``policies_updated``, ``policies_skipped`` and ``samples_untrained`` (samples of the frozen base or of a
            policy that is not trained here).
        """
        groups = self.split(batch)
        metrics: dict[str, float] = {}
        self.updated = []
        for name in self.names:
            metrics.update(self.update_one(name, groups.pop(name, []), device))
        metrics.update(self._watch_progress())
        metrics["policies_updated"] = float(len(self.updated))
        metrics["policies_skipped"] = float(len(self.names) - len(self.updated))
        metrics["samples_untrained"] = float(sum(len(v) for v in groups.values()))
        return metrics

    def update_one(self, name: str, samples: list[TrainingSample], device: str | torch.device) -> dict[str, float]:
        """Policy ``name``'s PPO update on its samples (or its skip, counted); its ``policy/<name>/...`` metrics.

        Appends ``name`` to `updated` when it took a step (`update` clears that list first)."""

        def step(sub: TrainingBatch) -> dict[str, float]:
            self.model.set_adapter(name)  # only this adapter is active and trainable
            return ppo_update(self.model, self.optimizers[name], sub, self.ppo[name], device)

        return update_policy(name, samples, step, self.skipped, self.updated)

    def drift(self, name: str) -> float:
        """How far adapter ``name`` moved from the start (`lora_drift`)."""
        return lora_drift(self.model, name)

    def _watch_progress(self) -> dict[str, float]:
        """Every policy's drift and flat flag after this update; a warning for each policy that turned flat."""
        drift = {name: self.drift(name) for name in self.names}
        return watch_progress(self.progress, self.described, drift, self.updated)

    def save(self, directory: Path) -> None:
        """Every adapter as ``adapters/<name>/`` (``save_pretrained``) and every optimizer's state."""
        self.model.save_pretrained(str(directory / LORAS_FOLDER), selected_adapters=self.names)
        states = {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()}
        torch.save({"optimizers": states, "skipped": dict(self.skipped)}, directory / _OPTIMIZERS_FILE)

    def load(self, directory: Path, device: str | torch.device = "cpu") -> None:
        """Restore every adapter and optimizer `save` wrote.

        Raises:
            FileNotFoundError: An adapter or the optimizers' state is missing (another run's checkpoint).
        """
        from peft import load_peft_weights, set_peft_model_state_dict

        for name in self.names:
            folder = self.lora_folder(directory, name)
            if not (folder / "adapter_config.json").is_file():
                raise FileNotFoundError(f"{folder} holds no adapter: the checkpoint has no policy {name!r}")
            set_peft_model_state_dict(self.model, load_peft_weights(str(folder), device=str(device)), adapter_name=name)
        state_file = directory / _OPTIMIZERS_FILE
        if not state_file.is_file():
            raise FileNotFoundError(f"{state_file} does not exist: not a multi-policy checkpoint")
        state: dict[str, Any] = torch.load(state_file, map_location=device, weights_only=False)
        for name in self.names:
            self.optimizers[name].load_state_dict(state["optimizers"][name])
        self.skipped.update(state.get("skipped", {}))

    @property
    def max_rank(self) -> int:
        """The largest adapter rank (what a multi-LoRA server must be started for)."""
        return max(lora.r for lora in self.lora.values())

    @staticmethod
    def lora_folder(directory: Path, name: str) -> Path:
        """Where a checkpoint keeps adapter ``name`` (what peft's ``save_pretrained`` writes for it)."""
        return lora_folder(directory, name)


def split_by_policy(batch: TrainingBatch) -> dict[str, list[TrainingSample]]:
    """The batch's samples by policy (samples of `FROZEN` or of an unknown policy under their own key)."""
    groups: dict[str, list[TrainingSample]] = {}
    for sample in batch.samples:
        groups.setdefault(sample.policy or FROZEN, []).append(sample)
    return groups


def update_policy(
    name: str,
    samples: list[TrainingSample],
    step: Callable[[TrainingBatch], dict[str, float]],
    skipped: dict[str, int],
    updated: list[str],
) -> dict[str, float]:
    """One policy's share of an update: ``step`` on its samples (its PPO update), or its skip counted in ``skipped``;
    appends ``name`` to ``updated`` when it took a step. Returns its ``policy/<name>/...`` metrics."""
    metrics = {policy_metric(name, "samples"): float(len(samples))}
    if not samples:
        skipped[name] += 1
        metrics[policy_metric(name, "skipped")] = 1.0
        metrics[policy_metric(name, "skipped_total")] = float(skipped[name])
        logger.info("policy %s had no samples this iteration: not updated", name)
        return metrics
    result = step(TrainingBatch(samples=samples, metrics={}))
    metrics.update({policy_metric(name, key): value for key, value in result.items()})
    metrics[policy_metric(name, "reward_mean")] = sum(s.credit for s in samples) / len(samples)
    metrics[policy_metric(name, "skipped")] = 0.0
    metrics[policy_metric(name, "skipped_total")] = float(skipped[name])
    updated.append(name)
    return metrics


def watch_progress(
    progress: PolicyProgress,
    described: Mapping[str, Mapping[str, Any]],
    drift: Mapping[str, float],
    updated: Sequence[str],
) -> dict[str, float]:
    """Record one update in ``progress`` (the updated policies, every policy's drift); log a warning naming the
    setting to look at for each policy that turned flat; return every policy's ``drift`` and ``flat`` metrics."""
    for name, warning in progress.record(updated, drift).items():
        logger.warning("%s", warning + _hint(described[name]))
    flags = {policy_metric(name, "flat"): float(name in progress.flat) for name in drift}
    return {**{policy_metric(name, "drift"): value for name, value in drift.items()}, **flags}


def _hint(described: Mapping[str, Any]) -> str:
    if described.get("weights") == "full":
        return (
            f": look at its learning rate (now {described['lr']:.3g}; "
            "set it with --policy-settings POLICY:lr=..., or PolicySettings.lr)"
        )
    return (
        f": look at its learning rate (now {described['lr']:.3g}; LoRA usually needs about 10x a full-weight rate; "
        f"set it with --policy-settings POLICY:lr=..., or PolicySettings.lr) or its LoRA rank ({described['lora_r']})"
    )
