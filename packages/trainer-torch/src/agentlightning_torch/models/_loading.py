"""Load any Hugging Face causal LM with a chat template: a local folder or a hub id, through the Auto classes."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

__all__ = ["LoadedModel", "MissingChatTemplateError", "count_parameters", "eos_token_ids", "load_model"]

logger = logging.getLogger(__name__)


class MissingChatTemplateError(ValueError):
    """The tokenizer has no chat template, so chat requests cannot be rendered."""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to serve or train.

    Attributes:
        model: The causal LM (eval mode, on the requested device).
        tokenizer: Its tokenizer, with a chat template.
        generation_config: The folder's ``generation_config.json`` (or one derived from the model config).
        source: The folder or hub id it was loaded from.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    generation_config: GenerationConfig
    source: str

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends a response: the generation config's eos ids and the tokenizer's eos."""
        return eos_token_ids(self.tokenizer, self.generation_config)


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig | None) -> frozenset[int]:
    """The union of the generation config's ``eos_token_id`` (an int or a list) and the tokenizer's eos id."""
    ids: set[int] = set()
    configured: Any = getattr(generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, (list, tuple)):
        ids.update(int(i) for i in configured)  # type: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    own: Any = getattr(tokenizer, "eos_token_id", None)
    if isinstance(own, int):
        ids.add(own)
    return frozenset(ids)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def _default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_model(
    path_or_id: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    chat_template: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load a causal LM, its tokenizer and generation config with the transformers Auto classes.

    Args:
        path_or_id: A local model folder (``config.json``, weights, tokenizer files) or a hub id such as
            ``Qwen/Qwen2.5-0.5B-Instruct`` (needs internet, or the hub cache).
        device: Where the model goes.
        dtype: Weight dtype; ``None`` means float32 on CPU and bfloat16 on a CUDA device that supports it.
        chat_template: A Jinja chat template to use instead of (or in the absence of) the tokenizer's own.
        trust_remote_code: Passed to transformers (only for models that need custom code).

    Returns:
        The model (eval mode), tokenizer and generation config.

    Raises:
        FileNotFoundError: If ``path_or_id`` names a local path that does not exist or has no ``config.json``.
        MissingChatTemplateError: If the tokenizer has no chat template and none was given.
    """
    source = str(path_or_id)
    local = Path(path_or_id).expanduser()
    looks_local = local.exists() or source.startswith((".", "/", "~")) or source.count("/") > 1
    if looks_local:
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in {local}: not a saved model folder")
        source = str(local)
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
        source, trust_remote_code=trust_remote_code
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if not tokenizer.chat_template:
        raise MissingChatTemplateError(
            f"{source} has no chat template: add a Jinja template as chat_template.jinja in the folder (or "
            "'chat_template' in tokenizer_config.json), e.g. agentlightning_torch.HERMES_CHAT_TEMPLATE for a "
            "ChatML model with hermes tool calls"
        )
    target = torch.device(device)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
        source, dtype=dtype or _default_dtype(target), trust_remote_code=trust_remote_code
    )
    torch.nn.Module.to(model, target)
    model.eval()
    generation_config = model.generation_config or GenerationConfig.from_model_config(model.config)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token  # pyright: ignore[reportAttributeAccessIssue]
    logger.info("loaded %s (%s) on %s", source, type(model).__name__, target)
    return LoadedModel(model=model, tokenizer=tokenizer, generation_config=generation_config, source=source)
