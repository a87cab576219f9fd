"""A calculator-style chat template through the general path, and batched sampling on a small model."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from agentlightning_torch import HFChatTemplate, SamplingParams, generate_batch

SmallModel = Callable[..., PreTrainedModel]
Tokenizer = PreTrainedTokenizerFast
CALCULATOR_TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_template_prefix_extends_across_a_tool_round(template: HFChatTemplate, tokenizer: Tokenizer) -> None:
    user = [{"role": "user", "content": "Q:37*48+12="}]
    prompt = template.render(user, tools=[CALCULATOR_TOOL])
    assert tokenizer.decode(prompt, skip_special_tokens=False) == "<bos>Q:37*48+12=\n"
    eos = tokenizer.eos_token_id
    assert isinstance(eos, int)
    response = [*_ids(tokenizer, "CALC(37*48+12)"), eos]
    parsed = template.parse_response(response, tools=[CALCULATOR_TOOL])
    assert parsed.content is None
    assistant = {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}
    tool = {"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"], "content": "1788"}
    second = template.render([*user, assistant, tool], tools=[CALCULATOR_TOOL])
    assert second == prompt + response + _ids(tokenizer, "R:1788\n")
    answer = [*_ids(tokenizer, "A:1788"), eos]
    done = [*user, assistant, tool, {"role": "assistant", "content": "A:1788"}]
    final = template.render(done, add_generation_prompt=False)
    assert final == second + answer


def test_calc_tool_parser_through_the_template(template: HFChatTemplate, tokenizer: Tokenizer) -> None:
    eos = tokenizer.eos_token_id
    assert isinstance(eos, int)
    call_ids = [*_ids(tokenizer, "CALC(2*3+4)"), eos]
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
        ids = [*_ids(tokenizer, text), eos]
        assert template.parse_response(ids, tools=[CALCULATOR_TOOL]).content == text


def test_batched_generation_matches_single_rows(tokenizer: Tokenizer, make_small_model: SmallModel) -> None:
    model = make_small_model(tokenizer)
    prompts = [tokenizer.encode("<bos>Q:37*48+12=\n"), tokenizer.encode("<bos>Q:2*3=\n")]
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


def test_generation_rejects_prompts_that_do_not_fit(tokenizer: Tokenizer, make_small_model: SmallModel) -> None:
    model = make_small_model(tokenizer)
    common = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    with pytest.raises(ValueError, match="context"):
        generate_batch(model, [[2] * 120], [SamplingParams(max_tokens=20)], **common)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
