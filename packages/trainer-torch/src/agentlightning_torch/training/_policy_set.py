"""Every trained policy of a multi-policy run, of either kind: LoRA adapters on the shared base, or full weights.

`TrainedPolicies` builds the full-weight policies (`FullPolicies`: a copy of the base each, made first) and then the
LoRA ones (`LoRAPolicies`, which wrap the base in place), splits each batch by the samples' policy across both,
and merges their metrics (``policy/<name>/...``, the same keys for both kinds) with one `PolicyProgress` over all of
them, so a policy that barely moves is named whichever kind it and the policy it lags behind are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_torch.training._full_policies import FrozenBase, FullPolicies
from agentlightning_torch.training._lora_policies import LoRAPolicies, split_by_policy, watch_progress
from agentlightning_torch.training._policy_progress import PolicyProgress
from agentlightning_torch.training._policy_settings import PolicySettings, trained_names
from agentlightning_torch.training._ppo import PPOConfig

__all__ = ["TrainedPolicies"]


class TrainedPolicies:
    """The trained policies of a run, each a LoRA adapter or full weights of its own (`PolicySettings.weights`).

    Args:
        model: The base model: copied for each full-weight policy, then wrapped in place by the adapters.
        policies: The trained policies' names (`agentlightning.PolicyMap.trained`), at least one.
        ppo: The run's update settings.
        settings: Per policy, its `PolicySettings` (a policy without an entry: a LoRA adapter with the defaults).

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
        names = trained_names("TrainedPolicies", policies, settings)
        given = dict(settings or {})
        resolved = {name: given.get(name) or PolicySettings() for name in names}
        full_names = [name for name in names if resolved[name].weights == "full"]
        lora_names = [name for name in names if name not in full_names]
        self.names = names
        # the copies first: the adapters then wrap the base's layers in place
        self.full = FullPolicies(model, full_names, ppo, resolved) if full_names else None
        """The full-weight policies (``None``: none)."""
        lora_settings = {name: given[name] for name in lora_names if name in given}
        self.lora = LoRAPolicies(model, lora_names, ppo, lora_settings) if lora_names else None
        """The LoRA policies on the shared base (``None``: none)."""
        self.base: torch.nn.Module = self.lora.model if self.lora is not None else model.requires_grad_(False)
        """The frozen base (the peft model around it when there are adapters: what the base backend serves)."""
        if self.full is not None:
            self.full.reference = FrozenBase(self.base)
        self.described = {name: self._kind(name).described[name] for name in names}
        """Per policy, the settings in use (``weights``: ``lora`` or ``full``)."""
        kinds = {name: str(self.described[name]["weights"]) for name in names}
        self.progress = PolicyProgress(names, kinds=kinds)
        self.updated: list[str] = []
        """The policies the last `update` changed (of both kinds)."""

    def _kind(self, name: str) -> LoRAPolicies | FullPolicies:
        if self.full is not None and name in self.full.names:
            return self.full
        assert self.lora is not None
        return self.lora

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Per policy, its optimizer."""
        return {name: self._kind(name).optimizers[name] for name in self.names}

    @property
    def skipped(self) -> dict[str, int]:
        """Per policy, the iterations it had no samples in (and so was not updated)."""
        return {name: self._kind(name).skipped[name] for name in self.names}

    def split(self, batch: TrainingBatch) -> dict[str, list[TrainingSample]]:
        """The batch's samples by policy (`split_by_policy`)."""
        return split_by_policy(batch)

    def update(self, batch: TrainingBatch, device: str | torch.device = "cpu") -> dict[str, float]:
        """One PPO update per policy with samples, each on its own weights with its own optimizer.

        Returns:
            The metrics `LoRAPolicies.update` returns, for the policies of both kinds.
        """
        groups = self.split(batch)
        for kind in (self.lora, self.full):
            if kind is not None:
                kind.updated = []
        metrics: dict[str, float] = {}
        for name in self.names:
            metrics.update(self._kind(name).update_one(name, groups.pop(name, []), device))
        self.updated = [name for name in self.names if name in self._kind(name).updated]
        drift = {name: self._kind(name).drift(name) for name in self.names}
        metrics.update(watch_progress(self.progress, self.described, drift, self.updated))
        metrics["policies_updated"] = float(len(self.updated))
        metrics["policies_skipped"] = float(len(self.names) - len(self.updated))
        metrics["samples_untrained"] = float(sum(len(v) for v in groups.values()))
        return metrics

    def save(self, directory: Path, tokenizer: Any = None) -> None:
        """Every policy: adapters as `LoRAPolicies.save` writes them, full weights as `FullPolicies.save`; and
        ``tokenizer`` (if given) at the top."""
        for kind in (self.lora, self.full):
            if kind is not None:
                kind.save(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(directory))

    def load(self, directory: Path, device: str | torch.device = "cpu") -> None:
        """Restore every policy `save` wrote (weights, optimizers, skip counts)."""
        for kind in (self.lora, self.full):
            if kind is not None:
                kind.load(directory, device)
