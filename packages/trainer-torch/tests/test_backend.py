"""The local backend over real HTTP, with the real openai client, in vLLM's token-id wire format."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from agentlightning_torch import (
    BackendServer,
    HFChatTemplate,
    LocalBackend,
    SamplingParams,
    serve_backend,
)

USER = [{"role": "user", "content": "Q:2*3+4="}]
CALCULATOR_TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
TOKEN_IDS = {"return_token_ids": True}


@pytest.fixture
def server(calc_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> Iterator[BackendServer]:
    backend = LocalBackend(calc_model, tokenizer, batch_wait_ms=2.0, model_name="tiny-calc")
    running = serve_backend(backend)
    yield running
    running.stop()


@pytest.fixture
def client(server: BackendServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def extra(obj: Any, name: str) -> Any:
    """A field the OpenAI types do not declare (they keep unknown fields)."""
    return (obj.model_extra or {})[name]


def test_chat_returns_prompt_and_response_token_ids(
    client: openai.OpenAI, template: HFChatTemplate, tokenizer: PreTrainedTokenizerFast
) -> None:
    response = client.chat.completions.create(
        model="tiny-calc",
        messages=USER,
        temperature=0.0,
        max_tokens=20,
        logprobs=True,
        extra_body=TOKEN_IDS,  # type: ignore[arg-type]
    )
    assert extra(response, "prompt_token_ids") == template.render(USER)
    choice = response.choices[0]
    token_ids = extra(choice, "token_ids")
    assert token_ids == [*tokenizer.encode("CALC(2*3+4)"), tokenizer.eos_token_id]
    assert choice.finish_reason == "stop"
    assert choice.message.content == "CALC(2*3+4)"  # no tools declared: plain text
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert [e.token for e in entries] == tokenizer.convert_ids_to_tokens(token_ids)
    assert all(e.logprob <= 0 and e.bytes is None and e.top_logprobs == [] for e in entries)
    assert response.usage is not None and response.usage.completion_tokens == len(token_ids)


def test_tool_round_trip_prefix_extends(client: openai.OpenAI, tokenizer: PreTrainedTokenizerFast) -> None:
    first = client.chat.completions.create(
        model="tiny-calc",
        messages=USER,
        tools=[CALCULATOR_TOOL],
        temperature=0.0,
        extra_body=TOKEN_IDS,  # type: ignore[arg-type, list-item]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "2*3+4"}
    messages = [
        *USER,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "10"},
    ]
    second = client.chat.completions.create(
        model="tiny-calc",
        messages=messages,
        tools=[CALCULATOR_TOOL],
        temperature=0.0,
        extra_body=TOKEN_IDS,  # type: ignore[arg-type, list-item]
    )
    expected = extra(first, "prompt_token_ids") + extra(choice, "token_ids") + tokenizer.encode("R:10\n")
    assert extra(second, "prompt_token_ids") == expected
    assert second.choices[0].message.content == "A:10"
    assert second.choices[0].finish_reason == "stop"


def test_stream_carries_token_ids_and_matches_non_streamed(client: openai.OpenAI, template: HFChatTemplate) -> None:
    kwargs: dict[str, Any] = {"model": "tiny-calc", "messages": USER, "temperature": 1.0, "seed": 123, "max_tokens": 12}
    plain = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=2, extra_body=TOKEN_IDS)
    stream = client.chat.completions.create(
        **kwargs,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=TOKEN_IDS,
    )
    chunks = list(stream)
    assert extra(chunks[0], "prompt_token_ids") == template.render(USER)
    token_ids: list[int] = []
    logprobs: list[float] = []
    tokens: list[tuple[str, list[str]]] = []
    text = ""
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            token_ids += (choice.model_extra or {}).get("token_ids", [])
            if choice.logprobs and choice.logprobs.content:
                logprobs += [e.logprob for e in choice.logprobs.content]
                tokens += [(e.token, [t.token for t in e.top_logprobs]) for e in choice.logprobs.content]
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert token_ids == extra(plain.choices[0], "token_ids")
    assert plain.choices[0].logprobs and plain.choices[0].logprobs.content
    assert logprobs == pytest.approx([e.logprob for e in plain.choices[0].logprobs.content], abs=1e-4)
    assert tokens == [(e.token, [t.token for t in e.top_logprobs]) for e in plain.choices[0].logprobs.content]
    assert all(len(top) == 2 for _, top in tokens)
    assert text == (plain.choices[0].message.content or "")
    assert finish == plain.choices[0].finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(token_ids)


def test_streamed_tool_call(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-calc",
        messages=USER,
        tools=[CALCULATOR_TOOL],
        temperature=0.0,
        stream=True,
        extra_body=TOKEN_IDS,  # type: ignore[arg-type, list-item]
    )
    calls: list[Any] = []
    content = ""
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            calls += choice.delta.tool_calls or []
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert content == "" and finish == "tool_calls"
    assert len(calls) == 1 and calls[0].function.name == "calculator"
    assert json.loads(calls[0].function.arguments) == {"expression": "2*3+4"}


async def test_concurrent_requests_are_generated_in_one_batch(server: BackendServer) -> None:
    backend = server.backend
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    backend.pause()
    before = backend.stats.batches
    calls = [
        client.chat.completions.create(model="tiny-calc", messages=USER, max_tokens=8, seed=i, extra_body=TOKEN_IDS)  # type: ignore[arg-type]
        for i in range(6)
    ]
    tasks = [asyncio.ensure_future(call) for call in calls]
    while backend.queue_depth < 6:
        await asyncio.sleep(0.01)
    backend.resume()
    responses = await asyncio.gather(*tasks)
    await client.close()
    assert backend.stats.batches == before + 1
    assert backend.stats.last_batch_size == 6 and backend.stats.max_batch_size >= 6
    assert all(extra(r.choices[0], "token_ids") for r in responses)


def test_n_choices(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="tiny-calc",
        messages=USER,
        n=3,
        max_tokens=5,
        seed=1,
        extra_body=TOKEN_IDS,  # type: ignore[arg-type]
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert all(len(extra(c, "token_ids")) >= 1 for c in response.choices)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"messages": [{"role": "user", "content": "hello"}]}, "cannot encode '<bos>hello"),
        ({"messages": USER, "stop": [""]}, "stop strings must not be empty"),
        ({"messages": USER, "max_tokens": 500}, "context"),
        ({"messages": USER, "temperature": -1}, "temperature"),
        ({"messages": []}, "messages"),
    ],
)
def test_bad_requests_get_clear_400s(server: BackendServer, body: dict[str, Any], match: str) -> None:
    reply = httpx.post(f"{server.base_url}/chat/completions", json={"model": "tiny-calc", **body})
    assert reply.status_code == 400
    message = reply.json()["error"]["message"]
    assert match in message
    assert server.backend.queue_depth == 0


def test_completions_and_models(server: BackendServer, tokenizer: PreTrainedTokenizerFast) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny-calc"]
    completion = client.completions.create(
        model="tiny-calc", prompt="<bos>Q:2*3+4=\n", temperature=0.0, max_tokens=20, logprobs=2, extra_body=TOKEN_IDS
    )
    choice = completion.choices[0]
    assert extra(choice, "prompt_token_ids") == tokenizer.encode("<bos>Q:2*3+4=\n")
    assert extra(choice, "token_ids")[:-1] == tokenizer.encode("CALC(2*3+4)")
    assert choice.text == "CALC(2*3+4)"
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert len(choice.logprobs.token_logprobs) == len(extra(choice, "token_ids"))
    assert choice.logprobs.top_logprobs and all(len(t) == 2 for t in choice.logprobs.top_logprobs)


def test_weight_swap_changes_outputs_and_version(
    server: BackendServer, make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast
) -> None:
    backend = server.backend
    prompt = HFChatTemplate(tokenizer).render(USER)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    before = backend.generate(prompt, greedy)
    assert backend.model_version == 0
    assert backend.update_weights(make_small_model(tokenizer, seed=99)) == 1
    after = backend.generate(prompt, greedy)
    assert after.token_ids != before.token_ids
    assert httpx.get(f"{server.url}/health").json()["model_version"] == 1
    with pytest.raises(RuntimeError):
        backend.load_state_dict({"not.a.weight": torch.zeros(1)})
    assert backend.model_version == 1


def test_backend_validates_input(calc_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="tokenizer is required"):
        LocalBackend(calc_model)
    backend = LocalBackend(calc_model, tokenizer)
    with pytest.raises(RuntimeError, match="not started"):
        backend.submit([2, 3], SamplingParams())
    backend.start()
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            backend.submit([2, 500], SamplingParams())
        with pytest.raises(ValueError, match="empty"):
            backend.submit([], SamplingParams())
    finally:
        backend.stop()


def test_running_drops_before_an_answer_is_delivered(
    calc_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    """Whoever holds an answer never sees its sequence counted as running (a trainer waits on ``running``)."""
    backend = LocalBackend(calc_model, tokenizer).start()
    try:
        seen: list[int] = []  # `running` read as each answer is delivered (the callback runs in the worker)
        backend.pause()  # both queue, with their callbacks, before either is admitted
        futures = [
            backend.submit([2, 3, 4], SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)) for n in (2, 12)
        ]
        for future in futures:
            future.add_done_callback(lambda _: seen.append(backend.running))
        backend.resume()
        assert [len(f.result(timeout=120).token_ids) for f in futures] == [2, 12]
        assert seen == [1, 0] and backend.running == 0
    finally:
        backend.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_each_answer_reports_the_version_of_the_weights_that_generated_it(
    server: BackendServer,
    make_small_model: Callable[..., PreTrainedModel],
    tokenizer: PreTrainedTokenizerFast,
    stream: bool,
) -> None:
    from agentlightning import MemoryStore
    from agentlightning.proxy import LLMProxy
    from agentlightning.testing import start_attempts

    backend = server.backend
    store = MemoryStore()
    attempt = (await start_attempts(store, ["ro-1"]))["ro-1"]  # the store records calls of started attempts only
    async with LLMProxy(store, [server.url], model_version=0) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.base_url("ro-1", attempt), api_key="k", max_retries=0)

        async def ask() -> list[Any]:
            if not stream:
                raw = await client.chat.completions.with_raw_response.create(
                    model="tiny-calc",
                    messages=USER,  # type: ignore[arg-type]
                    max_tokens=8,
                )
                assert raw.headers["x-agentlightning-model-version"] == str(backend.model_version)
                return [raw.parse().model_extra]
            chunks = await client.chat.completions.create(model="tiny-calc", messages=USER, max_tokens=8, stream=True)  # type: ignore[arg-type]
            # every chunk with a token says which weights generated it (the role chunk comes before any token)
            return [chunk.model_extra async for chunk in chunks if "model_version" in (chunk.model_extra or {})]

        assert {extra["model_version"] for extra in await ask()} == {0}
        # A request that arrives at version 0 but is generated after the swap reports the new weights' version.
        backend.pause()
        late = asyncio.create_task(ask())
        while backend.queue_depth == 0:
            await asyncio.sleep(0.01)
        backend.update_weights(make_small_model(tokenizer, seed=99), version=5)
        backend.resume()
        assert {extra["model_version"] for extra in await late} == {5}
        await proxy.flush()
    assert [call.model_version for call in await store.query_llm_calls("ro-1")] == [0, 5]


def test_tokenize_renders_a_chat_as_a_completion_does(server: BackendServer, template: HFChatTemplate) -> None:
    """vLLM's ``/tokenize``: the prompt ids a chat completion would render, their count; a text; bad bodies 400."""
    messages = [{"role": "user", "content": "Q:2*3+4="}]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.post("/tokenize", json={"messages": messages}).json()
        chat = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2, "return_token_ids": True})
        assert answer["tokens"] == chat.json()["prompt_token_ids"] == template.render(messages)
        assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] > 0
        text = http.post("/tokenize", json={"prompt": "Q:1"}).json()
        assert text["tokens"] == template.encode_text("Q:1")
        refused = http.post("/tokenize", json={})
        assert refused.status_code == 400 and "messages" in refused.json()["error"]["message"]
