"""The AutoGen adapter passes the conformance kit: an AssistantAgent with a tool inside a RoundRobinGroupChat."""

from __future__ import annotations

from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

from agentlightning import semconv
from agentlightning.testing import AdapterConformanceTests
from agentlightning_autogen import AutoGenAdapter

MODEL_INFO: Any = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run_team(base_url: str, task: str) -> str:
    client = OpenAIChatCompletionClient(model="toy", base_url=base_url, api_key="kit", model_info=MODEL_INFO)
    solver = AssistantAgent("solver", model_client=client, tools=[add], reflect_on_tool_use=True)
    team = RoundRobinGroupChat([solver], max_turns=1)
    try:
        result = await team.run(task=task)
    finally:
        await client.close()
    return str(result.messages[-1].content)  # type: ignore[union-attr]


class TestAutoGenConformance(AdapterConformanceTests):
    @pytest.fixture
    def adapter(self) -> AutoGenAdapter:
        adapter = AutoGenAdapter.default()
        assert isinstance(adapter, AutoGenAdapter)
        return adapter

    @pytest.fixture
    def agent(self) -> Any:
        return run_team


async def test_agent_name_on_transitions() -> None:
    """Both model calls (tool call + reflection) are attributed to the AutoGen agent."""
    from agentlightning.proxy import LLMProxy
    from agentlightning.store import MemoryStore
    from agentlightning.testing import ScriptedModelServer
    from agentlightning.testing._adapter_kit import KitHarness

    kit = TestAutoGenConformance()
    with ScriptedModelServer(kit.script) as server:
        store = MemoryStore()
        async with LLMProxy(store, [server.base_url]) as proxy:
            adapter = AutoGenAdapter.default()
            adapter.instrument()
            try:
                harness = KitHarness(server, proxy, store)
                record = await harness.collect(await harness.run(run_team, "2+3?"))
            finally:
                adapter.uninstrument()
    assert record.transitions is not None
    assert [t.agent_name for t in record.transitions.transitions] == ["solver", "solver"]
    assert [s.attributes.get(semconv.GEN_AI_TOOL_NAME) for s in record.of_kind(semconv.KIND_TOOL)] == ["add"]
