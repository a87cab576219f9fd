"""Fixtures for the torch trainer tests: small models that train and run in about a second on one thread.

The calculator-style fixtures are an ordinary Hugging Face tokenizer (one token per character, a Jinja chat
template rendering tool calls as ``CALC(<expression>)``, parsed back by the registered ``calc`` tool parser) and a
small random Llama: the same general path any chat model takes, at a size that memorises in a second.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from agentlightning_torch import HFChatTemplate, build_chat_model
from agentlightning_torch.testing import make_tiny_chat_model, memorize

torch.set_num_threads(1)

ALPHABET = "0123456789+-*()=:\nQACLRE"
SPECIALS = ("<pad>", "<eos>", "<bos>")
CALC_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- if m.content or not m.tool_calls -%}{{- (m.content or '') + eos_token -}}{%- endif -%}"
    "{%- for call in m.tool_calls or [] -%}{{- 'CALC(' + call.function.arguments.expression + ')' + eos_token -}}"
    "{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}{{- 'R:' + m.content + '\\n' -}}"
    "{%- else -%}{{- m.content + '\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of the calculator alphabet; ids 0, 1, 2 are pad, eos and bos."""
    vocab = {token: index for index, token in enumerate([*SPECIALS, *ALPHABET])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # pyright: ignore[reportAttributeAccessIssue]
    backend.decoder = decoders.Fuse()  # pyright: ignore[reportAttributeAccessIssue]
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIALS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", model_max_length=128
    )
    tokenizer.chat_template = CALC_TEMPLATE
    return tokenizer


def small_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> PreTrainedModel:
    """A 2-layer, 32-wide Llama sized for ``tokenizer`` (fast enough for unit tests)."""
    return build_chat_model(
        tokenizer,
        architecture="llama",
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_positions=128,
        seed=seed,
    )


@pytest.fixture(scope="session")
def make_small_model() -> Callable[..., PreTrainedModel]:
    """The `small_model` factory, for tests that need fresh small models."""
    return small_model


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return char_tokenizer()


@pytest.fixture(scope="session")
def template(tokenizer: PreTrainedTokenizerFast) -> HFChatTemplate:
    return HFChatTemplate(tokenizer)


def encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """Ids of plain text (no special tokens)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="session")
def calc_model(tokenizer: PreTrainedTokenizerFast, template: HFChatTemplate) -> PreTrainedModel:
    """A small model that answers ``Q:2*3+4=`` with ``CALC(2*3+4)`` and then, after ``R:10``, with ``A:10``."""
    model = small_model(tokenizer, seed=1)
    user = [{"role": "user", "content": "Q:2*3+4="}]
    first_prompt = template.render(user)
    eos = tokenizer.eos_token_id
    assert isinstance(eos, int)
    call = [*encode(tokenizer, "CALC(2*3+4)"), eos]
    second_prompt = first_prompt + call + encode(tokenizer, "R:10\n")
    answer = [*encode(tokenizer, "A:10"), eos]
    memorize(model, [(first_prompt, call), (second_prompt, answer)], steps=150, lr=1e-2)
    return model


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 chat model with a byte-level BPE tokenizer and the hermes chat template."""
    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"), seed=0)
