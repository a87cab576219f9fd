"""OpenAI's Responses API through the LLM proxy to `LocalBackend` serving the warm-started tool model, with the real
``openai`` SDK and LangGraph's ``ChatOpenAI(use_responses_api=True)``.

The model (`make_tool_chat_model`): with tools and no tool result it calls ``add(a=2, b=3)``; after the result it
answers ``The answer is 5.``. Checked: plain, streamed and tool round-trip calls answer as the Responses API does,
each recorded under its response id with the exact ids the backend produced; and one conversation sent as a chat
completion and as a Responses call renders the same prompt ids and, greedily, the same answer ids (the proxy serves
Responses through the backend's chat path, with the model's own template).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from openai import AsyncOpenAI

import agentlightning as agl
import agentlightning_langchain
from agentlightning import LLMCall
from agentlightning.proxy import LLMProxy
from agentlightning.testing import start_attempts
from agentlightning_torch import BackendServer, LocalBackend, serve_backend
from agentlightning_torch.testing import TOOL_MODEL_ANSWER, TOOL_MODEL_CALL, add_tool_schema

pytestmark = pytest.mark.timeout(600)

TASK = "What is 2 plus 3?"
CHAT_TOOL = add_tool_schema(0)
TOOL = {"type": "function", **CHAT_TOOL["function"]}  # the Responses API's flat function tool


@pytest.fixture(scope="module")
def local(tool_model_dir: Path) -> Iterator[BackendServer]:
    running = serve_backend(LocalBackend(tool_model_dir, model_name="tiny", batch_wait_ms=1.0))
    yield running
    running.stop()


CLIENTS: list[AsyncOpenAI] = []


@pytest.fixture
async def proxy(local: BackendServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(agl.MemoryStore(), [local.url]) as running:
        yield running
        for opened in CLIENTS:
            await opened.close()
        CLIENTS.clear()


async def client(proxy: LLMProxy, rollout: str) -> tuple[AsyncOpenAI, str]:
    attempts = await start_attempts(proxy.store, [rollout])
    base_url = proxy.base_url(rollout, attempts[rollout])
    CLIENTS.append(AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0))
    return CLIENTS[-1], attempts[rollout]


async def only_call(proxy: LLMProxy, rollout: str) -> LLMCall:
    await proxy.flush()
    (call,) = await proxy.store.query_llm_calls(rollout)
    return call


async def test_responses_tool_round_trip(proxy: LLMProxy) -> None:
    agent, _ = await client(proxy, "ro-call")
    first = await agent.responses.create(model="tiny", input=TASK, tools=[TOOL], temperature=0)  # type: ignore[arg-type]
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "add"
    assert json.loads(call.arguments) == TOOL_MODEL_CALL["arguments"]
    recorded = await only_call(proxy, "ro-call")
    assert recorded.response_id == first.id and recorded.request["input"] == TASK
    assert recorded.response is not None and recorded.response["output"][0]["call_id"] == call.call_id
    assert recorded.prompt_token_ids and recorded.response_token_ids
    assert recorded.response_logprobs is not None and len(recorded.response_logprobs) == len(
        recorded.response_token_ids
    )
    assert first.usage is not None and first.usage.input_tokens == len(recorded.prompt_token_ids)

    again, _ = await client(proxy, "ro-result")
    items: list[Any] = [{"role": "user", "content": TASK}, call.model_dump(exclude_none=True),
                        {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]  # fmt: skip
    second = await again.responses.create(model="tiny", input=items, tools=[TOOL], temperature=0)  # type: ignore[arg-type]
    assert second.output_text == TOOL_MODEL_ANSWER
    assert (await only_call(proxy, "ro-result")).response_id == second.id


async def test_streamed_responses_give_the_sdk_events_and_record_the_call(proxy: LLMProxy) -> None:
    agent, _ = await client(proxy, "ro-text")
    stream = await agent.responses.create(model="tiny", input=TASK, stream=True, temperature=0)
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == TOOL_MODEL_ANSWER
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == TOOL_MODEL_ANSWER
    streamed = await only_call(proxy, "ro-text")
    assert streamed.response_id == completed.id and streamed.response is not None
    assert streamed.response["output"] == [item.model_dump(exclude_none=True) for item in completed.output]
    whole_agent, _ = await client(proxy, "ro-whole")
    await whole_agent.responses.create(model="tiny", input=TASK, temperature=0)
    whole = await only_call(proxy, "ro-whole")
    assert (streamed.prompt_token_ids, streamed.response_token_ids) == (
        whole.prompt_token_ids,
        whole.response_token_ids,
    )

    calling, _ = await client(proxy, "ro-stream-call")
    stream = await calling.responses.create(model="tiny", input=TASK, tools=[TOOL], stream=True, temperature=0)  # type: ignore[arg-type]
    events = [event async for event in stream]
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")  # type: ignore[union-attr]
    assert json.loads(arguments) == TOOL_MODEL_CALL["arguments"]
    [item] = events[-1].response.output  # type: ignore[union-attr]
    assert item.type == "function_call" and item.name == "add" and item.arguments == arguments


async def test_one_conversation_as_chat_and_as_responses_renders_the_same_ids(proxy: LLMProxy) -> None:
    """After the tool's result, with a system prompt: the same prompt ids, and greedily the same answer ids."""
    call_id = "call_0"
    arguments = json.dumps(TOOL_MODEL_CALL["arguments"])
    chat_messages = [
        {"role": "system", "content": "Use the add tool for arithmetic."},
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "5"},
    ]  # fmt: skip
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": TASK}]},
        {"type": "function_call", "call_id": call_id, "name": "add", "arguments": arguments},
        {"type": "function_call_output", "call_id": call_id, "output": "5"},
    ]
    chat, _ = await client(proxy, "ro-chat")
    answer = await chat.chat.completions.create(model="tiny", messages=chat_messages, tools=[CHAT_TOOL], temperature=0)  # type: ignore[arg-type, list-item]
    responses, _ = await client(proxy, "ro-responses")
    response = await responses.responses.create(
        model="tiny",
        instructions="Use the add tool for arithmetic.",
        input=items,
        tools=[TOOL],
        temperature=0,  # type: ignore[arg-type]
    )
    assert response.output_text == answer.choices[0].message.content == TOOL_MODEL_ANSWER
    by_chat, by_responses = await only_call(proxy, "ro-chat"), await only_call(proxy, "ro-responses")
    assert by_responses.prompt_token_ids == by_chat.prompt_token_ids
    assert by_responses.response_token_ids == by_chat.response_token_ids


