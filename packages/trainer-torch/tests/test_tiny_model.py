"""Character tokenizer, its chat template, tiny model and batched sampling (the calculator task: tests/)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from agentlightning_torch import (
    CalcChatTemplate,
    CharTokenizer,
    SamplingParams,
    TemplateError,
    build_tiny_model,
    count_parameters,
    generate_batch,
    load_tiny,
    save_tiny,
)

SmallModel = Callable[..., LlamaForCausalLM]
CALCULATOR_TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}


def test_tokenizer_round_trip_and_specials(tokenizer: CharTokenizer) -> None:
    text = "Q:37*48+12=\nCALC(37*48+12)R:-1788\nA:1788"
    ids = tokenizer.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert len(ids) == len(text) + 2
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=False) == f"<bos>{text}<eos>"
    assert tokenizer.vocab_size == 27
    assert len(set(tokenizer.encode(tokenizer.alphabet))) == len(tokenizer.alphabet)


def test_tokenizer_rejects_unknown_characters(tokenizer: CharTokenizer) -> None:
    with pytest.raises(ValueError, match=r"'x' at position 3"):
        tokenizer.encode("Q:3x4")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([5, 99])
    with pytest.raises(ValueError, match="repeats"):
        CharTokenizer("0120")


def test_tokenizer_save_and_load(tmp_path: Path, tokenizer: CharTokenizer) -> None:
    path = tokenizer.save_pretrained(tmp_path)
    assert json.loads(path.read_text())["alphabet"] == tokenizer.alphabet
    assert CharTokenizer.from_pretrained(tmp_path) == tokenizer
    with pytest.raises(FileNotFoundError):
        CharTokenizer.from_pretrained(tmp_path / "missing")


def test_template_prefix_extends_across_a_tool_round(template: CalcChatTemplate, tokenizer: CharTokenizer) -> None:
    user = [{"role": "user", "content": "Q:37*48+12="}]
    prompt = template.render(user, tools=[CALCULATOR_TOOL])
    assert tokenizer.decode(prompt, skip_special_tokens=False) == "<bos>Q:37*48+12=\n"
    response = [*tokenizer.encode("CALC(37*48+12)"), tokenizer.eos_token_id]
    parsed = template.parse_response(response, tools=[CALCULATOR_TOOL])
    assert parsed.content is None
    assistant = {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}
    tool = {"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"], "content": "1788"}
    second = template.render([*user, assistant, tool], tools=[CALCULATOR_TOOL])
    assert second == prompt + response + tokenizer.encode("R:1788\n")
    answer = [*tokenizer.encode("A:1788"), tokenizer.eos_token_id]
    final = template.render([*user, assistant, tool, {"role": "assistant", "content": "A:1788"}])
    assert final == second + answer


def test_template_renders_text_parts_and_system(template: CalcChatTemplate, tokenizer: CharTokenizer) -> None:
    messages = [{"role": "system", "content": "C"}, {"role": "user", "content": [{"type": "text", "text": "Q:2*3="}]}]
    assert tokenizer.decode(template.render(messages)) == "C\nQ:2*3=\n"


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "no messages"),
        ([{"role": "user", "content": "hello"}], r"messages\[0\].*'h'"),
        ([{"role": "wizard", "content": "Q"}], "unsupported role"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "search", "arguments": "{}"}}]}],
            "only the 'calculator' tool",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "calculator", "arguments": "{bad"}}]}],
            "not JSON",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "calculator", "arguments": "{}"}}]}],
            "expression",
        ),
    ],
)
def test_template_errors_name_the_problem(
    template: CalcChatTemplate, messages: list[dict[str, object]], match: str
) -> None:
    with pytest.raises(TemplateError, match=match):
        template.render(messages)


def test_tool_parser(template: CalcChatTemplate, tokenizer: CharTokenizer) -> None:
    call_ids = [*tokenizer.encode("CALC(2*3+4)"), tokenizer.eos_token_id]
    parsed = template.parse_response(call_ids, tools=[CALCULATOR_TOOL])
    assert parsed.content is None and len(parsed.tool_calls) == 1
    call = parsed.tool_calls[0]
    assert call["type"] == "function" and call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2*3+4"}
    # no calculator declared: plain text
    assert template.parse_response(call_ids, tools=None).content == "CALC(2*3+4)"
    other = [{"type": "function", "function": {"name": "search"}}]
    assert template.parse_response(call_ids, tools=other).content == "CALC(2*3+4)"
    # answers and near misses stay text
    for text in ("A:10", "CALC(2*3", "A:1CALC(2)"):
        ids = [*tokenizer.encode(text), tokenizer.eos_token_id]
        assert template.parse_response(ids, tools=[CALCULATOR_TOOL]).content == text


def test_tiny_model_size_and_deterministic_init(tokenizer: CharTokenizer) -> None:
    model = build_tiny_model(tokenizer, seed=3)
    assert 1_000_000 < count_parameters(model) < 1_100_000
    assert model.config.tie_word_embeddings
    again = build_tiny_model(tokenizer, seed=3)
    other = build_tiny_model(tokenizer, seed=4)
    first = next(iter(model.state_dict().values()))
    assert torch.equal(first, next(iter(again.state_dict().values())))
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight, other.model.layers[0].mlp.up_proj.weight)


def test_save_and_load_tiny(tmp_path: Path, tokenizer: CharTokenizer, make_small_model: SmallModel) -> None:
    model = make_small_model(tokenizer)
    save_tiny(model, tokenizer, tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "char_tokenizer.json").is_file()
    loaded, loaded_tokenizer = load_tiny(tmp_path)
    assert loaded_tokenizer == tokenizer
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_tiny(tmp_path / "nothing")


def test_batched_generation_matches_single_rows(tokenizer: CharTokenizer, make_small_model: SmallModel) -> None:
    model = make_small_model(tokenizer)
    prompts = [tokenizer.encode("Q:37*48+12=\n", add_bos=True), tokenizer.encode("Q:2*3=\n", add_bos=True)]
    params = [SamplingParams(temperature=1.0, max_tokens=10, seed=11), SamplingParams(temperature=0.0, max_tokens=6)]
    common = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    together = generate_batch(model, prompts, params, **common)
    for row in range(2):
        alone = generate_batch(model, prompts[row : row + 1], params[row : row + 1], **common)[0]
        assert alone.token_ids == together[row].token_ids
        assert alone.logprobs == pytest.approx(together[row].logprobs, abs=1e-4)
    assert len(together[1].token_ids) <= 6
    # reported log-probs are the model's own (teacher-forced) log-probs of the sampled tokens
    row = together[0]
    full = torch.tensor([prompts[0] + row.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=full).logits[0].float(), -1)
    start = len(prompts[0]) - 1
    forced = [logprobs[start + i, t].item() for i, t in enumerate(row.token_ids)]
    assert forced == pytest.approx(row.logprobs, abs=1e-4)


def test_generation_rejects_prompts_that_do_not_fit(tokenizer: CharTokenizer, make_small_model: SmallModel) -> None:
    model = make_small_model(tokenizer)
    common = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    with pytest.raises(ValueError, match="context"):
        generate_batch(model, [[2] * 120], [SamplingParams(max_tokens=20)], **common)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
