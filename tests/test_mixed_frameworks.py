"""Mixed frameworks: an Agents SDK agent whose tool runs a LangChain chain -> one coherent trace."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from agentlightning import semconv
from agentlightning.testing import KitHarness, ScriptedReply
from agentlightning_langchain import LangChainAdapter
from agentlightning_openai_agents import OpenAIAgentsAdapter


@pytest.fixture
def agl_script() -> Any:
    """What the core pytest plugin's model server answers."""
    return script


def script(body: dict[str, Any]) -> ScriptedReply:
    messages = body.get("messages") or []
    tools = {t["function"]["name"] for t in body.get("tools") or []}
    if not tools:  # the LangChain chain inside the tool
        return ScriptedReply(content="Rivers flow downhill.")
    called = any(m.get("role") == "tool" for m in messages)
    if not called:
        return ScriptedReply(tool_calls=[{"name": "explain", "arguments": {"topic": "rivers"}}])
    return ScriptedReply(content="Done: rivers flow downhill.")


def build_agent(base_url: str) -> Agent[Any]:
    chain = ChatPromptTemplate.from_messages([("user", "Explain {topic} in one line.")]) | ChatOpenAI(
        base_url=base_url, api_key="t", model="toy"
    )

    @function_tool
    async def explain(topic: str) -> str:
        """Explain a topic (runs a LangChain chain)."""
        return str((await chain.ainvoke({"topic": topic})).content)

    model = OpenAIChatCompletionsModel(model="toy", openai_client=AsyncOpenAI(base_url=base_url, api_key="t"))
    return Agent(name="teacher", instructions="Use explain.", model=model, tools=[explain])


async def test_agents_sdk_tool_running_langchain_chain(agl_harness: KitHarness) -> None:
    with agl_harness.instrumented(OpenAIAgentsAdapter.default(), LangChainAdapter.default()):
        record = await agl_harness.collect(
            await agl_harness.run(lambda url, task: Runner.run(build_agent(url), task), "teach me")
        )

    by_id = {s.span_id: s for s in record.spans}
    llm = record.of_kind(semconv.KIND_LLM)
    # 3 model calls: agent -> tool call, chain inside the tool, agent -> final answer; one LLM span each
    assert len(record.calls) == 3 and len(llm) == 3
    assert {s.attributes.get(semconv.ADAPTER_NAME) for s in llm} == {"openai_agents", "langchain"}
    (lc_span,) = [s for s in llm if s.attributes.get(semconv.ADAPTER_NAME) == "langchain"]
    chain_ancestors: list[Any] = []
    span = lc_span
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        chain_ancestors.append(span)
    kinds = [s.attributes.get(semconv.SPAN_KIND) for s in chain_ancestors]
    assert semconv.KIND_TOOL in kinds and semconv.KIND_AGENT in kinds  # chain LLM under the SDK tool and agent
    framework = [s for s in record.spans if s.attributes.get(semconv.ADAPTER_NAME) in ("openai_agents", "langchain")]
    assert len({s.trace_id for s in framework}) == 1  # one trace across both frameworks
    assert record.transitions is not None
    transitions = record.transitions.transitions
    assert len(transitions) == 3
    assert [t.agent_name for t in transitions] == ["teacher"] * 3
    served = {c.response_id: c for c in agl_harness.server.served}
    by_call = {c.call_id: c for c in record.calls}
    for t in transitions:
        assert t.response_token_ids == served[by_call[t.call_ids[0]].response_id].token_ids
