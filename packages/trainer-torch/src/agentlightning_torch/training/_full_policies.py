"""Policies with full weights of their own: a copy of the base model per policy, each with its own optimizer.

A trained policy whose `PolicySettings` say ``weights="full"`` gets its own copy of every weight of the base model
(made before LoRA adapters of other policies wrap the base in place), its own AdamW over all of them, and only its
own samples; its KL penalty (``kl_coef > 0``) is to the frozen base (`FrozenBase`: the shared base with every adapter
switched off, no further copy). Updating one policy touches only its copy. For a small model a copy per agent is
cheap, and full-weight updates learn at the usual full-weight learning rate (the run's ``ppo.lr``, its default).

Drift is ``||W - W0|| / ||W0||`` over all of the policy's weights, ``W0`` being the frozen base's (the same tensors,
held by reference). Checkpoints hold each policy as ``policies/<name>/`` (a ``save_pretrained`` folder transformers
and vLLM load) with its optimizer's state in ``policies/<name>/optimizer.pt``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_torch.models._lora import is_lora
from agentlightning_torch.training._lora_policies import update_policy
from agentlightning_torch.training._policy_settings import PolicySettings
from agentlightning_torch.training._ppo import PPOConfig, make_optimizer, ppo_update

__all__ = ["POLICIES_FOLDER", "FrozenBase", "FullPolicies"]

logger = logging.getLogger(__name__)

POLICIES_FOLDER = "policies"
"""A multi-policy checkpoint's folder of full-weight policies: one ``save_pretrained`` folder per policy under it."""

_OPTIMIZER_FILE = "optimizer.pt"


class FrozenBase(torch.nn.Module):
    """The frozen base model as a reference for the KL penalty: with LoRA adapters on it, they are switched off.

    Args:
        model: The base model, or the peft model whose adapters wrap it (held, not registered as a submodule, so
            this module's ``train()``/``eval()`` leave its mode alone).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self._held = [model]
        self.config = getattr(model, "config", None)

    @property
    def model(self) -> torch.nn.Module:
        """The model held (the base, or the peft model around it)."""
        return self._held[0]

    def forward(self, **inputs: Any) -> Any:
        """The base's output: with adapters, computed with every adapter disabled."""
        held: Any = self.model
        was_training = held.training
        held.eval()
        try:
            if is_lora(held):
                with held.disable_adapter():
                    return held(**inputs)
            return held(**inputs)
        finally:
            held.train(was_training)


class FullPolicies:
    """The full-weight policies of a run: each a copy of the base model with its own optimizer.

    Args:
        model: The base model (copied once per policy; itself left as it is).
        policies: The full-weight policies' names.
        ppo: The run's update settings.
        settings: Per policy, its `PolicySettings` (``weights="full"``; learning rate and KL weight).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        policies: Sequence[str],
        ppo: PPOConfig,
        settings: Mapping[str, PolicySettings],
    ) -> None:
        self.names = list(policies)
        self.ppo = {name: settings[name].ppo(ppo) for name in self.names}
        """Per policy, its update settings (the run's with its learning rate and KL weight)."""
        self.described = {name: settings[name].describe(ppo) for name in self.names}
        """Per policy, the settings in use."""
        # W0 for drift: the base's own tensors (it never trains), by reference
        self._start = {key: value.detach() for key, value in model.state_dict().items()}
        self.models: dict[str, torch.nn.Module] = {}
        """Per policy, its own weights (a copy of the base model, every weight trainable)."""
        for name in self.names:
            copied = copy.deepcopy(model)
            copied.requires_grad_(True)
            self.models[name] = copied
        self.optimizers = {name: make_optimizer(self.models[name], self.ppo[name]) for name in self.names}
        self.reference: torch.nn.Module | None = None
        """The frozen base each policy's KL penalty is to (set by the owner; needed when a ``kl_coef`` > 0)."""
        self.skipped: dict[str, int] = dict.fromkeys(self.names, 0)
        """Per policy, the iterations it had no samples in."""
        self.updated: list[str] = []
        """The policies updated since the owner last cleared this list."""

    def update_one(self, name: str, samples: list[TrainingSample], device: str | torch.device) -> dict[str, float]:
        """Policy ``name``'s PPO update on its own weights (or its skip, counted); its ``policy/<name>/...`` metrics.

        Raises:
            ValueError: Its ``kl_coef`` is above 0 and no `reference` is set.
        """
        config = self.ppo[name]
        reference = self.reference if config.kl_coef > 0 else None

        def step(sub: TrainingBatch) -> dict[str, float]:
            return ppo_update(self.models[name], self.optimizers[name], sub, config, device, ref_model=reference)

        return update_policy(name, samples, step, self.skipped, self.updated)

    def drift(self, name: str) -> float:
        """``||W - W0|| / ||W0||`` of policy ``name`` over all its weights (0.0 before its first update)."""
        moved = base = 0.0
        with torch.no_grad():
            for key, value in self.models[name].state_dict().items():
                start = self._start.get(key)
                if start is None or not value.is_floating_point():
                    continue
                moved += float((value.float() - start.float()).pow(2).sum())
                base += float(start.float().pow(2).sum())
        return (moved / base) ** 0.5 if base else 0.0

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """Policy ``name``'s weights, detached (what its serving backend loads at a sync)."""
        return {key: value.detach() for key, value in self.models[name].state_dict().items()}

    def save(self, directory: Path) -> None:
        """Every policy as ``policies/<name>/`` (``save_pretrained``) with its optimizer's state and skip count."""
        for name in self.names:
            folder = directory / POLICIES_FOLDER / name
            model: Any = self.models[name]
            model.save_pretrained(str(folder), safe_serialization=True)
            state = {"optimizer": self.optimizers[name].state_dict(), "skipped": self.skipped[name]}
            torch.save(state, folder / _OPTIMIZER_FILE)

    def load(self, directory: Path, device: str | torch.device = "cpu") -> None:
        """Restore every policy's weights and optimizer `save` wrote.

        Raises:
            FileNotFoundError: A policy's folder or optimizer state is missing (another run's checkpoint).
        """
        from transformers import AutoModelForCausalLM

        for name in self.names:
            folder = directory / POLICIES_FOLDER / name
            state_file = folder / _OPTIMIZER_FILE
            if not (folder / "config.json").is_file() or not state_file.is_file():
                raise FileNotFoundError(f"{folder} holds no full-weight policy: the checkpoint has no policy {name!r}")
            saved: Any = AutoModelForCausalLM.from_pretrained(str(folder))
            with torch.no_grad():
                self.models[name].load_state_dict(saved.state_dict())
            state: dict[str, Any] = torch.load(state_file, map_location=device, weights_only=False)
            self.optimizers[name].load_state_dict(state["optimizer"])
            self.skipped[name] = int(state.get("skipped", 0))
