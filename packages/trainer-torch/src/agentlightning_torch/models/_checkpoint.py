"""Checkpoints: plain ``save_pretrained`` folders that transformers and vLLM load directly, plus the trainer's state.

A checkpoint folder holds the full (LoRA-merged) model — ``config.json``, ``generation_config.json``,
``model.safetensors`` — and the tokenizer with its chat template, exactly what
``AutoModelForCausalLM.from_pretrained(folder)`` / ``AutoTokenizer.from_pretrained(folder)`` or
``vllm serve folder`` expect. A LoRA run also writes ``adapter/`` (a PEFT adapter folder, for serving as an
adapter), and every run writes ``trainer_state.pt`` (optimizer state, iteration, model version) to resume from.
The folder is written next to its final place and renamed into it, so a crash never leaves half a checkpoint.
`save_checkpoint` is also how a warm-started model is saved (``save_checkpoint(model, tokenizer, folder)``).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentlightning_torch.models._lora import is_lora

__all__ = ["TRAINER_STATE_FILE", "load_lora_weights", "load_trainer_state", "merged_model", "save_checkpoint"]

logger = logging.getLogger(__name__)

TRAINER_STATE_FILE = "trainer_state.pt"
"""File of a checkpoint folder holding the optimizer state, iteration and model version."""

LORA_FOLDER = "adapter"


def merged_model(policy: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the policy's weights: a LoRA policy's adapters merged into a copy, else the policy."""
    if is_lora(policy):
        peft_model: Any = copy.deepcopy(policy)
        return peft_model.merge_and_unload()
    return policy


def save_checkpoint(
    policy: torch.nn.Module,
    tokenizer: Any,
    directory: str | Path,
    trainer_state: dict[str, Any] | None = None,
    keep: Sequence[str] = (),
) -> Path:
    """Write ``policy`` (merged), ``tokenizer`` and ``trainer_state`` into ``directory``, replacing it atomically.

    Args:
        policy: The trained model (a transformers ``PreTrainedModel``, or a PEFT model around one).
        tokenizer: Its tokenizer (saved with its chat template).
        directory: The checkpoint folder.
        trainer_state: Saved with ``torch.save`` as ``trainer_state.pt`` when given.
        keep: Sub-folders of the folder being replaced that move into the new one (a nested checkpoint such as
            ``best``).

    Returns:
        The folder.
    """
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        model: Any = merged_model(policy)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        _name_tokenizer_class(staging)
        if is_lora(policy):
            peft_model: Any = policy
            peft_model.save_pretrained(staging / LORA_FOLDER)
        if trainer_state is not None:
            torch.save(trainer_state, staging / TRAINER_STATE_FILE)
        previous = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        if target.exists():
            target.rename(previous)
        staging.rename(target)
        for name in keep:  # moved once the new folder is in place: a failed save never loses them
            if (previous / name).is_dir() and not (target / name).exists():
                (previous / name).rename(target / name)
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("checkpoint saved to %s", target)
    return target


def _name_tokenizer_class(folder: Path) -> None:
    """Name the tokenizer class every transformers version (and vLLM) knows, not transformers 5's generic alias."""
    config_file = folder / "tokenizer_config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def load_trainer_state(directory: str | Path, device: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The ``trainer_state.pt`` of a checkpoint folder, or ``None`` when the folder has none."""
    state_file = Path(directory) / TRAINER_STATE_FILE
    if not state_file.is_file():
        return None
    state: dict[str, Any] = torch.load(state_file, map_location=device, weights_only=False)
    return state


def load_lora_weights(policy: torch.nn.Module, directory: str | Path) -> None:
    """Load the LoRA adapter saved in a checkpoint's ``adapter/`` folder into ``policy`` (a PEFT model).

    Raises:
        FileNotFoundError: If the checkpoint has no adapter (it was not a LoRA run).
    """
    from peft import set_peft_model_state_dict  # type: ignore[import-not-found]
    from safetensors.torch import load_file

    weights = Path(directory) / LORA_FOLDER / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} does not exist: the checkpoint was not written by a LoRA run")
    set_peft_model_state_dict(policy, load_file(str(weights)))  # type: ignore[arg-type]