class State(MessagesState):
    pass


@agl.rollout
async def langgraph_agent(task: dict[str, str], resources: agl.Resources) -> float:
    """A LangGraph tool loop on ``ChatOpenAI(use_responses_api=True)``: the model calls ``add``, then answers."""

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    assert resources.llm is not None
    llm = ChatOpenAI(model=resources.llm.model, base_url=agl.llm_base_url(), api_key="none",  # type: ignore[arg-type]
                     use_responses_api=True, temperature=0).bind_tools([add])  # fmt: skip

    async def model(state: State) -> dict[str, list[AnyMessage]]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def route(state: State) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([add]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    out = await graph.compile().ainvoke({"messages": [HumanMessage(task["question"])]}, {"recursion_limit": 8})
    return 1.0 if out["messages"][-1].text == TOOL_MODEL_ANSWER else 0.0


async def test_langgraph_on_the_responses_api_gives_transitions(proxy: LLMProxy) -> None:
    store = proxy.store
    await store.add_resources(agl.Resources(resources_id="v1", items={"llm": proxy.llm_resource("tiny")}))
    rollout = await store.enqueue_rollout({"question": TASK})
    agentlightning_langchain.instrument()
    try:
        await agl.Runner(langgraph_agent, store=store, stop_when_idle=True).arun()
    finally:
        agentlightning_langchain.uninstrument()
    assert (await store.get_rollout(rollout.rollout_id)).status == "succeeded"
    calls = sorted(await store.query_llm_calls(rollout.rollout_id), key=lambda c: c.start_time)
    assert len(calls) == 2 and all(c.response and c.response["object"] == "response" for c in calls)
    transitions = await agl.transitions_from_store(store, [rollout.rollout_id])
    assert [(t.prompt_token_ids, t.response_token_ids) for t in transitions] == [
        (c.prompt_token_ids, c.response_token_ids) for c in calls
    ]
    assert all(t.final_reward == 1.0 for t in transitions)
