"""Test helpers: a tiny random Qwen2 chat model with a byte-level BPE tokenizer, built offline in about a second.

`make_tiny_chat_model` is the warm-start toolkit at toy size: `train_chat_tokenizer` (byte-level BPE, ChatML special
tokens, `HERMES_CHAT_TEMPLATE`), `build_chat_model` (a random ``Qwen2ForCausalLM`` whose generation config stops on
``<|im_end|>`` and ``<|endoftext|>``) and `save_checkpoint` (a standard transformers folder, loadable with
`load_model` or plain transformers). `memorize` overfits a model on (prompt, continuation) id pairs so greedy
decoding reproduces the continuations. `make_tiny_gguf` / `write_gguf` write a small model as a GGUF file the way
llama.cpp's converter does (for ``agl model import`` without a download; needs the ``gguf`` package).

For tests against a real vLLM: `make_tool_chat_model` (a warm-started tool-calling Qwen2 whose head size vLLM's CPU
attention serves; optionally with *special* ``<tool_call>`` tokens), `VLLMServer` (vLLM's OpenAI server for a
folder, as a subprocess, waited for on ``/health``), `find_vllm_python` (vLLM's own venv; `VLLMNotInstalledError`
says how to install it) and `VLLM_TOOL_ARGS` (the tool-calling flags the tests serve with).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedModel

from agentlightning import TrainingSample
from agentlightning_torch.models._chat_model import (
    CHAT_SPECIAL_TOKENS,
    build_chat_model,
    train_chat_tokenizer,
)
from agentlightning_torch.models._checkpoint import save_checkpoint
from agentlightning_torch.models._gguf_write import make_tiny_gguf, write_gguf
from agentlightning_torch.models._sft import (
    SFTConfig,
    SFTExample,
    fit_examples,
)
from agentlightning_torch.models._tool_model import (
    TOOL_MODEL_ANSWER,
    TOOL_MODEL_CALL,
    add_tool_schema,
    make_tool_chat_model,
)
from agentlightning_torch.vllm._server import (
    VLLM_INSTALL_HINT,
    VLLM_VENV_ENV,
    VLLMNotInstalledError,
    VLLMServer,
    VLLMStartError,
    find_vllm_python,
)

__all__ = [
    "CHAT_SPECIAL_TOKENS",
    "TOOL_MODEL_ANSWER",
    "TOOL_MODEL_CALL",
    "VLLM_INSTALL_HINT",
    "VLLM_TOOL_ARGS",
    "VLLM_VENV_ENV",
    "VLLMNotInstalledError",
    "VLLMServer",
    "VLLMStartError",
    "add_tool_schema",
    "find_vllm_python",
    "make_tiny_chat_model",
    "make_tiny_gguf",
    "make_tool_chat_model",
    "memorize",
    "policy_sample",
    "write_gguf",
]

VLLM_TOOL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
"""vLLM flags for hermes tool calls (what Qwen2.5-style models are served with)."""


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
    tokenizer = train_chat_tokenizer(corpus, vocab_size=vocab_size)
    model = build_chat_model(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        max_positions=max_positions,
        seed=seed,
    )
    path = save_checkpoint(model, tokenizer, directory)
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

    All pairs form every step's batch (constant learning rate, no clipping). The model is left in eval mode.
    """
    batch = [SFTExample((*p, *c), (0,) * len(p) + (1,) * len(c)) for p, c in sequences]
    config = SFTConfig(
        steps=steps, lr=lr, schedule="constant", betas=(0.9, 0.999), weight_decay=0.01, max_grad_norm=None, log_every=0
    )
    return fit_examples(model, [batch] * steps, config).final_loss


def policy_sample(policy: str | None, advantage: float, index: int = 0) -> TrainingSample:
    """A toy `TrainingSample` of ``policy``: a 4-token prompt (varied by ``index``), 3 trained response tokens, its
    credit and advantage both ``advantage`` (multi-policy updates at toy size)."""
    return TrainingSample(
        prompt_token_ids=[3, 4, 5, 6 + index % 3],
        response_token_ids=[7, 8, 9],
        response_mask=[1, 1, 1],
        credit=advantage,
        advantage=advantage,
        group_id="g",
        rollout_id=f"r{index}",
        attempt_id="a",
        step_index=0,
        policy=policy,
    )
