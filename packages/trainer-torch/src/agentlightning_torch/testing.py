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
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from agentlightning import TrainingSample
from agentlightning_torch.models._chat_model import (
    CHAT_SPECIAL_TOKENS,
    build_chat_model,
    train_chat_tokenizer,
)
from agentlightning_torch.models._checkpoint import save_checkpoint
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

if TYPE_CHECKING:  # gguf is an optional dependency (the `gguf` extra): imported where a file is written
    from gguf import GGUFWriter

__all__ = [
    "CHAT_SPECIAL_TOKENS",
    "SMOLLM2_CHAT_TEMPLATE",
    "TOOL_MODEL_ANSWER",
    "TOOL_MODEL_CALL",
    "VLLM_INSTALL_HINT",
    "VLLM_TOOL_ARGS",
    "VLLM_VENV_ENV",
    "VLLMNotInstalledError",
    "VLLMServer",
    "VLLMStartError",
    "add_tool_schema",
    "byte_bpe_tokenizer",
    "find_vllm_python",
    "gguf_source_model",
    "gguf_tensors",
    "llama_cpp_permute",
    "make_smollm2_stand_in",
    "make_tiny_chat_model",
    "make_tiny_gguf",
    "make_tool_chat_model",
    "memorize",
    "policy_sample",
    "tiny_qwen2",
    "training_sample",
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


SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-135M-Instruct's own chat template (from its GGUF): ChatML, a default system prompt, no tool section."""


def make_smollm2_stand_in(models: str | Path, *, corpus: Sequence[str] = ()) -> Path:
    """A tiny random chat model in ``models``' SmolLM2 folder, with SmolLM2's chat template (as `agl model import`
    writes the real one): the examples' ``--model smollm2`` at toy size. Returns the folder."""
    from transformers import AutoTokenizer

    folder = make_tiny_chat_model(Path(models) / "smollm2-135m-instruct", corpus=corpus)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


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


def tiny_qwen2(vocab_size: int = 40, *, seed: int = 0, **config: Any) -> Qwen2ForCausalLM:
    """A 2-layer, 32-wide random Qwen2 causal LM without a tokenizer (a training step in milliseconds on one thread).

    Seeds the global torch RNG with ``seed`` before building (the same arguments give the same weights); the model is
    in train mode. ``config`` overrides `Qwen2Config` fields (``max_position_embeddings`` 128 and tied embeddings by
    default).
    """
    fields: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 128,
        "tie_word_embeddings": True,
    }
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**{**fields, **config}))


TOY_PROMPT = (1, 5, 6, 7, 8, 9)
"""The prompt `training_sample` uses by default (ids below `tiny_qwen2`'s vocabulary)."""


def training_sample(
    response: list[int], advantage: float, prompt: Sequence[int] = TOY_PROMPT, **fields: object
) -> TrainingSample:
    """A toy `TrainingSample`: every response token trained, credit and advantage both ``advantage``, ids
    ``g``/``r``/``a`` at step 0; ``fields`` set any other field (``response_logprobs``, ``policy``, ...)."""
    values: dict[str, object] = {
        "prompt_token_ids": list(prompt),
        "response_token_ids": response,
        "response_mask": [1] * len(response),
        "credit": advantage,
        "advantage": advantage,
        "group_id": "g",
        "rollout_id": "r",
        "attempt_id": "a",
        "step_index": 0,
    }
    values.update(fields)
    return TrainingSample.model_validate(values)


# ------------------------------------------------------------------------------------------- GGUF files
# Written the way llama.cpp's ``convert_hf_to_gguf.py`` writes them, for tests of GGUF consumers (``agl model
# import``) without a download: tensor names come from gguf's own HF -> GGUF name map; a Llama's q/k projections are
# permuted as llama.cpp permutes them (transformers' GGUF loader undoes it); 1-D tensors (norms, biases) stay float32
# as llama.cpp keeps them; the tokenizer is a byte-level BPE vocabulary (``tokenizer.ggml.model = gpt2``) with merges,
# token types (CONTROL for special tokens, USER_DEFINED for other added tokens), special ids and the chat template.

Architecture = Literal["llama", "qwen2"]

SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's ChatML template (with a default system prompt), for `byte_bpe_tokenizer`."""

_CORPUS = (
    "Hello, how are you today? The answer is 42. What is 12 * 7? You are a tiny test model.",
    'system user assistant: call <tool_call> with {"a": 2, "b": 3} and read the result.',
)


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (rotary halves -> interleaved pairs) for q (kv=None) or k."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_tensors(model: PreTrainedModel, arch: Architecture) -> dict[str, np.ndarray]:
    """The model's tensors under their GGUF names, as float32 numpy arrays (q/k permuted for a Llama)."""
    config: Any = model.config
    import gguf

    kinds = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}
    names = gguf.get_tensor_name_map(kinds[arch], config.num_hidden_layers)
    out: dict[str, np.ndarray] = {}
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # a tied head is absent from the file (transformers ties it again)
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        assert gguf_name is not None, hf_name
        data = tensor.detach().to(torch.float32).numpy().copy()
        if arch == "llama" and suffix == "weight" and base.endswith("self_attn.q_proj"):
            data = llama_cpp_permute(data, config.num_attention_heads, config.num_attention_heads)
        elif arch == "llama" and suffix == "weight" and base.endswith("self_attn.k_proj"):
            data = llama_cpp_permute(data, config.num_attention_heads, config.num_key_value_heads)
        out[f"{gguf_name}.{suffix}"] = data
    return out


