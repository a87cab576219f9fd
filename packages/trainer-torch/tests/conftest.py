"""Fixtures for the torch trainer tests: small models that train and run in about a second on one thread."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from agentlightning_torch import CalcChatTemplate, CharTokenizer, build_tiny_model
from agentlightning_torch.testing import make_tiny_chat_model

torch.set_num_threads(1)


def small_model(tokenizer: CharTokenizer, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer, 32-wide version of the tiny model (fast enough for unit tests)."""
    return build_tiny_model(tokenizer, seed=seed, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def memorize(model: LlamaForCausalLM, sequences: list[tuple[list[int], list[int]]], steps: int = 150) -> None:
    """Overfit ``model`` on (prompt, continuation) pairs so greedy decoding reproduces the continuations."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    width = max(len(p) + len(c) for p, c in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    labels = torch.full((len(sequences), width), -100, dtype=torch.long)
    for row, (prompt, continuation) in enumerate(sequences):
        full = prompt + continuation
        ids[row, : len(full)] = torch.tensor(full)
        labels[row, len(prompt) : len(full)] = torch.tensor(continuation)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


@pytest.fixture(scope="session")
def make_small_model() -> Callable[..., LlamaForCausalLM]:
    """The `small_model` factory, for tests that need fresh small models."""
    return small_model


@pytest.fixture(scope="session")
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture(scope="session")
def template(tokenizer: CharTokenizer) -> CalcChatTemplate:
    return CalcChatTemplate(tokenizer)


@pytest.fixture(scope="session")
def calc_model(tokenizer: CharTokenizer, template: CalcChatTemplate) -> LlamaForCausalLM:
    """A small model that answers ``Q:2*3+4=`` with ``CALC(2*3+4)`` and then, after ``R:10``, with ``A:10``."""
    model = small_model(tokenizer, seed=1)
    user = [{"role": "user", "content": "Q:2*3+4="}]
    first_prompt = template.render(user)
    call = [*tokenizer.encode("CALC(2*3+4)"), tokenizer.eos_token_id]
    second_prompt = first_prompt + call + tokenizer.encode("R:10\n")
    answer = [*tokenizer.encode("A:10"), tokenizer.eos_token_id]
    memorize(model, [(first_prompt, call), (second_prompt, answer)])
    return model


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 chat model with a byte-level BPE tokenizer and the hermes chat template."""
    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"), seed=0)
