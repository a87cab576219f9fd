"""The ``anthropic`` SDK through the LLM proxy's ``/v1/messages`` in front of a real vLLM (the session's `vllm_server`).

The proxy translates each Messages call to a chat completion for vLLM: what it records is exactly what vLLM rendered
and generated (the model's own template, vLLM's hermes tool parser), and the agent gets the tool call and the answer
as Anthropic's blocks, whole and streamed; ``count_tokens`` is vLLM's ``/tokenize`` of the same prompt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic import AsyncAnthropic
from transformers import AutoTokenizer

from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import start_attempts
from agentlightning_torch import HFChatTemplate
from agentlightning_torch.testing import TOOL_MODEL_ANSWER, TOOL_MODEL_CALL, VLLMServer, add_tool_schema

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

QUESTION = "What is 2 plus 3?"
CHAT_TOOL = add_tool_schema(0)
TOOL: dict[str, Any] = {
    "name": "add",
    "description": CHAT_TOOL["function"]["description"],
    "input_schema": CHAT_TOOL["function"]["parameters"],
}
GREEDY = {"temperature": 0}


@pytest.fixture
async def proxy(vllm_server: VLLMServer) -> AsyncIterator[tuple[LLMProxy, MemoryStore, str]]:
    store = MemoryStore()
    aid = (await start_attempts(store, ["ro-1"]))["ro-1"]
    async with LLMProxy(store, [vllm_server.base_url]) as running:
        yield running, store, aid


async def _direct_chat(server: VLLMServer, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "tiny", "messages": messages, "tools": [CHAT_TOOL], "temperature": 0, "max_tokens": 64,
            "return_token_ids": True}  # fmt: skip
    async with httpx.AsyncClient(timeout=300) as client:
        resp = await client.post(f"{server.base_url}/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_messages_tool_round_trip_through_vllm(
    proxy: tuple[LLMProxy, MemoryStore, str], vllm_server: VLLMServer, tool_model_dir: Path, stream: bool
) -> None:
    running, store, aid = proxy
    template = HFChatTemplate(AutoTokenizer.from_pretrained(tool_model_dir), tool_parser="hermes")
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    args: dict[str, Any] = {"model": "tiny", "max_tokens": 64, "tools": [TOOL], "extra_body": GREEDY}
    async with AsyncAnthropic(base_url=running.base_url("ro-1", aid).removesuffix("/v1"), api_key="k") as client:
        counted = await client.messages.count_tokens(model="tiny", tools=[TOOL], messages=messages)  # type: ignore[list-item]
        replies = []
        for _ in range(2):
            if stream:
                async with client.messages.stream(messages=messages, **args) as events:
                    reply = await events.get_final_message()
            else:
                reply = await client.messages.create(messages=messages, **args)
            replies.append(reply)
            if reply.stop_reason != "tool_use":
                break
            (use,) = [b for b in reply.content if b.type == "tool_use"]
            assert (use.name, use.input) == (TOOL_MODEL_CALL["name"], TOOL_MODEL_CALL["arguments"])
            messages += [
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]},
            ]
    assert [r.stop_reason for r in replies] == ["tool_use", "end_turn"]
    assert replies[1].content[0].text == TOOL_MODEL_ANSWER  # type: ignore[union-attr]
    await running.flush()
    calls = sorted(await store.query_llm_calls("ro-1", aid), key=lambda c: c.start_time)
    assert len(calls) == 2
    first_prompt = template.render([{"role": "user", "content": QUESTION}], tools=[CHAT_TOOL])
    assert calls[0].prompt_token_ids == first_prompt and counted.input_tokens == len(first_prompt)
    for call in calls:  # what vLLM renders and generates for the recorded chat request, greedily
        reference = await _direct_chat(vllm_server, call.request["messages"])
        assert call.prompt_token_ids == reference["prompt_token_ids"]
        assert call.response_token_ids == reference["choices"][0]["token_ids"]
        assert call.response_logprobs is not None and len(call.response_logprobs) == len(call.response_token_ids)
