"""Agents written with the ``anthropic`` SDK, as its docs write them, train through the LLM proxy's ``/v1/messages``.

The backend is the embedded `LocalBackend` serving the session's tool-calling model (`tool_model_dir`) in-process,
with the model's own template; the agents run under `agl.Runner`, reach the proxy through their worker slot's URL
(``agl.llm_base_url().removesuffix("/v1")``, the SDK adds ``/v1/messages``) with a literal ``api_key`` the SDK
sends as ``x-api-key``, and their calls become transitions with token ids and rewards. A differential test sends one
conversation as chat and as Messages: the same prompt ids and, greedily, the same answer ids.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import AsyncAnthropic
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from openai import AsyncOpenAI

import agentlightning as agl
from agentlightning.proxy import LLMProxy, register_backend, unregister_backend
from agentlightning.store import MemoryStore
from agentlightning.transitions import transitions_from_store
from agentlightning_langchain import LangChainAdapter
from agentlightning_torch import LocalBackend, OpenAIEndpoint
from agentlightning_torch.testing import TOOL_MODEL_ANSWER, TOOL_MODEL_CALL

pytestmark = pytest.mark.timeout(600)

TOKEN = "agents-token-0123456789"
SYSTEM = "You are a helpful assistant."
QUESTION = "What is 2 plus 3?"
ADD_TOOL: dict[str, Any] = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
GREEDY = {"temperature": 0}  # the SDK no longer takes sampling settings as arguments; the API still does
SEEN: dict[str, Any] = {}


@pytest.fixture(scope="module")
def backend_url(tool_model_dir: Path) -> AsyncIterator[str]:
    backend = LocalBackend(tool_model_dir, model_name="tiny", batch_wait_ms=1.0).start()
    url = register_backend(OpenAIEndpoint(backend))
    try:
        yield url
    finally:
        unregister_backend(url)
        backend.stop()


@pytest.fixture
async def setup(backend_url: str) -> AsyncIterator[tuple[MemoryStore, LLMProxy]]:
    SEEN.clear()
    store = MemoryStore(retry_policy=agl.RetryPolicy(max_attempts=1))
    proxy = await LLMProxy(store, [backend_url], token=TOKEN).start()
    await store.add_resources(agl.Resources(resources_id="r1", items={"llm": proxy.llm_resource("tiny")}))
    try:
        yield store, proxy
    finally:
        await proxy.stop()


def _client() -> AsyncAnthropic:
    # as the SDK's docs write it: a base URL and a key (literal: the slot's URL admits the call)
    return AsyncAnthropic(base_url=agl.llm_base_url().removesuffix("/v1"), api_key="literal-key", max_retries=0)


async def _tool_round_trip(client: AsyncAnthropic, stream: bool) -> tuple[list[Any], Any]:
    """Ask, run the tool the model calls, send its result back; returns (each turn's message, the final one)."""
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    turns: list[Any] = []
    for _ in range(3):
        args: dict[str, Any] = {"model": "tiny", "max_tokens": 48, "system": SYSTEM, "messages": messages,
                                "tools": [ADD_TOOL], "extra_body": GREEDY}  # fmt: skip
        if stream:
            async with client.messages.stream(**args) as events:
                async for _event in events:
                    pass
                message = await events.get_final_message()
        else:
            message = await client.messages.create(**args)
        turns.append(message)
        uses = [block for block in message.content if block.type == "tool_use"]
        if message.stop_reason != "tool_use":
            break
        messages.append({"role": "assistant", "content": [block.model_dump() for block in message.content]})
        results = [{"type": "tool_result", "tool_use_id": use.id, "content": str(use.input["a"] + use.input["b"])}
                   for use in uses]  # fmt: skip
        messages.append({"role": "user", "content": results})
    return turns, turns[-1]


@agl.rollout
async def messages_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    async with _client() as client:
        turns, final = await _tool_round_trip(client, stream=task["stream"])
    SEEN[task["id"]] = turns
    text = "".join(block.text for block in final.content if block.type == "text")
    return 1.0 if text == TOOL_MODEL_ANSWER else 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_anthropic_sdk_tool_agent_under_the_runner(setup: tuple[MemoryStore, LLMProxy], stream: bool) -> None:
    store, _ = setup
    rollout = await store.enqueue_rollout({"id": "t", "stream": stream})
    await agl.Runner(messages_agent, store, n_workers=1, worker_mode="async", stop_when_idle=True).arun()
    assert (await store.get_rollout(rollout.rollout_id)).status == "succeeded"
    first, final = SEEN["t"]
    # the model called the tool (a tool_use block with its input), then answered from the result
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert (use.name, use.input, first.stop_reason) == (
        TOOL_MODEL_CALL["name"],
        TOOL_MODEL_CALL["arguments"],
        "tool_use",
    )
    assert final.stop_reason == "end_turn" and final.content[0].text == TOOL_MODEL_ANSWER
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    calls = sorted(await store.query_llm_calls(rollout.rollout_id), key=lambda c: c.start_time)
    assert len(calls) == 2 and all(c.error is None for c in calls)
    # recorded as chat calls: the system message first, the tool's result as a tool message
    assert calls[0].request["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    assert [m["role"] for m in calls[1].request["messages"]] == ["system", "user", "assistant", "tool"]
    assert calls[1].request["messages"][3]["content"] == "5"
    assert [c.response_id for c in calls] == [first.id, final.id]
    transitions = await transitions_from_store(store, [rollout.rollout_id])
    assert len(transitions) == 2
    for transition, call in zip(transitions, calls, strict=True):
        assert transition.prompt_token_ids == call.prompt_token_ids and transition.prompt_token_ids
        assert transition.response_token_ids == call.response_token_ids and transition.response_token_ids
    assert transitions[-1].final_reward == 1.0


def _langgraph_agent(llm: Any) -> Any:
    """LangGraph's tool agent as its docs build it: the model with tools bound, a ToolNode, a route between them."""

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = llm.bind_tools([add])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([add]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


@agl.rollout
async def chat_anthropic_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    llm = ChatAnthropic(  # type: ignore[call-arg]
        model_name="tiny", base_url=agl.llm_base_url().removesuffix("/v1"), api_key="literal-key",  # type: ignore[arg-type]
        temperature=0, max_tokens=48, max_retries=0,
    )  # fmt: skip
    result = await _langgraph_agent(llm).ainvoke({"messages": [SystemMessage(SYSTEM), HumanMessage(QUESTION)]})
    SEEN[task["id"]] = result["messages"]
    return 1.0 if result["messages"][-1].content == TOOL_MODEL_ANSWER else 0.0


async def test_langchain_chat_anthropic_in_a_langgraph_tool_agent(setup: tuple[MemoryStore, LLMProxy]) -> None:
    store, _ = setup
    rollout = await store.enqueue_rollout({"id": "lg"})
    adapter = LangChainAdapter.default()
    adapter.instrument()
    try:
        await agl.Runner(chat_anthropic_agent, store, n_workers=1, worker_mode="async", stop_when_idle=True).arun()
    finally:
        adapter.uninstrument()
    assert (await store.get_rollout(rollout.rollout_id)).status == "succeeded"
    roles = [type(m).__name__ for m in SEEN["lg"]]
    assert roles == ["SystemMessage", "HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert SEEN["lg"][3].content == "5"
    calls = sorted(await store.query_llm_calls(rollout.rollout_id), key=lambda c: c.start_time)
    assert len(calls) == 2 and all(c.error is None for c in calls)
    assert calls[1].request["messages"][-1] == {"role": "tool", "tool_call_id": calls[1].request["messages"][-2][
        "tool_calls"][0]["id"], "content": "5"}  # fmt: skip
    # the adapter's LLM spans carry the Messages id, which is the recorded call's: joined by response id
    spans = await store.query_spans(rollout.rollout_id)
    span_ids = {
        s.attributes.get("gen_ai.response.id") for s in spans if s.attributes.get("agentlightning.span.kind") == "llm"
    }
    assert span_ids == {c.response_id for c in calls}
    transitions = await transitions_from_store(store, [rollout.rollout_id])
    assert [t.response_token_ids for t in transitions] == [c.response_token_ids for c in calls]
    assert transitions[-1].final_reward == 1.0


async def _attempt_url(store: MemoryStore, proxy: LLMProxy) -> tuple[str, str, str]:
    await store.enqueue_rollout({"id": "direct"})
    claim = await store.dequeue_rollout("test")
    assert claim is not None
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    return proxy.base_url(rid, aid), rid, aid


async def test_one_conversation_as_chat_and_as_messages_renders_the_same_ids(
    setup: tuple[MemoryStore, LLMProxy],
) -> None:
    """A conversation after a tool call, sent both ways greedily: the same prompt ids and the same answer ids."""
    store, proxy = setup
    url, rid, aid = await _attempt_url(store, proxy)
    arguments = json.dumps(TOOL_MODEL_CALL["arguments"])
    chat_messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]  # fmt: skip
    tool = {"type": "function", "function": {"name": "add", "description": ADD_TOOL["description"],
                                             "parameters": ADD_TOOL["input_schema"]}}  # fmt: skip
    async with AsyncOpenAI(base_url=url, api_key=TOKEN, max_retries=0) as chat:
        await chat.chat.completions.create(
            model="tiny",
            messages=chat_messages,
            tools=[tool],
            temperature=0,
            max_tokens=32,  # type: ignore[arg-type]
        )
    async with AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key=TOKEN, max_retries=0) as client:
        answer = await client.messages.create(
            model="tiny", system=SYSTEM, max_tokens=32, extra_body=GREEDY, tools=[ADD_TOOL],  # type: ignore[list-item]
            messages=[
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "add", "input": TOOL_MODEL_CALL["arguments"]}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}]},
            ],
        )  # fmt: skip
    await proxy.flush()
    as_chat, as_messages = sorted(await store.query_llm_calls(rid, aid), key=lambda c: c.start_time)
    assert as_chat.prompt_token_ids == as_messages.prompt_token_ids and as_chat.prompt_token_ids
    assert as_chat.response_token_ids == as_messages.response_token_ids and as_chat.response_token_ids
    assert answer.content[0].type == "text" and answer.content[0].text == TOOL_MODEL_ANSWER


