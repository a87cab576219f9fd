"""What `TorchEngine` trains, modelled once: `Policies` (update, save, load), one policy (`SinglePolicy`) or several
(`agentlightning_torch.TrainedPolicies`), picked when the engine is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from agentlightning import TrainingBatch
from agentlightning.loop import BEST_CHECKPOINT
from agentlightning_torch.models._checkpoint import load_lora_weights, load_trainer_state, save_checkpoint
from agentlightning_torch.models._loading import load_model
from agentlightning_torch.models._lora import is_lora
from agentlightning_torch.training._ppo import PPOConfig, ppo_update

__all__ = ["Policies", "SinglePolicy"]


class Policies(Protocol):
    """The trained weights of a `TorchEngine`: how they update, and how a checkpoint keeps them."""

    def update(self, batch: TrainingBatch, device: str | torch.device = "cpu") -> dict[str, float]:
        """One PPO update from ``batch``; returns its metrics."""
        ...

    def save(self, directory: Path, tokenizer: Any = None) -> None:
        """Write the weights and optimizer state (and ``tokenizer``) into ``directory``."""
        ...

    def load(self, directory: Path, device: str | torch.device = "cpu") -> None:
        """Restore what `save` wrote in ``directory``."""
        ...


class SinglePolicy:
    """One trained policy (full weights, or a LoRA adapter on its base) with its optimizer.

    Args:
        policy: The trained model.
        optimizer: Its optimizer.
        ppo: The update settings.
        ref_model: The KL penalty's frozen reference (``None``: no penalty, or a LoRA policy's own base).
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        ppo: PPOConfig,
        ref_model: torch.nn.Module | None = None,
    ) -> None:
        self.policy = policy
        self.optimizer = optimizer
        self.ppo = ppo
        self.ref_model = ref_model

    def update(self, batch: TrainingBatch, device: str | torch.device = "cpu") -> dict[str, float]:
        """One PPO step on ``batch`` (`ppo_update`)."""
        return ppo_update(self.policy, self.optimizer, batch, self.ppo, device, ref_model=self.ref_model)

    def save(self, directory: Path, tokenizer: Any = None) -> None:
        """A plain ``save_pretrained`` folder (LoRA merged; ``adapter/`` too for LoRA) plus the optimizer state; the
        best checkpoint inside it (``best/``) is kept."""
        state = {"optimizer": self.optimizer.state_dict()}
        save_checkpoint(self.policy, tokenizer, directory, state, keep=(BEST_CHECKPOINT,))

    def load(self, directory: Path, device: str | torch.device = "cpu") -> None:
        """Load the weights (or LoRA adapter) and optimizer state `save` wrote.

        Raises:
            FileNotFoundError: ``directory`` has no trainer state.
        """
        if is_lora(self.policy):
            load_lora_weights(self.policy, directory)
        else:
            saved: Any = load_model(directory, device=device).model
            self.policy.load_state_dict(saved.state_dict())
        state = load_trainer_state(directory, device)
        if state is None:
            raise FileNotFoundError(f"{directory} has no trainer state: not a checkpoint written by TorchEngine")
        self.optimizer.load_state_dict(state["optimizer"])
