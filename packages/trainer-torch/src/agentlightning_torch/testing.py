"""Test helpers: a tiny random Qwen2 chat model with a byte-level BPE tokenizer, built offline in about a second.

`make_tiny_chat_model` trains a byte-level BPE tokenizer on a small corpus with the `tokenizers` library, gives it
the ChatML special tokens and `HERMES_CHAT_TEMPLATE`, builds a randomly initialised `Qwen2ForCausalLM` of the
requested size and saves both (plus a ``generation_config.json`` whose eos ids are ``<|im_end|>`` and
``<|endoftext|>``) as a standard transformers folder, loadable with `load_model` or plain transformers.
`memorize` overfits a model on (prompt, continuation) pairs so greedy decoding reproduces the continuations.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from agentlightning_torch._chat_templates import HERMES_CHAT_TEMPLATE

__all__ = ["CHAT_SPECIAL_TOKENS", "make_tiny_chat_model", "memorize"]

CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens of the tiny chat tokenizer: pad, turn start, turn end (the chat eos)."""

_TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

_DEFAULT_CORPUS = (
    "You may call one or more functions. Their signatures are inside <tools></tools>:",
    'To call a function, write one JSON object per call inside <tool_call></tool_call> tags: {"name": '
    '"add", "arguments": {"a": 2, "b": 3}}',
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": '
    '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": '
    '["a", "b"]}}}',
    "The answer is 5. What is 2 plus 3? Hello, how are you today? system user assistant tool",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;!?'\"()[]{}<>/\\|-_+=*&^%$#@~`",
)


def _train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHAT_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(corpus), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[CHAT_SPECIAL_TOKENS[1]],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(_TOOL_TOKENS))  # ordinary added tokens, as in Qwen2.5: kept when decoding
    tokenizer.chat_template = HERMES_CHAT_TEMPLATE
    return tokenizer


def make_tiny_chat_model(
    directory: str | Path,
    *,
    seed: int = 0,
    corpus: Sequence[str] = (),
    vocab_size: int = 400,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    max_positions: int = 1024,
) -> Path:
    """Build and save a tiny random Qwen2 chat model with a byte-level BPE tokenizer; returns the folder.

    Args:
        directory: Where the model folder is written (created if needed).
        seed: Seeds the weights (the same arguments give the same folder).
        corpus: Extra text the tokenizer is trained on (merges for the words a test uses).
        vocab_size: BPE vocabulary size target (the 256 byte tokens are always there).
        hidden_size: Model width.
        num_layers: Decoder layers.
        num_heads: Attention heads (``hidden_size`` must be divisible by it).
        max_positions: Context length.
    """
    path = Path(directory)
    tokenizer = _train_tokenizer([*_DEFAULT_CORPUS, *corpus], vocab_size)
    eos = int(tokenizer.convert_tokens_to_ids(CHAT_SPECIAL_TOKENS[2]))  # pyright: ignore[reportArgumentType]
    pad = int(tokenizer.convert_tokens_to_ids(CHAT_SPECIAL_TOKENS[0]))  # pyright: ignore[reportArgumentType]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=None,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "agentlightning.json").write_text(json.dumps({"built_by": "make_tiny_chat_model", "seed": seed}) + "\n")
    return path


def memorize(
    model: PreTrainedModel,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    steps: int = 200,
    lr: float = 1e-2,
) -> float:
    """Overfit ``model`` on (prompt, continuation) pairs (loss on the continuations only); returns the last loss.

    The model is left in eval mode.
    """
    width = max(len(p) + len(c) for p, c in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    labels = torch.full((len(sequences), width), -100, dtype=torch.long)
    for row, (prompt, continuation) in enumerate(sequences):
        full = [*prompt, *continuation]
        ids[row, : len(full)] = torch.tensor(full)
        labels[row, len(prompt) : len(full)] = torch.tensor(list(continuation))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.zeros(())
    for _ in range(steps):
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()  # pyright: ignore[reportUnknownMemberType]
        optimizer.step()
    model.eval()
    return float(loss.detach())
