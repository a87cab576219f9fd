"""The AutoGen adapter passes the conformance kit: an AssistantAgent with a tool inside a RoundRobinGroupChat."""

from __future__ import annotations

from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

from agentlightning import semconv
from agentlightning.testing import AdapterConformanceTests, KitHarness
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
        return AutoGenAdapter.default()

    @pytest.fixture
    def agent(self) -> Any:
        return run_team


@pytest.fixture
def agl_script() -> Any:
    """The core's pytest plugin serves the same script as the conformance suite."""
    return TestAutoGenConformance().script


async def test_agent_name_on_transitions(agl_harness: KitHarness) -> None:
    """Both model calls (tool call + reflection) are attributed to the AutoGen agent."""
    with agl_harness.instrumented(AutoGenAdapter.default()):
        record = await agl_harness.collect(await agl_harness.run(run_team, "2+3?"))
    assert record.transitions is not None
    assert [t.agent_name for t in record.transitions.transitions] == ["solver", "solver"]
    assert [s.attributes.get(semconv.GEN_AI_TOOL_NAME) for s in record.of_kind(semconv.KIND_TOOL)] == ["add"]
