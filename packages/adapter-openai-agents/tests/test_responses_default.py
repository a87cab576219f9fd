"""An Agents SDK agent with the SDK's default settings (the Responses API) under `agl.Runner`, written as the SDK's
docs write it: ``set_default_openai_client(AsyncOpenAI(base_url=agl.llm_base_url(), api_key="none"))`` and agents
named by a model string, a function tool and a handoff. Its calls reach the LLM proxy as ``POST .../v1/responses``
and become transitions with agent names, the handoff and the reward, as on the Chat Completions path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_default_openai_client
from openai import AsyncOpenAI

import agentlightning as agl
import agentlightning_openai_agents
from agentlightning import semconv
from agentlightning.proxy import LLMProxy
from agentlightning.testing import AdapterConformanceTests, ScriptedModelServer, ScriptedReply
from agentlightning_openai_agents import OpenAIAgentsAdapter

TOKEN = "agents-token-0123456789"


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@agl.rollout
async def triage_agent(task: dict[str, str], resources: agl.Resources) -> float:
    assert resources.llm is not None
    set_default_openai_client(AsyncOpenAI(base_url=agl.llm_base_url(), api_key="none"))
    math = Agent(name="math", instructions="Solve with the add tool.", tools=[add], model=resources.llm.model)
    triage = Agent(name="triage", instructions="Hand math to the math agent.", handoffs=[math],
                   model=resources.llm.model)  # fmt: skip
    result = await Runner.run(triage, task["question"])
    return 1.0 if "5" in str(result.final_output) else 0.0


def _called(messages: list[dict[str, Any]], name: str) -> bool:
    return any(
        call["function"]["name"] == name
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    )


def model(request: dict[str, Any]) -> str | ScriptedReply:
    """Stands in for the model: hand off when it can, then call ``add`` once, then answer."""
    messages = request["messages"]
    tools = {t["function"]["name"] for t in request.get("tools") or []}
    if "transfer_to_math" in tools and not _called(messages, "transfer_to_math"):
        return ScriptedReply(tool_calls=[{"name": "transfer_to_math", "arguments": {}}])
    if "add" in tools and not _called(messages, "add"):
        return ScriptedReply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}}])
    return "2 + 3 = 5"


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(model) as server:
        yield server


async def test_default_agents_sdk_agent_trains_through_the_responses_api(backend: ScriptedModelServer) -> None:
    store = agl.MemoryStore()
    agentlightning_openai_agents.instrument()
    try:
        async with LLMProxy(store, [backend.base_url], token=TOKEN) as proxy:
            await store.add_resources(agl.Resources(resources_id="v1", items={"llm": proxy.llm_resource("toy")}))
            rollout = await store.enqueue_rollout({"question": "What is 2 + 3?"})
            await agl.Runner(triage_agent, store=store, stop_when_idle=True).arun()
    finally:
        agentlightning_openai_agents.uninstrument()
    assert (await store.get_rollout(rollout.rollout_id)).status == "succeeded"
    assert [served.path for served in backend.served] == ["/v1/chat/completions"] * 3
    calls = sorted(await store.query_llm_calls(rollout.rollout_id), key=lambda c: c.start_time)
    assert len(calls) == 3 and all(c.response_id and c.response_id.startswith("resp_") for c in calls)
    assert all(c.request["input"] and c.response and c.response["object"] == "response" for c in calls)
    spans = await store.query_spans(rollout.rollout_id)
    handoffs = [s for s in spans if s.attributes.get("agentlightning.handoff.to_agent") == "math"]
    assert len(handoffs) == 1
    llm_spans = [s for s in spans if s.attributes.get(semconv.SPAN_KIND) == semconv.KIND_LLM]
    assert {s.attributes.get(semconv.GEN_AI_RESPONSE_ID) for s in llm_spans} == {c.response_id for c in calls}
    transitions = await agl.transitions_from_store(store, [rollout.rollout_id])
    assert [t.agent_name for t in transitions] == ["triage", "math", "math"]
    for transition, call in zip(transitions, calls, strict=True):
        assert transition.prompt_token_ids == call.prompt_token_ids and transition.prompt_token_ids
        assert transition.response_token_ids == call.response_token_ids and transition.response_token_ids
        assert transition.final_reward == 1.0
    # each call named its agent to the proxy (the header our openai instrumentation adds on responses.create too)
    assert [c.agent_name for c in calls] == ["triage", "math", "math"]


def build_responses_agent(base_url: str) -> Agent[Any]:
    """The conformance suite's agents on the Responses API (the SDK's default model class), one client per run."""
    model = OpenAIResponsesModel(model="toy", openai_client=AsyncOpenAI(base_url=base_url, api_key="kit"))
    math = Agent(name="math", instructions="Solve with the add tool.", model=model, tools=[add])
    return Agent(name="triage", instructions="Hand math to the math agent.", model=model, handoffs=[math])


class TestAgentsSdkResponsesConformance(AdapterConformanceTests):
    """The whole conformance kit (tree, ids, rewards, concurrent rollouts, streaming) on the Responses path."""

    supports_streaming = True

    def script(self, body: dict[str, Any]) -> ScriptedReply:
        messages = body.get("messages") or []
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        task = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        if "transfer_to_math" in tools and not _called(messages, "transfer_to_math"):
            return ScriptedReply(tool_calls=[{"name": "transfer_to_math", "arguments": {}}])
        if "add" in tools and not _called(messages, "add"):
            return ScriptedReply(tool_calls=[{"name": "add", "arguments": dict(self.tool_arguments)}])
        return ScriptedReply(content=f"{self.final_answer} [{task}]")

    @pytest.fixture
    def adapter(self) -> OpenAIAgentsAdapter:
        return OpenAIAgentsAdapter.default()

    @pytest.fixture
    def agent(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            result = await Runner.run(build_responses_agent(base_url), task)
            return str(result.final_output)

        return run

    @pytest.fixture
    def agent_streaming(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            streamed = Runner.run_streamed(build_responses_agent(base_url), task)
            async for _ in streamed.stream_events():
                pass
            return str(streamed.final_output)

        return run
