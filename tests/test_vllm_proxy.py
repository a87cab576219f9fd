"""The LLM proxy in front of a real vLLM (the session's `vllm_server`): what it records is exactly what vLLM sent.

Each request goes through the proxy (recorded in a `MemoryStore`) and, for reference, straight to vLLM with
``return_token_ids`` and logprobs; greedy decoding makes the two answers the same generation. Checked: the recorded
prompt ids equal the model's own chat template (`HFChatTemplate`, as `LocalBackend` renders), the recorded response
ids equal vLLM's, there is one logprob per response token, and the agent gets vLLM's answer (tool calls parsed by
vLLM's ``hermes`` parser, stops, ``max_tokens``, streaming, ``n > 1``); vLLM's errors reach the agent unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from agentlightning import LLMCall
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning_torch import HFChatTemplate
from agentlightning_torch.testing import TOOL_MODEL_ANSWER, TOOL_MODEL_CALL, VLLMServer, add_tool_schema

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]
TOOLS = [add_tool_schema(0)]


@pytest.fixture(scope="module")
def template(tool_model_dir: Path) -> HFChatTemplate:
    return HFChatTemplate(AutoTokenizer.from_pretrained(tool_model_dir), tool_parser="hermes")


@pytest.fixture
async def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def proxy(store: MemoryStore, vllm_server: VLLMServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(store, [vllm_server.base_url]) as running:
        yield running


async def agent_url(store: MemoryStore, proxy: LLMProxy) -> tuple[str, str, str]:
    """A fresh rollout's proxy base URL, with its rollout and attempt ids."""
    await store.enqueue_rollout(input="task")
    claim = await store.dequeue_rollout("test")
    assert claim is not None
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    return proxy.base_url(rid, aid), rid, aid


async def only_call(store: MemoryStore, proxy: LLMProxy, rid: str, aid: str) -> LLMCall:
    await proxy.flush()
    (call,) = await store.query_llm_calls(rid, aid)
    return call


