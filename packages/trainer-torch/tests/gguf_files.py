"""Write GGUF files from small transformers models, the way llama.cpp's ``convert_hf_to_gguf.py`` writes them.

Tensor names come from gguf's own HF -> GGUF name map; a Llama's q/k projections are permuted as llama.cpp permutes
them (transformers' GGUF loader undoes it); 1-D tensors (norms, biases) stay float32 as llama.cpp keeps them; the
tokenizer is written as a byte-level BPE vocabulary (``tokenizer.ggml.model = gpt2``) with merges, token types
(CONTROL for special tokens, USER_DEFINED for other added tokens), special ids and the chat template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from transformers import PreTrainedModel, PreTrainedTokenizerFast

ARCHES = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (rotary halves -> interleaved pairs) for q (kv=None) or k."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_tensors(model: PreTrainedModel, arch: str) -> dict[str, np.ndarray]:
    """The model's tensors under their GGUF names, as float32 numpy arrays (q/k permuted for a Llama)."""
    config: Any = model.config
    names = gguf.get_tensor_name_map(ARCHES[arch], config.num_hidden_layers)
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
    arch: str,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    name: str = "tiny test model",
) -> dict[str, np.ndarray]:
    """Write ``model`` + ``tokenizer`` as a GGUF file; 2-D tensors get ``qtype``, the rest stay F32.

    Returns:
        The tensors as the file holds them after dequantizing (GGUF names, permuted as stored): what a correct
        importer must reproduce exactly (before un-permuting).
    """
    config: Any = model.config
    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_license("apache-2.0")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == GGMLQuantizationType.F32 else gguf.LlamaFileType.MOSTLY_Q8_0)
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
        if qtype != GGMLQuantizationType.F32 and data.ndim == 2:
            packed = gguf.quants.quantize(data, qtype)
            writer.add_tensor(gguf_name, packed, raw_dtype=qtype)
            stored[gguf_name] = gguf.quants.dequantize(packed, qtype)
        else:
            writer.add_tensor(gguf_name, data)
            stored[gguf_name] = data
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored
