"""LoRA adapters for the policy: their settings, wrapping a model with them, and telling a wrapped model apart."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LORAS_FOLDER", "LoRASettings", "apply_lora", "is_lora", "lora_folder"]

LORAS_FOLDER = "adapters"
"""A folder of LoRA adapters (a multi-policy checkpoint's, or one handed to vLLM): one ``save_pretrained`` folder per
adapter under it."""


class LoRASettings(BaseModel):
    """LoRA adapters (needs ``peft``: ``pip install 'agentlightning-torch[lora]'``).

    Attributes:
        r: Adapter rank.
        alpha: Scaling numerator (``alpha / r`` scales the adapter).
        dropout: Dropout on the adapter input.
        target_modules: Module names that get adapters.
        serve: How the trainer serves the policy: ``merged`` (adapters folded into a plain copy of the model: the
            fastest generation) or ``adapter`` (the served copy keeps the adapters, and a weight sync copies only
            them: cheaper syncs of a large model). Checkpoints hold both the merged model and the adapter.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    serve: Literal["merged", "adapter"] = "merged"


def apply_lora(model: torch.nn.Module, settings: LoRASettings) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters; only the adapters stay trainable.

    Raises:
        ImportError: If ``peft`` is not installed (the message has the install command).
    """
    try:
        from peft import LoraConfig, get_peft_model  # type: ignore[import-not-found]
    except ImportError as error:
        raise ImportError("LoRA needs peft: pip install 'agentlightning-torch[lora]'") from error
    lora_config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora_config)  # type: ignore[arg-type]


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a PEFT model (LoRA adapters over a frozen base)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def lora_folder(directory: Path, name: str) -> Path:
    """Where ``directory`` keeps adapter ``name`` under `LORAS_FOLDER` (what peft's ``save_pretrained`` writes)."""
    root = directory / LORAS_FOLDER
    # peft writes the first selected adapter named "default" at the root, any other under its name
    return root if name == "default" else root / name
