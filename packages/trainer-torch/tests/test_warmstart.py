"""The warm-start toolkit: a chat model made from scratch, fine-tuned on conversations, served and reloaded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from agentlightning_torch import (
    BackendServer,
    HFChatTemplate,
    LocalBackend,
    SFTConfig,
    SFTExample,
    build_chat_model,
    fit_examples,
    load_model,
    save_checkpoint,
    serve_backend,
    supervised_finetune,
    tokenize_conversation,
    train_chat_tokenizer,
)

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def _tool_episode(a: int, b: int) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    return {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"What is {a} plus {b}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": str(a + b)},
            {"role": "assistant", "content": f"The answer is {a + b}."},
        ],
        "tools": [ADD],
    }


TOOL_EPISODE = _tool_episode(2, 3)
CONVERSATIONS: list[Any] = [
    TOOL_EPISODE,
    _tool_episode(4, 4),
    [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! Ask me a sum."}],
]


def _small_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> PreTrainedModel:
    return build_chat_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, max_positions=512, seed=seed)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    texts = [json.dumps(c) for c in CONVERSATIONS]
    return train_chat_tokenizer(texts, vocab_size=400)


def test_loss_mask_covers_exactly_the_assistant_turns(tokenizer: PreTrainedTokenizerFast) -> None:
    [example] = tokenize_conversation(tokenizer, CONVERSATIONS[0])
    ids, mask = list(example.input_ids), list(example.loss_mask)
    template = HFChatTemplate(tokenizer)
    messages = TOOL_EPISODE["messages"]
    first = template.render(messages[:2], tools=[ADD])  # what the backend renders for each request
    second = template.render(messages[:4], tools=[ADD])
    call_end = mask.index(0, len(first))
    assert ids[: len(first)] == first and ids[: len(second)] == second
    assert mask[: len(first)] == [0] * len(first) and mask[call_end : len(second)] == [0] * (len(second) - call_end)
    assert all(mask[len(first) : call_end]) and all(mask[len(second) :])
    targets = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    assert targets == call + "The answer is 5.<|im_end|>"


def test_trained_loss_is_the_masked_loss(tokenizer: PreTrainedTokenizerFast) -> None:
    """The first step's loss equals cross-entropy over the masked-in tokens only (before any update)."""
    examples = tokenize_conversation(tokenizer, CONVERSATIONS[0]) + tokenize_conversation(tokenizer, CONVERSATIONS[2])
    model = _small_model(tokenizer, seed=5)
    losses = []
    for example in examples:
        ids = torch.tensor([example.input_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        token_losses = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        losses.append(token_losses[torch.tensor(example.loss_mask[1:]) == 1])
    expected = float(torch.cat(losses).mean())
    result = fit_examples(model, [examples], SFTConfig(steps=1, lr=1e-6, log_every=0))
    assert result.final_loss == pytest.approx(expected, rel=1e-5)
    assert result.target_tokens == sum(e.target_count for e in examples)
    assert SFTExample((1, 2, 3), (0, 1, 1)).target_count == 2


def test_bad_training_data_is_refused(tokenizer: PreTrainedTokenizerFast) -> None:
    model = _small_model(tokenizer)
    with pytest.raises(ValueError, match="no conversations given"):
        supervised_finetune(model, tokenizer, [], steps=1)
    with pytest.raises(ValueError, match="none of 1 conversations has an assistant turn"):
        supervised_finetune(model, tokenizer, [[{"role": "user", "content": "hi"}]], steps=1)
    with pytest.raises(ValueError, match=r"conversations\[0\]: messages\[0\] \(assistant\): .*needs messages before"):
        supervised_finetune(model, tokenizer, [[{"role": "assistant", "content": "hi"}]], steps=1)
    with pytest.raises(ValueError, match=r"conversations\[1\]: conversation: .*non-empty 'messages'"):
        supervised_finetune(model, tokenizer, [CONVERSATIONS[2], {"messages": []}], steps=1)


@pytest.fixture(scope="module")
def tuned(tokenizer: PreTrainedTokenizerFast) -> tuple[PreTrainedModel, dict[str, float]]:
    model = _small_model(tokenizer, seed=1)
    result = supervised_finetune(model, tokenizer, CONVERSATIONS, steps=150, lr=1e-2, seed=0, threads=1)
    return model, result.summary()


def test_finetuning_is_deterministic(tokenizer: PreTrainedTokenizerFast, tuned: tuple[PreTrainedModel, Any]) -> None:
    summary = tuned[1]
    assert summary["loss"] < 0.1 < summary["first_loss"] and summary["examples"] == 3
    first, second = _small_model(tokenizer, seed=2), _small_model(tokenizer, seed=2)
    for again in (first, second):
        supervised_finetune(again, tokenizer, CONVERSATIONS, steps=5, batch_size=2, lr=1e-2, seed=3, threads=1)
    for (name, mine), theirs in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs), name
    assert not torch.equal(first.lm_head.weight, _small_model(tokenizer, seed=2).lm_head.weight)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, tuned: tuple[PreTrainedModel, Any], tokenizer: Any) -> Path:
    return save_checkpoint(tuned[0], tokenizer, tmp_path_factory.mktemp("warm") / "checkpoint")


def test_saved_folder_reloads_with_identical_logits(
    saved: Path, tuned: tuple[PreTrainedModel, Any], tokenizer: PreTrainedTokenizerFast
) -> None:
    [example] = tokenize_conversation(load_model(saved).tokenizer, CONVERSATIONS[0])
    assert example == tokenize_conversation(tokenizer, CONVERSATIONS[0])[0]  # the reloaded tokenizer agrees
    ids = torch.tensor([example.input_ids])
    with torch.no_grad():
        expected = tuned[0](input_ids=ids).logits
        assert torch.equal(load_model(saved).model(input_ids=ids).logits, expected)
        assert torch.equal(AutoModelForCausalLM.from_pretrained(saved)(input_ids=ids).logits, expected)  # pyright: ignore[reportUnknownMemberType]
    assert json.loads((saved / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((saved / "generation_config.json").read_text())["eos_token_id"] == [
        load_model(saved).tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
    ]


@pytest.fixture(scope="module")
def server(saved: Path) -> Iterator[BackendServer]:
    running = serve_backend(LocalBackend(saved, batch_wait_ms=1.0, model_name="warm"))
    yield running
    running.stop()


def test_served_model_makes_the_memorised_tool_call_and_answer(server: BackendServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    messages: list[Any] = TOOL_EPISODE["messages"][:2]
    first = client.chat.completions.create(model="warm", messages=messages, tools=[ADD], temperature=0.0)  # type: ignore[arg-type, list-item]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    [call] = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}  # type: ignore[union-attr]
    history = [*messages, choice.message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    second = client.chat.completions.create(model="warm", messages=history, tools=[ADD], temperature=0.0)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "The answer is 5." and second.choices[0].finish_reason == "stop"
