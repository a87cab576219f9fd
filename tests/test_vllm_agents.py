"""Ordinary agents of each framework, one adapter line each, through proxy -> real vLLM -> store -> transitions.

The session's `vllm_server` serves the warm-started tool model: with tools and no tool result it calls
``add(a=2, b=3)`` (parsed by vLLM's own ``hermes`` parser), after the result (or without tools) it answers
``The answer is 5.``. Each agent runs one rollout; checked: one transition per model call, joined by response id,
with exactly the ids vLLM generated (the proxy's record, which equals the model's chat template rendering of the
request) and the rollout's reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient
from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from openai import AsyncOpenAI
from transformers import AutoTokenizer
from typing_extensions import TypedDict

from agentlightning.adapters import Adapter
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import KitHarness
from agentlightning_autogen import AutoGenAdapter
from agentlightning_langchain import LangChainAdapter
from agentlightning_openai_agents import OpenAIAgentsAdapter
from agentlightning_torch import HFChatTemplate
from agentlightning_torch.testing import TOOL_MODEL_ANSWER, VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

TASK = "What is 2 plus 3?"


def add_numbers(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


async def langgraph_agent(base_url: str, task: str) -> str:
    """A LangGraph tool loop: the model calls ``add`` through a ToolNode until it answers."""
    add = tool("add")(add_numbers)
    llm = ChatOpenAI(base_url=base_url, api_key="t", model="tiny", temperature=0).bind_tools([add])

    async def model(state: State) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def route(state: State) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([add]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    out = await graph.compile().ainvoke({"messages": [HumanMessage(task)]}, {"recursion_limit": 8})
    return str(out["messages"][-1].content)


async def agents_sdk_agent(base_url: str, task: str) -> str:
    """An OpenAI Agents SDK agent with one function tool (greedy: every framework here decodes greedily)."""
    model = OpenAIChatCompletionsModel(model="tiny", openai_client=AsyncOpenAI(base_url=base_url, api_key="t"))
    add = function_tool(add_numbers, name_override="add")
    settings = ModelSettings(temperature=0)
    agent = Agent(name="adder", instructions="Use the add tool.", model=model, tools=[add], model_settings=settings)
    result = await Runner.run(agent, task, max_turns=4)
    return str(result.final_output)


MODEL_INFO: Any = {
    "vision": False, "function_calling": True, "json_output": False, "family": "unknown", "structured_output": False,
}  # fmt: skip


async def autogen_agent(base_url: str, task: str) -> str:
    """An AutoGen AssistantAgent that calls its tool and reflects on the result."""
    client = OpenAIChatCompletionClient(
        model="tiny", base_url=base_url, api_key="t", model_info=MODEL_INFO, temperature=0
    )

    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    solver = AssistantAgent("solver", model_client=client, tools=[add], reflect_on_tool_use=True)
    try:
        result = await solver.run(task=task)
    finally:
        await client.close()
    return str(result.messages[-1].content)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def template(tool_model_dir: Path) -> HFChatTemplate:
    return HFChatTemplate(AutoTokenizer.from_pretrained(tool_model_dir), tool_parser="hermes")


@pytest.mark.parametrize(
    ("adapter", "agent", "calls"),
    [
        (LangChainAdapter.default, langgraph_agent, 2),
        (OpenAIAgentsAdapter.default, agents_sdk_agent, 2),
        (AutoGenAdapter.default, autogen_agent, 2),
    ],
    ids=["langgraph", "agents-sdk", "autogen"],
)
async def test_agent_through_vllm_gives_exact_transitions(
    vllm_server: VLLMServer, template: HFChatTemplate, adapter: Any, agent: Any, calls: int
) -> None:
    store = MemoryStore()
    async with LLMProxy(store, [vllm_server.base_url]) as proxy:
        harness = KitHarness(cast(Any, vllm_server), proxy, store)
        instrumented: Adapter = adapter()
        with harness.instrumented(instrumented):
            record = await harness.collect(await harness.run(agent, TASK, reward=0.5))
    assert TOOL_MODEL_ANSWER in str(record.result)
    assert len(record.calls) == calls and all(c.error is None for c in record.calls)
    first, last = record.calls[0], record.calls[-1]
    assert first.response is not None and first.response["choices"][0]["message"]["tool_calls"]
    assert last.response is not None and last.response["choices"][0]["message"]["content"] == TOOL_MODEL_ANSWER
    assert record.transitions is not None
    transitions = record.transitions.transitions
    assert len(transitions) == len(record.calls)
    assert record.transitions.diagnostics.joined_by_response_id == len(record.calls)
    by_call = {c.call_id: c for c in record.calls}
    for transition in transitions:
        (call_id,) = transition.call_ids
        call = by_call[call_id]
        assert transition.prompt_token_ids == call.prompt_token_ids
        assert transition.response_token_ids == call.response_token_ids
        assert call.response_logprobs is not None and len(call.response_logprobs) == len(call.response_token_ids)
        assert transition.final_reward == 0.5
        # what vLLM rendered is the model's own template applied to the request the agent sent
        request = call.request
        assert call.prompt_token_ids == template.render(request["messages"], tools=request.get("tools"))
