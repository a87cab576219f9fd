"""The AutoGen adapter passes the conformance kit: an AssistantAgent with a tool inside a RoundRobinGroupChat."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlightning import semconv
from agentlightning.testing import AdapterConformanceTests, KitHarness
from agentlightning.tracing import set_as_global
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


@pytest.fixture(autouse=True, scope="module")
def global_provider() -> None:
    """AutoGen traces through the global OpenTelemetry provider, which the application sets (as ``agl runner``
    does); the adapter never sets it."""
    set_as_global()


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


async def test_spans_of_the_given_tracer_provider_are_typed_and_stored(agl_harness: KitHarness) -> None:
    """``instrument(tracer_provider=...)``: AutoGen's GenAI spans started through that provider (AutoGen's scope
    ``autogen-core``) are typed as agent spans, reach the provider's own exporter and the rollout's store."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    adapter = AutoGenAdapter.default()
    adapter.uninstrument()
    adapter.instrument(tracer_provider=provider)

    async def agent(base_url: str, task: str) -> str:
        # what autogen-core does around an agent turn, through the provider the application gave it
        tracer = provider.get_tracer("autogen-core")
        with tracer.start_as_current_span("invoke_agent solver", attributes={semconv.GEN_AI_OPERATION: "invoke_agent"}):
            return task

    try:
        record = await agl_harness.collect(await agl_harness.run(agent, "2+3?"))
    finally:
        adapter.uninstrument()
    (stored,) = record.of_kind(semconv.KIND_AGENT)
    assert stored.name == "invoke_agent solver" and stored.attributes[semconv.ADAPTER_NAME] == "autogen"
    (exported,) = exporter.get_finished_spans()
    assert (exported.attributes or {}).get(semconv.SPAN_KIND) == semconv.KIND_AGENT


def test_instrument_leaves_the_global_tracer_provider_alone() -> None:
    """An instrumentor never sets the global OpenTelemetry provider; without one it says AutoGen's own spans are
    not recorded (a fresh interpreter tells)."""
    code = (
        "from opentelemetry import trace\n"
        "import agentlightning_autogen\n"
        "agentlightning_autogen.instrument()\n"
        "print(type(trace.get_tracer_provider()).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.strip() == "ProxyTracerProvider", done.stderr
    assert "none is set" in done.stderr
