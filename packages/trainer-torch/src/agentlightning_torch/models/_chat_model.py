"""Small chat models made from scratch: a byte-level BPE chat tokenizer and a random Qwen2/Llama model for it.

The first half of a warm start on a CPU (`agentlightning_torch.models._sft` is the second):

1. `train_chat_tokenizer` trains a byte-level BPE tokenizer (the `tokenizers` library) on your texts, with the
   ChatML special tokens and the hermes tool-call tokens, and sets a chat template (`HERMES_CHAT_TEMPLATE`).
2. `build_chat_model` builds a randomly initialised Qwen2 (or Llama) causal LM sized for it, with a generation
   config whose eos ids end a turn.

Then `supervised_finetune` trains it and `save_checkpoint` writes a plain ``save_pretrained`` folder that
`load_model`, `LocalBackend`, plain transformers and vLLM load.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from agentlightning_torch.models._chat_templates import HERMES_CHAT_TEMPLATE

__all__ = ["CHAT_SPECIAL_TOKENS", "CHAT_TOOL_TOKENS", "build_chat_model", "train_chat_tokenizer"]

CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens of `train_chat_tokenizer`: pad (and document end), turn start, turn end (the chat eos)."""

CHAT_TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
"""Tags `HERMES_CHAT_TEMPLATE` and the ``hermes`` parser use, added as ordinary tokens (kept when decoding)."""

_TEMPLATE_CORPUS = (
    "You may call one or more functions. Their signatures are inside <tools></tools>:",
    'To call a function, write one JSON object per call inside <tool_call></tool_call> tags: {"name": '
    '"add", "arguments": {"a": 2, "b": 3}}',
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": '
    '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": '
    '["a", "b"]}}}',
    "The answer is 5. What is 2 plus 3? Hello, how are you today? system user assistant tool",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;!?'\"()[]{}<>/\\|-_+=*&^%$#@~`",
)

_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's pre-tokenizer split: words with one leading non-letter, single digits, punctuation runs, whitespace."""


