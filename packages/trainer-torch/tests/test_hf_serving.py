"""A Hugging Face chat model (tiny Qwen2 + byte-level BPE, built here) behind the local backend over real HTTP."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from agentlightning_torch import (
    BackendServer,
    HFChatTemplate,
    LoadedModel,
    LocalBackend,
    MissingChatTemplateError,
    load_model,
    serve_backend,
)
from agentlightning_torch.testing import memorize

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
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 plus 3?"}]
THINK = [{"role": "user", "content": "Think: what is 2 plus 3?"}]
TOKEN_IDS = {"return_token_ids": True}


def extra(obj: Any, name: str) -> Any:
    return (obj.model_extra or {})[name]


def test_load_model_reads_the_folder(chat_model_dir: Path) -> None:
    loaded = load_model(chat_model_dir)
    tokenizer = loaded.tokenizer
    assert type(loaded.model).__name__ == "Qwen2ForCausalLM" and not loaded.model.training
    assert loaded.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id}
    assert set(loaded.generation_config.eos_token_id) == loaded.eos_token_ids
    rendered = HFChatTemplate(tokenizer).render(ASK, tools=[ADD])
    expected = tokenizer.apply_chat_template(ASK, tools=[ADD], add_generation_prompt=True, return_dict=False)
    assert rendered == list(expected)


def test_load_model_refuses_a_folder_without_chat_template(chat_model_dir: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(chat_model_dir, bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(MissingChatTemplateError, match="has no chat template: add a Jinja template as chat_template"):
        load_model(bare)
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_model(tmp_path / "missing")


def test_a_conversation_asked_again_renders_as_a_fresh_one(chat_model_dir: Path) -> None:
    tokenizer = load_model(chat_model_dir).tokenizer
    template = HFChatTemplate(tokenizer)

    def fresh(messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        rendered: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **kwargs)
        return list(rendered)

    first = template.render(ASK, tools=[ADD])
    again = template.render(ASK, tools=[ADD])  # kept: not rendered again
    assert first == again == fresh(ASK, tools=[ADD]) and again is not first
    again.append(0)  # the caller's own list: what is kept does not change
    assert template.render(ASK, tools=[ADD]) == first
    assert template.render(ASK) == fresh(ASK) != first  # other arguments, another prompt
    thinking = {"enable_thinking": False}
    assert template.render(THINK, template_kwargs=thinking) == fresh(THINK, **thinking)
    tokenizer.chat_template = "{{ messages[0]['content'] }}"  # a template changed afterwards is followed
    assert template.render(ASK, tools=[ADD]) == tokenizer.encode(ASK[0]["content"], add_special_tokens=False)


def test_tool_round_renders_prefix_extending(chat_model_dir: Path) -> None:
    template = HFChatTemplate(load_model(chat_model_dir).tokenizer)
    first = template.render(ASK, tools=[ADD])
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    second = template.render([*history, {"role": "tool", "tool_call_id": "c1", "content": "5"}], tools=[ADD])
    response = template.render(history, tools=[ADD], add_generation_prompt=False)[len(first) :]
    assert second[: len(first)] == first
    assert template.decode(response).startswith('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}')
    with pytest.raises(ValueError, match=r"messages\[2\] \(assistant\): tool call arguments are not JSON"):
        bad = {**call, "function": {"name": "add", "arguments": "{oops"}}
        template.render([*ASK, {"role": "assistant", "tool_calls": [bad]}])


def test_prompts_encode_as_the_tokenizer_call_does_even_after_another_caller_changed_its_settings(
    chat_model_dir: Path,
) -> None:
    tokenizer = load_model(chat_model_dir).tokenizer
    template = HFChatTemplate(tokenizer)
    texts = [template.render_text(ASK, tools=[ADD]), template.render_text(THINK), "héllo <|im_end|> wörld " * 30]
    for text in texts:  # the first call checks the Rust tokenizer against __call__, later ones use it
        assert (
            template.encode_text(text, add_special_tokens=False)
            == tokenizer(text, add_special_tokens=False)["input_ids"]
        )
    # someone else's call leaves truncation on the shared Rust tokenizer: prompts must not be cut by it
    tokenizer.backend_tokenizer.enable_truncation(max_length=8)
    try:
        long_ids = template.encode_text(texts[2], add_special_tokens=False)
    finally:
        tokenizer.backend_tokenizer.no_truncation()
    assert long_ids == tokenizer(texts[2], add_special_tokens=False)["input_ids"] and len(long_ids) > 8
    assert template.token_texts(long_ids[:5]) == [tokenizer.decode([i]) for i in long_ids[:5]]


def _turns(template: HFChatTemplate) -> dict[str, tuple[list[int], list[int]]]:
    """The (prompt, response) pairs the served model is taught: a tool call, the answer after it, a reasoned answer."""
    tokenizer = template.tokenizer
    end = [int(tokenizer.convert_tokens_to_ids("<|im_end|>"))]

    def encode(text: str) -> list[int]:
        return template.encode_text(text, add_special_tokens=False)

    call = encode('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>') + end
    first = template.render(ASK, tools=[ADD])
    message = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": "{}"}}]}
    message["tool_calls"][0]["function"]["arguments"] = '{"a": 2, "b": 3}'
    after = [*ASK, message, {"role": "tool", "content": "5"}]
    return {
        "call": (first, call),
        "answer": (template.render(after, tools=[ADD]), encode("The answer is 5.") + end),
        "think": (template.render(THINK), encode("<think>\n2 plus 3\n</think>\nThe answer is 5.") + end),
    }


@pytest.fixture(scope="module")
def taught(chat_model_dir: Path) -> tuple[LoadedModel, dict[str, tuple[list[int], list[int]]]]:
    loaded = load_model(chat_model_dir)
    turns = _turns(HFChatTemplate(loaded.tokenizer))
    memorize(loaded.model, list(turns.values()), steps=120)
    return loaded, turns


@pytest.fixture(scope="module")
def server(taught: tuple[LoadedModel, Any]) -> Iterator[BackendServer]:
    running = serve_backend(LocalBackend(taught[0], batch_wait_ms=1.0, reasoning=True, model_name="tiny-qwen"))
    yield running
    running.stop()


@pytest.fixture
def client(server: BackendServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def test_tool_call_comes_back_as_openai_tool_call(client: openai.OpenAI, taught: tuple[LoadedModel, Any]) -> None:
    loaded, turns = taught
    response = client.chat.completions.create(
        model="tiny-qwen",
        messages=ASK,
        tools=[ADD],
        temperature=0.0,
        logprobs=True,
        extra_body=TOKEN_IDS,  # type: ignore[arg-type, list-item]
    )
    prompt = extra(response, "prompt_token_ids")
    expected_prompt = loaded.tokenizer.apply_chat_template(
        ASK, tools=[ADD], add_generation_prompt=True, return_dict=False
    )
    assert prompt == list(expected_prompt) == turns["call"][0]
    choice = response.choices[0]
    token_ids = extra(choice, "token_ids")
    reference = loaded.model.generate(  # plain transformers greedy decoding of the same prompt
        torch.tensor([prompt]), max_new_tokens=64, do_sample=False, eos_token_id=sorted(loaded.eos_token_ids)
    )
    assert token_ids == reference[0, len(prompt) :].tolist() == turns["call"][1]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert choice.logprobs and choice.logprobs.content and len(choice.logprobs.content) == len(token_ids)
    assert extra(response, "model_version") == 0
    history = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = client.chat.completions.create(
        model="tiny-qwen",
        messages=history,
        tools=[ADD],
        temperature=0.0,
        extra_body=TOKEN_IDS,  # type: ignore[arg-type, list-item]
    )
    assert extra(second, "prompt_token_ids")[: len(prompt) + len(token_ids)] == prompt + token_ids
    assert second.choices[0].message.content == "The answer is 5."
    assert second.choices[0].finish_reason == "stop"


def test_streamed_tool_call(client: openai.OpenAI, taught: tuple[LoadedModel, Any]) -> None:
    stream = client.chat.completions.create(
        model="tiny-qwen",
        messages=ASK,
        tools=[ADD],
        temperature=0.0,
        stream=True,
        extra_body=TOKEN_IDS,  # type: ignore[arg-type, list-item]
    )
    calls: list[Any] = []
    content, token_ids, finish = "", [], None
    for chunk in stream:
        for choice in chunk.choices:
            calls += choice.delta.tool_calls or []
            content += choice.delta.content or ""
            token_ids += (choice.model_extra or {}).get("token_ids", [])
            finish = choice.finish_reason or finish
    assert content == "" and finish == "tool_calls" and token_ids == taught[1]["call"][1]
    assert len(calls) == 1 and calls[0].function.name == "add"
    assert json.loads(calls[0].function.arguments) == {"a": 2, "b": 3}


def test_reasoning_content_and_stop_strings(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="tiny-qwen", messages=THINK, temperature=0.0)
    message = reply.choices[0].message
    assert (message.model_extra or {})["reasoning_content"] == "2 plus 3"
    assert message.content == "The answer is 5."
    stopped = client.chat.completions.create(
        model="tiny-qwen",
        messages=THINK,
        temperature=0.0,
        stop=[" is"],
        extra_body=TOKEN_IDS,  # type: ignore[arg-type]
    )
    choice = stopped.choices[0]
    assert choice.finish_reason == "stop" and extra(choice, "stop_reason") == " is"
    assert choice.message.content == "The answer"
    streamed = client.chat.completions.create(
        model="tiny-qwen", messages=THINK, temperature=0.0, stop=[" is"], stream=True
    )
    text = "".join(c.delta.content or "" for chunk in streamed for c in chunk.choices)
    assert text == "The answer"


def test_overlong_prompt_gets_a_400_with_the_numbers(server: BackendServer) -> None:
    long = [{"role": "user", "content": "What is 2 plus 3? " * 200}]
    reply = httpx.post(f"{server.base_url}/chat/completions", json={"model": "tiny-qwen", "messages": long})
    assert reply.status_code == 400
    message = reply.json()["error"]["message"]
    prompt_tokens = len(server.backend.template.render(long))
    assert f"the prompt has {prompt_tokens} tokens" in message and "context of 1024 tokens" in message
    fits = httpx.post(
        f"{server.base_url}/chat/completions", json={"model": "tiny-qwen", "messages": ASK, "max_tokens": 5000}
    )
    assert fits.status_code == 400 and "max_tokens=5000" in fits.json()["error"]["message"]
    assert server.backend.queue_depth == 0