async def direct(server: VLLMServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own answer with its token ids and logprobs (the reference the proxy's record must equal)."""
    extra = {"return_token_ids": True, "logprobs": True if path == "chat/completions" else 1}
    async with httpx.AsyncClient(timeout=300) as client:
        resp = await client.post(f"{server.base_url}/{path}", json={**body, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def direct_logprobs(choice: dict[str, Any]) -> list[float]:
    block = choice["logprobs"]
    if "content" in block:
        return [entry["logprob"] for entry in block["content"]]
    return list(block["token_logprobs"])


def assert_same_generation(call: LLMCall, reference: dict[str, Any], prompt_ids: list[int]) -> None:
    """The record holds vLLM's ids (and one logprob per token, equal to vLLM's); the prompt is the template's."""
    choice = reference["choices"][0]
    vllm_prompt = reference.get("prompt_token_ids") or choice.get("prompt_token_ids")
    assert call.error is None
    assert call.prompt_token_ids == vllm_prompt == prompt_ids
    assert call.response_token_ids == choice["token_ids"] and call.response_token_ids
    assert call.response_logprobs is not None and len(call.response_logprobs) == len(call.response_token_ids)
    assert call.response_logprobs == pytest.approx(direct_logprobs(choice), abs=1e-4)


async def test_chat_tool_call_through_vllm_hermes_parser(
    store: MemoryStore, proxy: LLMProxy, vllm_server: VLLMServer, template: HFChatTemplate
) -> None:
    url, rid, aid = await agent_url(store, proxy)
    body: dict[str, Any] = {"model": "tiny", "messages": QUESTION, "tools": TOOLS, "temperature": 0, "max_tokens": 64}
    client = AsyncOpenAI(base_url=url, api_key="t")
    answer = await client.chat.completions.create(**body)
    (tool_call,) = answer.choices[0].message.tool_calls or []
    assert tool_call.function.name == TOOL_MODEL_CALL["name"]
    assert json.loads(tool_call.function.arguments) == TOOL_MODEL_CALL["arguments"]
    assert answer.choices[0].finish_reason == "tool_calls"
    call = await only_call(store, proxy, rid, aid)
    assert_same_generation(
        call, await direct(vllm_server, "chat/completions", body), template.render(QUESTION, tools=TOOLS)
    )
    # the ids are the model's call in the template's format (special markers) ending on the turn's eos
    text = template.tokenizer.decode(call.response_token_ids)
    assert text == f"<tool_call>\n{json.dumps(TOOL_MODEL_CALL)}\n</tool_call><|im_end|>"


async def test_chat_streamed_tool_call(
    store: MemoryStore, proxy: LLMProxy, vllm_server: VLLMServer, template: HFChatTemplate
) -> None:
    """Streamed: vLLM's hermes parser streams the call in pieces; the record still holds every generated id."""
    url, rid, aid = await agent_url(store, proxy)
    body: dict[str, Any] = {"model": "tiny", "messages": QUESTION, "tools": TOOLS, "temperature": 0, "max_tokens": 64}
    client = AsyncOpenAI(base_url=url, api_key="t")
    names: list[str] = []
    arguments: list[str] = []
    finish: list[str] = []
    async for chunk in await client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            for delta_call in choice.delta.tool_calls or []:
                if delta_call.function and delta_call.function.name:
                    names.append(delta_call.function.name)
                if delta_call.function and delta_call.function.arguments:
                    arguments.append(delta_call.function.arguments)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert names == [TOOL_MODEL_CALL["name"]] and json.loads("".join(arguments)) == TOOL_MODEL_CALL["arguments"]
    assert finish == ["tool_calls"]
    call = await only_call(store, proxy, rid, aid)
    assert_same_generation(
        call, await direct(vllm_server, "chat/completions", body), template.render(QUESTION, tools=TOOLS)
    )
    assert call.response is not None
    (recorded_call,) = call.response["choices"][0]["message"]["tool_calls"]
    assert json.loads(recorded_call["function"]["arguments"]) == TOOL_MODEL_CALL["arguments"]


async def test_chat_streamed_text_with_top_logprobs(
    store: MemoryStore, proxy: LLMProxy, vllm_server: VLLMServer, template: HFChatTemplate
) -> None:
    url, rid, aid = await agent_url(store, proxy)
    body: dict[str, Any] = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 32}
    client = AsyncOpenAI(base_url=url, api_key="t")
    text: list[str] = []
    entries: list[Any] = []
    stream = await client.chat.completions.create(**body, stream=True, logprobs=True, top_logprobs=2)
    async for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            entries += (choice.logprobs.content or []) if choice.logprobs else []
    assert "".join(text) == TOOL_MODEL_ANSWER
    call = await only_call(store, proxy, rid, aid)
    assert_same_generation(call, await direct(vllm_server, "chat/completions", body), template.render(QUESTION))
    # the agent asked for logprobs itself: it got them, two alternatives each, the same as recorded
    assert [e.logprob for e in entries] == call.response_logprobs
    assert all(len(e.top_logprobs) == 2 for e in entries)


async def test_stop_string_and_max_tokens(
    store: MemoryStore, proxy: LLMProxy, vllm_server: VLLMServer, template: HFChatTemplate
) -> None:
    client_body: dict[str, Any] = {"model": "tiny", "messages": QUESTION, "temperature": 0}
    for extra, content, finish in (
        ({"stop": [" is"]}, TOOL_MODEL_ANSWER.split(" is")[0], "stop"),
        ({"max_tokens": 2}, None, "length"),
    ):
        url, rid, aid = await agent_url(store, proxy)
        body = {**client_body, **extra}
        answer = await AsyncOpenAI(base_url=url, api_key="t").chat.completions.create(**body)
        assert answer.choices[0].finish_reason == finish
        if content is not None:
            assert answer.choices[0].message.content == content
        call = await only_call(store, proxy, rid, aid)
        assert_same_generation(call, await direct(vllm_server, "chat/completions", body), template.render(QUESTION))
        if finish == "length":
            assert len(call.response_token_ids) == 2
            assert TOOL_MODEL_ANSWER.startswith(answer.choices[0].message.content or "-")


async def test_completion_with_token_id_prompt(
    store: MemoryStore, proxy: LLMProxy, vllm_server: VLLMServer, template: HFChatTemplate
) -> None:
    """A token-id prompt is what vLLM generates from and what is recorded, id for id."""
    prompt = template.render(QUESTION, tools=TOOLS)
    url, rid, aid = await agent_url(store, proxy)
    body: dict[str, Any] = {"model": "tiny", "prompt": prompt, "temperature": 0, "max_tokens": 40}
    answer = await AsyncOpenAI(base_url=url, api_key="t").completions.create(**body)
    # completions decode with special tokens skipped (vLLM's default): the call's markers are not in the text
    assert answer.choices[0].text == f"\n{json.dumps(TOOL_MODEL_CALL)}\n"
    call = await only_call(store, proxy, rid, aid)
    assert_same_generation(call, await direct(vllm_server, "completions", body), prompt)


async def test_n_choices_record_choice_zero(store: MemoryStore, proxy: LLMProxy, template: HFChatTemplate) -> None:
    """``n=3`` sampled, streamed and not: the record holds choice 0's ids exactly as vLLM sent them to the agent."""
    for stream in (False, True):
        url, rid, aid = await agent_url(store, proxy)
        body: dict[str, Any] = {
            "model": "tiny", "messages": QUESTION, "n": 3, "temperature": 1.5, "seed": 7, "max_tokens": 12,
            "return_token_ids": True,
        }  # fmt: skip
        async with httpx.AsyncClient(timeout=300) as client:
            if not stream:
                resp = (await client.post(f"{url}/chat/completions", json=body)).json()
                ids = {c["index"]: c["token_ids"] for c in resp["choices"]}
                prompt = resp["prompt_token_ids"]
            else:
                ids, prompt = await streamed_ids(client, f"{url}/chat/completions", body)
        assert sorted(ids) == [0, 1, 2]
        assert len({tuple(v) for v in ids.values()}) > 1, "sampling at temperature 1.5 gave 3 equal answers"
        call = await only_call(store, proxy, rid, aid)
        assert call.prompt_token_ids == prompt == template.render(QUESTION)
        assert call.response_token_ids == ids[0], f"stream={stream}"
        assert call.response_logprobs is not None and len(call.response_logprobs) == len(ids[0])


async def streamed_ids(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[dict[int, list[int]], Any]:
    """Each choice's ids from a stream (chunks carry one choice each, by index) and the prompt ids."""
    ids: dict[int, list[int]] = {}
    prompt: Any = None
    async with client.stream("POST", url, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            prompt = prompt or chunk.get("prompt_token_ids")
            for choice in chunk.get("choices") or []:
                ids.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
    return ids, prompt


async def test_vllm_errors_reach_the_agent_unchanged(store: MemoryStore, proxy: LLMProxy) -> None:
    """A prompt longer than the context: vLLM's 400 reaches the agent as 400; the call is recorded as failed."""
    url, rid, aid = await agent_url(store, proxy)
    long_question = [{"role": "user", "content": "two plus three " * 600}]
    client = AsyncOpenAI(base_url=url, api_key="t", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="tiny", messages=long_question, max_tokens=4)  # type: ignore[arg-type]
    assert info.value.status_code == 400
    call = await only_call(store, proxy, rid, aid)
    assert call.error is not None and "400" in call.error
    assert call.response is None and not call.response_token_ids