async def test_count_tokens_is_the_rendered_prompt_length(setup: tuple[MemoryStore, LLMProxy]) -> None:
    store, proxy = setup
    url, rid, aid = await _attempt_url(store, proxy)
    async with AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key=TOKEN, max_retries=0) as client:
        counted = await client.messages.count_tokens(
            model="tiny",
            system=SYSTEM,
            tools=[ADD_TOOL],
            messages=[{"role": "user", "content": QUESTION}],  # type: ignore[list-item]
        )
        await client.messages.create(
            model="tiny", system=SYSTEM, tools=[ADD_TOOL], max_tokens=8,  # type: ignore[list-item]
            messages=[{"role": "user", "content": QUESTION}],
        )  # fmt: skip
    await proxy.flush()
    (call,) = await store.query_llm_calls(rid, aid)
    assert counted.input_tokens == len(call.prompt_token_ids) > 0


BAD_BODIES: list[tuple[str, dict[str, Any], str]] = [
    ("image", {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image blocks"),
    ("unknown block", {"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, "'hologram'"),
    ("malformed block", {"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "string 'type'"),
    ("unknown tool_use id", {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "5"}]}]}, "'toolu_x'"),
    ("server tool", {"messages": [{"role": "user", "content": "hi"}],
                     "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    ("no max_tokens", {"max_tokens": None, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "body", "named"), BAD_BODIES, ids=[case for case, _, _ in BAD_BODIES])
async def test_what_cannot_be_honoured_is_refused_and_nothing_is_recorded(
    setup: tuple[MemoryStore, LLMProxy], case: str, body: dict[str, Any], named: str
) -> None:
    store, proxy = setup
    url, rid, aid = await _attempt_url(store, proxy)
    sent = {"model": "tiny", "max_tokens": 8, **body}
    sent = {k: v for k, v in sent.items() if v is not None}
    async with httpx.AsyncClient(timeout=60) as http:
        reply = await http.post(f"{url}/messages", json=sent, headers={"x-api-key": TOKEN})
        assert reply.status_code == 400, reply.text
        assert named in reply.json()["error"]["message"]
        # the proxy stays healthy: the next call is answered
        ok = await http.post(f"{url}/messages", json={"model": "tiny", "max_tokens": 4, "messages": [
            {"role": "user", "content": QUESTION}]}, headers={"x-api-key": TOKEN})  # fmt: skip
        assert ok.status_code == 200, ok.text
    await proxy.flush()
    assert len(await store.query_llm_calls(rid, aid)) == 1  # only the good call


async def test_the_agents_token_is_taken_from_x_api_key(setup: tuple[MemoryStore, LLMProxy]) -> None:
    store, proxy = setup
    url, _, _ = await _attempt_url(store, proxy)
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": QUESTION}]}
    async with AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key="wrong-key", max_retries=0) as client:
        with pytest.raises(anthropic.AuthenticationError):
            await client.messages.create(**body)  # type: ignore[arg-type]
    async with AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key=TOKEN, max_retries=0) as client:
        assert (await client.messages.create(**body)).role == "assistant"  # type: ignore[arg-type]
