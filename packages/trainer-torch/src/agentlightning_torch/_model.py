"""The tiny Llama-style model of the CPU quickstart: build from a seed, save and load next to its tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from agentlightning_torch._tokenizer import TOKENIZER_FILE, CharTokenizer

__all__ = ["build_tiny_model", "count_parameters", "load_tiny", "save_tiny"]

logger = logging.getLogger(__name__)


def build_tiny_model(
    tokenizer: CharTokenizer,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_positions: int = 128,
) -> LlamaForCausalLM:
    """A randomly initialised Llama causal LM sized for ``tokenizer`` (defaults: about 1.05M parameters).

    The initialisation is deterministic: the same seed and sizes give the same weights.

    Raises:
        ValueError: If ``hidden_size`` is not divisible by ``num_heads``.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    devices_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(devices_state)
    model.eval()
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_tiny(model: PreTrainedModel, tokenizer: CharTokenizer, directory: str | Path) -> Path:
    """Save the model (``config.json`` + ``model.safetensors``) and the tokenizer JSON into ``directory``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    logger.info("saved model and tokenizer to %s", path)
    return path


def load_tiny(directory: str | Path, *, device: str | torch.device = "cpu") -> tuple[LlamaForCausalLM, CharTokenizer]:
    """Load a model and tokenizer saved by `save_tiny` (or by ``python -m agentlightning_torch.tiny warmstart``).

    Raises:
        FileNotFoundError: If the directory lacks ``config.json`` or the tokenizer file.
    """
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}: not a saved model directory")
    if not (path / TOKENIZER_FILE).is_file():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {path}: save the tokenizer next to the model")
    tokenizer = CharTokenizer.from_pretrained(path)
    model = LlamaForCausalLM.from_pretrained(path)
    torch.nn.Module.to(model, device)
    model.eval()
    return model, tokenizer
