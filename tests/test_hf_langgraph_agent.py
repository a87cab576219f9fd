"""An ordinary LangGraph tool-calling agent on a Hugging Face chat model: LLM proxy → local backend, exact ids.

The model is a tiny random Qwen2 with a byte-level BPE tokenizer and the hermes chat template, built here. A first
episode (untrained model) shows what the agent sends; the model is then taught (overfitted) to answer those exact
prompts with a hermes tool call and, after the tool result, with the answer; the new weights are swapped into the
running backend, and the real episode runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

import torch
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from agentlightning import LLMCall
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.tracing import aflush, emit_reward, rollout_context
from agentlightning.transitions import TransitionConfig, transitions_from_store
from agentlightning_langchain import LangChainAdapter
from agentlightning_torch import HFChatTemplate, LocalBackend, load_model, serve_backend
from agentlightning_torch.testing import make_tiny_chat_model, memorize


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_agent(base_url: str) -> Any:
    llm = ChatOpenAI(
        base_url=base_url, api_key="unused", model="tiny-qwen", temperature=0, max_tokens=48, max_retries=0
    )
    model = llm.bind_tools([add])

    async def agent(state: State) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([add]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph.compile()


QUESTION = [SystemMessage("Be brief."), HumanMessage("What is 2 plus 3?")]


async def run_episode(store: MemoryStore, proxy: LLMProxy, reward: float) -> tuple[str, dict[str, Any], list[LLMCall]]:
    rollout = await store.enqueue_rollout(input="2+3", group_id="g")
    claim = await store.dequeue_rollout("w")
    assert claim is not None and claim.rollout.rollout_id == rollout.rollout_id
    rid, aid = rollout.rollout_id, claim.attempt.attempt_id
    with rollout_context(store, rid, aid):
        state = await build_agent(proxy.base_url(rid, aid)).ainvoke(
            {"messages": list(QUESTION)}, {"recursion_limit": 8}
        )
        emit_reward(reward, final=True)
    await aflush()  # the attempt's spans before its end: the store refuses them after
    await store.finish_attempt(rid, aid, "succeeded")
    await proxy.flush()
    return rid, state, sorted(await store.query_llm_calls(rid), key=lambda c: c.start_time)


def teach(template: HFChatTemplate, probe: LLMCall) -> list[tuple[list[int], list[int]]]:
    """(prompt, response) pairs for the agent's two turns, rendered from what the agent really sent."""
    messages, tools = probe.request["messages"], probe.request["tools"]
    end = [int(template.tokenizer.convert_tokens_to_ids("<|im_end|>"))]  # pyright: ignore[reportArgumentType]

    def encode(text: str) -> list[int]:
        return template.encode_text(text, add_special_tokens=False)

    call = {"id": "x", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    call_text = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'  # as the template renders it
    )
    after = [*messages, {"role": "assistant", "content": None, "tool_calls": [call]}]
    after.append({"role": "tool", "tool_call_id": "x", "content": "5"})
    return [
        (
            template.render(messages, tools=tools),
            encode(call_text) + end,
        ),
        (template.render(after, tools=tools), encode("The answer is 5.") + end),
    ]


async def test_langgraph_agent_on_a_hf_model_through_the_proxy(tmp_path: Path) -> None:
    loaded = load_model(make_tiny_chat_model(tmp_path / "model", seed=3))
    backend = LocalBackend(loaded, model_name="tiny-qwen", batch_wait_ms=1.0)
    template = backend.template
    assert isinstance(template, HFChatTemplate)
    server = serve_backend(backend)
    adapter = LangChainAdapter.default()
    store = MemoryStore()
    try:
        async with LLMProxy(store, [server.url], model_version=0) as proxy:
            adapter.instrument()
            try:
                _, _, probe_calls = await run_episode(store, proxy, 0.0)  # untrained: whatever it says, no tool call
                pairs = teach(template, probe_calls[0])
                memorize(loaded.model, pairs, steps=150)
                assert backend.update_weights(loaded.model) == 1
                rid, state, calls = await run_episode(store, proxy, 1.0)
            finally:
                adapter.uninstrument()
            transitions = await transitions_from_store(store, [rid], TransitionConfig(mode="trajectory"))
    finally:
        server.stop()

    # The agent called the tool through an OpenAI tool call and answered with its result.
    assert [type(m).__name__ for m in state["messages"]] == [
        "SystemMessage", "HumanMessage", "AIMessage", "ToolMessage", "AIMessage"
    ]  # fmt: skip
    tool_call = state["messages"][2].tool_calls[0]
    assert tool_call["name"] == "add" and tool_call["args"] == {"a": 2, "b": 3}
    assert state["messages"][3].content == "5" and state["messages"][4].content == "The answer is 5."
    assert len(calls) == 2 and calls[0].response is not None
    assert calls[0].response["choices"][0]["finish_reason"] == "tool_calls"

    # Every call's ids are exactly what the backend rendered with the chat template and what the model generated.
    for call, (prompt, response) in zip(calls, pairs, strict=True):
        rendered = template.render(call.request["messages"], tools=call.request["tools"])
        assert call.prompt_token_ids == rendered == prompt
        ids = torch.tensor([prompt])
        generated = loaded.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=48,
            do_sample=False,
            eos_token_id=sorted(loaded.eos_token_ids),
        )
        assert call.response_token_ids == generated[0, len(prompt) :].tolist() == response
        assert call.response_logprobs is not None and len(call.response_logprobs) == len(response)
        assert call.model_version == 1

    # The two turns merge into one trajectory sample: the second prompt extends the first prompt + response.
    assert len(transitions) == 1
    sample = transitions[0]
    first, second = calls
    observation = second.prompt_token_ids[len(first.prompt_token_ids) + len(first.response_token_ids) :]
    assert sample.prompt_token_ids == first.prompt_token_ids
    assert sample.response_token_ids == first.response_token_ids + observation + second.response_token_ids
    assert sample.response_mask == [1] * len(first.response_token_ids) + [0] * len(observation) + [1] * len(
        second.response_token_ids
    )
    assert sample.final_reward == 1.0 and sample.model_version == 1
