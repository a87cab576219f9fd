"""OpenAI's Responses API through the LLM proxy to a real vLLM (the session's `vllm_server`, hermes tool calls).

The proxy serves a Responses call through vLLM's chat completions: the recorded prompt ids are the model's own chat
template rendering of the conversation (`HFChatTemplate`, as for a chat call), the response ids are vLLM's, and the
agent gets the tool call vLLM's parser found, as a ``function_call`` item, streamed or not.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from agentlightning import LLMCall
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import start_attempts
from agentlightning_torch import HFChatTemplate
from agentlightning_torch.testing import TOOL_MODEL_ANSWER, TOOL_MODEL_CALL, VLLMServer, add_tool_schema

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]
CHAT_TOOLS = [add_tool_schema(0)]
TOOLS = [{"type": "function", **CHAT_TOOLS[0]["function"]}]


@pytest.fixture(scope="module")
def template(tool_model_dir: Path) -> HFChatTemplate:
    return HFChatTemplate(AutoTokenizer.from_pretrained(tool_model_dir), tool_parser="hermes")


@pytest.fixture
async def proxy(vllm_server: VLLMServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(MemoryStore(), [vllm_server.base_url]) as running:
        yield running


async def _call(proxy: LLMProxy, rollout: str, stream: bool) -> tuple[list[str], LLMCall]:
    """One Responses call with the add tool (greedy); the agent's function call arguments and the record."""
    attempts = await start_attempts(proxy.store, [rollout])
    async with AsyncOpenAI(base_url=proxy.base_url(rollout, attempts[rollout]), api_key="t", max_retries=0) as agent:
        if stream:
            events = [e async for e in await agent.responses.create(
                model="tiny", input=QUESTION, tools=TOOLS, temperature=0, stream=True)]  # type: ignore[arg-type]  # fmt: skip
            response = events[-1].response  # type: ignore[union-attr]
        else:
            response = await agent.responses.create(model="tiny", input=QUESTION, tools=TOOLS, temperature=0)  # type: ignore[arg-type]
    await proxy.flush()
    (call,) = await proxy.store.query_llm_calls(rollout)
    assert call.response_id == response.id
    return [item.arguments for item in response.output if item.type == "function_call" and item.name == "add"], call


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_responses_call_through_vllm_records_the_template_ids_and_vllms_tool_call(
    proxy: LLMProxy, template: HFChatTemplate, stream: bool
) -> None:
    arguments, call = await _call(proxy, f"ro-{stream}", stream)
    assert [json.loads(a) for a in arguments] == [TOOL_MODEL_CALL["arguments"]]
    assert call.prompt_token_ids == template.render(QUESTION, tools=CHAT_TOOLS)
    assert call.response_token_ids and call.response_logprobs is not None
    assert len(call.response_logprobs) == len(call.response_token_ids)
    assert TOOL_MODEL_ANSWER not in template.tokenizer.decode(call.response_token_ids)
