"""LoRA adapters served beside one base model: what `LocalBackend.load_lora` takes, and how it installs them.

One base model stays in memory; each policy is a LoRA adapter on it (peft). Rows of one decode step may use
different adapters: peft's mixed-batch forward (``adapter_names=[...]``, one per row, `NO_LORA` for the bare
base model) runs the base layers once for the whole batch and each adapter's low-rank update on its own rows.

An adapter comes from a peft model that holds it (the trainer's copy: its config and weights are taken), from a
folder written by ``save_pretrained`` (``adapter_config.json`` + ``adapter_model.safetensors``, what vLLM loads too),
or from a config and a state dict.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

__all__ = ["NO_LORA", "LoRAWeights", "install_lora", "lora_weights", "merged_state_dict"]

NO_LORA = "__base__"
"""peft's name for "no adapter" in a mixed batch: rows served by the bare base model."""


@dataclass(frozen=True)
class LoRAWeights:
    """One LoRA adapter: its peft config and its weights (keys as ``get_peft_model_state_dict`` names them)."""

    config: Any
    state: dict[str, torch.Tensor]


def lora_weights(source: Any, name: str, config: Any = None) -> LoRAWeights:
    """The config and weights of adapter ``name`` from a peft model, a ``save_pretrained`` folder or a state dict.

    Args:
        source: A peft model holding adapter ``name``; a folder (``str`` / `Path`) written by ``save_pretrained``;
            or a state dict (then ``config`` is required).
        name: The adapter's name (in a peft model: the adapter to take).
        config: The ``LoraConfig`` for a state dict (ignored otherwise).

    Raises:
        ValueError: The peft model has no adapter ``name``, the folder is not an adapter, or a state dict comes
            without a config.
    """
    from peft import PeftConfig, get_peft_model_state_dict, load_peft_weights

    if isinstance(source, (str, Path)):
        folder = Path(source)
        if not (folder / "adapter_config.json").is_file():
            raise ValueError(f"{folder} holds no LoRA adapter (no adapter_config.json, which save_pretrained writes)")
        loaded = PeftConfig.from_pretrained(str(folder))
        return LoRAWeights(loaded, dict(load_peft_weights(str(folder), device="cpu")))
    peft_config = getattr(source, "peft_config", None)
    if isinstance(peft_config, dict):
        configs = cast(dict[str, Any], peft_config)
        if name not in configs:
            raise ValueError(f"the peft model has no adapter {name!r} (it has {sorted(configs)})")
        state = get_peft_model_state_dict(source, adapter_name=name)
        return LoRAWeights(copy.deepcopy(configs[name]), {k: v.detach().clone() for k, v in state.items()})
    if isinstance(source, Mapping):
        if config is None:
            raise ValueError("an adapter given as a state dict needs its LoraConfig (config=...)")
        tensors = cast(Mapping[str, torch.Tensor], source)
        return LoRAWeights(config, {k: v.detach().clone() for k, v in tensors.items()})
    raise ValueError(f"an adapter comes from a peft model, a save_pretrained folder or a state dict, got {source!r}")


def install_lora(model: Any, name: str, weights: LoRAWeights) -> Any:
    """Add (or replace the weights of) adapter ``name`` on ``model``; returns the model to serve (peft-wrapped).

    The first adapter wraps the plain model in a peft model (the base weights are shared, not copied); later ones
    are added to it. An adapter already there keeps its modules and gets the new weights.

    Raises:
        ValueError: The weights do not fit the adapter (a different rank or target modules): nothing is half-loaded.
    """
    from peft import get_peft_model, set_peft_model_state_dict

    config = copy.deepcopy(weights.config)
    config.inference_mode = True
    if not hasattr(model, "peft_config"):
        model = get_peft_model(model, config, adapter_name=name)
    elif name not in model.peft_config:
        model.add_adapter(name, config)
    expected = {k for k in _lora_state(model, name)}
    given = set(weights.state)
    if expected != given:
        missing, extra = sorted(expected - given)[:3], sorted(given - expected)[:3]
        raise ValueError(
            f"adapter {name!r}: the weights do not fit its modules (missing {missing}, unexpected {extra}); an adapter "
            "keeps its rank and target modules for the whole run"
        )
    for key, value in _lora_state(model, name).items():
        if tuple(value.shape) != tuple(weights.state[key].shape):
            raise ValueError(
                f"adapter {name!r}: {key} has shape {tuple(weights.state[key].shape)}, the served adapter "
                f"{tuple(value.shape)}; an adapter keeps its rank for the whole run"
            )
    set_peft_model_state_dict(model, weights.state, adapter_name=name)
    model.eval()
    return model


def _lora_state(model: Any, name: str) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return dict(get_peft_model_state_dict(model, adapter_name=name))


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain (non-LoRA) state dict of ``model``: a PEFT model's adapters are merged into a copy first."""
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        merged = copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]
        return {k: v.detach() for k, v in merged.state_dict().items()}
    return {k: v.detach() for k, v in model.state_dict().items()}