def _tokenizer_fields(writer: GGUFWriter, tokenizer: PreTrainedTokenizerFast) -> None:
    from gguf import TokenType

    vocab = tokenizer.get_vocab()
    tokens = [""] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    added = {index: token for index, token in tokenizer.added_tokens_decoder.items()}
    types = [
        TokenType.NORMAL if i not in added else (TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED)
        for i in range(len(tokens))
    ]
    merges: list[Any] = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([int(kind) for kind in types])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    for role, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("unk", writer.add_unk_token_id),
        ("pad", writer.add_pad_token_id),
    ):
        token_id = getattr(tokenizer, f"{role}_token_id")
        if token_id is not None:
            add(token_id)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(False)
    if tokenizer.chat_template:
        writer.add_chat_template(str(tokenizer.chat_template))


def write_gguf(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    path: Path,
    *,
    arch: Architecture,
    qtype: str = "F32",
    name: str = "tiny test model",
) -> dict[str, np.ndarray]:
    """Write ``model`` + ``tokenizer`` as a GGUF file; 2-D tensors get ``qtype`` (``F32``, ``Q8_0``, ``Q4_1``...,
    quantized with ``gguf.quants``), the rest stay F32.

    Returns:
        The tensors as the file holds them after dequantizing (GGUF names, permuted as stored): what a correct
        importer must reproduce exactly (before un-permuting).
    """
    import gguf
    from gguf import GGMLQuantizationType, GGUFWriter

    kind = GGMLQuantizationType[qtype]
    config: Any = model.config
    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_license("apache-2.0")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType[f"MOSTLY_{qtype}"])
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    _tokenizer_fields(writer, tokenizer)
    stored: dict[str, np.ndarray] = {}
    for gguf_name, data in gguf_tensors(model, arch).items():
        if kind != GGMLQuantizationType.F32 and data.ndim == 2:
            packed = gguf.quants.quantize(data, kind)
            writer.add_tensor(gguf_name, packed, raw_dtype=kind)
            stored[gguf_name] = gguf.quants.dequantize(packed, kind)
        else:
            writer.add_tensor(gguf_name, data)
            stored[gguf_name] = data
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def byte_bpe_tokenizer(texts: tuple[str, ...] = _CORPUS, *, vocab_size: int = 420) -> PreTrainedTokenizerFast:
    """SmolLM2's kind of tokenizer: GPT-2 byte-level BPE, ChatML specials (unk 0, bos 1, eos 2 = pad), an added tag."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # pyright: ignore[reportAttributeAccessIssue]
    backend.decoder = decoders.ByteLevel()  # pyright: ignore[reportAttributeAccessIssue]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,  # pyright: ignore[reportCallIssue]
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],  # pyright: ignore[reportCallIssue]
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # pyright: ignore[reportCallIssue]
        show_progress=False,  # pyright: ignore[reportCallIssue]
    )
    backend.train_from_iterator(list(texts) * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])  # pyright: ignore[reportUnknownMemberType]
    tokenizer.chat_template = SMOLLM_TEMPLATE
    return tokenizer


def gguf_source_model(
    arch: Architecture = "llama", *, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny random chat model of ``arch`` and its tokenizer, as `make_tiny_gguf` writes them.

    A Llama gets SmolLM2's kind of tokenizer (`byte_bpe_tokenizer`), a Qwen2 Qwen2's (`train_chat_tokenizer`): the
    pre-tokenizers transformers rebuilds for each. 64 wide, 2 layers, 4 heads sharing 2 key/value heads.
    """
    tokenizer: PreTrainedTokenizerFast = (
        byte_bpe_tokenizer() if arch == "llama" else train_chat_tokenizer(_CORPUS, vocab_size=420)
    )
    model = build_chat_model(
        tokenizer,
        architecture=arch,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        max_positions=256,
        seed=seed,
    )
    return model, tokenizer


def make_tiny_gguf(
    path: str | Path, *, arch: Architecture = "llama", qtype: str = "F32", seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Write `gguf_source_model` (``arch``, ``seed``) as a GGUF file at ``path``; returns the model and tokenizer."""
    model, tokenizer = gguf_source_model(arch, seed=seed)
    write_gguf(model, tokenizer, Path(path), arch=arch, qtype=qtype)
    return model, tokenizer