def train_chat_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 1024,
    chat_template: str = HERMES_CHAT_TEMPLATE,
    include_template_text: bool = True,
    model_max_length: int | None = None,
    special_tool_tokens: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE chat tokenizer with the ChatML special tokens and a chat template.

    Every byte has a token, so any text encodes; merges come from ``texts``; digits are single tokens. The
    normaliser and pre-tokenizer are Qwen2's, so the tokenizer transformers loads from a saved Qwen2 folder
    tokenizes exactly like this one. ``<|im_end|>`` is the eos token,
    ``<|endoftext|>`` the pad token, ``<|im_start|>`` a special token; the hermes tags (`CHAT_TOOL_TOKENS`) are
    single ordinary tokens that survive decoding, as in Qwen2.5.

    Args:
        texts: Training text (e.g. your conversations' contents and tool schemas).
        vocab_size: Target vocabulary size (at least the 256 byte tokens plus the special tokens).
        chat_template: The Jinja chat template to set (it must use the ChatML tokens above).
        include_template_text: Also train on the fixed text `HERMES_CHAT_TEMPLATE` writes (its tool preamble).
        model_max_length: The tokenizer's ``model_max_length`` (e.g. the model's context length).
        special_tool_tokens: Add ``<tool_call>`` and ``</tool_call>`` as *special* tokens (as some Hermes models
            do), which a decode that skips special tokens drops: a server must keep them for its tool-call parser.

    Returns:
        A transformers fast tokenizer with ``chat_template`` set.

    Raises:
        ValueError: If there is no text to train on.
    """
    corpus = [*(_TEMPLATE_CORPUS if include_template_text else ()), *texts]
    if not any(corpus):
        raise ValueError("train_chat_tokenizer: no text to train the tokenizer on")
    backend = Tokenizer(models.BPE())
    # Qwen2's pipeline, which transformers rebuilds when it loads a Qwen2 folder's tokenizer: the ids a saved
    # folder renders must be the ids this tokenizer trains on.
    backend.normalizer = normalizers.NFC()  # pyright: ignore[reportAttributeAccessIssue]
    backend.pre_tokenizer = pre_tokenizers.Sequence(  # pyright: ignore[reportAttributeAccessIssue]
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()  # pyright: ignore[reportAttributeAccessIssue]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,  # pyright: ignore[reportCallIssue]
        special_tokens=list(CHAT_SPECIAL_TOKENS),  # pyright: ignore[reportCallIssue]
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # pyright: ignore[reportCallIssue]
        show_progress=False,  # pyright: ignore[reportCallIssue]
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    extra: dict[str, Any] = {} if model_max_length is None else {"model_max_length": model_max_length}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=CHAT_SPECIAL_TOKENS[2],
        pad_token=CHAT_SPECIAL_TOKENS[0],
        additional_special_tokens=[CHAT_SPECIAL_TOKENS[1]],
        clean_up_tokenization_spaces=False,
        **extra,
    )
    special = CHAT_TOOL_TOKENS[:2] if special_tool_tokens else ()
    ordinary = [token for token in CHAT_TOOL_TOKENS if token not in special]
    if special:
        tokenizer.add_tokens(list(special), special_tokens=True)  # pyright: ignore[reportUnknownMemberType]
    tokenizer.add_tokens(ordinary)  # pyright: ignore[reportUnknownMemberType]
    tokenizer.chat_template = chat_template
    return tokenizer


def build_chat_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    architecture: Literal["qwen2", "llama"] = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_positions: int = 1024,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised causal LM sized for ``tokenizer`` (deterministic for a seed; eval mode).

    The model config takes the tokenizer's pad, bos and eos ids; the generation config's eos ids are the
    tokenizer's eos plus ``<|endoftext|>`` when the vocabulary has it, so the backend stops on either.
    The global torch RNG is left as it was.

    Args:
        tokenizer: The tokenizer (its length is the vocabulary size).
        architecture: ``qwen2`` (``Qwen2ForCausalLM``, as Qwen2.5) or ``llama`` (``LlamaForCausalLM``).
        hidden_size: Model width (divisible by ``num_heads``).
        num_layers: Decoder layers.
        num_heads: Attention heads.
        num_kv_heads: Key/value heads (grouped-query attention); ``None`` means ``num_heads``.
        intermediate_size: MLP width; ``None`` means ``2 * hidden_size``.
        max_positions: Context length.
        tie_word_embeddings: Share the input embedding and the output head.
        seed: Seeds the initial weights.

    Returns:
        The model, with ``generation_config`` set.

    Raises:
        ValueError: If ``hidden_size`` is not divisible by ``num_heads`` or the tokenizer has no eos token.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    eos: Any = tokenizer.eos_token_id
    if not isinstance(eos, int):
        raise ValueError("the tokenizer has no eos token: set tokenizer.eos_token (the token that ends a turn)")
    pad: Any = tokenizer.pad_token_id
    bos: Any = tokenizer.bos_token_id
    settings: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size or 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads or num_heads,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": tie_word_embeddings,
        "pad_token_id": pad,
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        if architecture == "qwen2":
            model: PreTrainedModel = Qwen2ForCausalLM(Qwen2Config(**settings))
        elif architecture == "llama":
            model = LlamaForCausalLM(LlamaConfig(**settings))
        else:
            raise ValueError(f"unknown architecture {architecture!r}: use 'qwen2' or 'llama'")
    finally:
        torch.random.set_rng_state(state)
    stops = [eos]
    document_end: Any = tokenizer.convert_tokens_to_ids(CHAT_SPECIAL_TOKENS[0])  # pyright: ignore[reportUnknownMemberType]
    if isinstance(document_end, int) and document_end != eos and document_end != tokenizer.unk_token_id:
        stops.append(document_end)
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=pad)
    model.eval()
    return model
