"""The Agents SDK adapter passes the conformance kit: a triage agent hands off to an agent with a function tool."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlightning import semconv
from agentlightning.testing import AdapterConformanceTests, KitHarness, ScriptedReply
from agentlightning_openai_agents import OpenAIAgentsAdapter


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def build_agent(base_url: str) -> Agent[Any]:
    model = OpenAIChatCompletionsModel(model="toy", openai_client=AsyncOpenAI(base_url=base_url, api_key="kit"))
    math = Agent(name="math", instructions="Solve with the add tool.", model=model, tools=[add])
    return Agent(name="triage", instructions="Hand math to the math agent.", model=model, handoffs=[math])


def _called(messages: list[dict[str, Any]], name: str) -> bool:
    return any(
        call.get("function", {}).get("name") == name
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    )


class TestAgentsSdkConformance(AdapterConformanceTests):
    def script(self, body: dict[str, Any]) -> ScriptedReply:
        messages = body.get("messages") or []
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        task = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        handoff = next((t for t in tools if t.startswith("transfer_to_")), None)
        if handoff and not _called(messages, handoff):
            return ScriptedReply(tool_calls=[{"name": handoff, "arguments": {}}])
        if "add" in tools and not _called(messages, "add"):
            return ScriptedReply(tool_calls=[{"name": "add", "arguments": dict(self.tool_arguments)}])
        return ScriptedReply(content=f"{self.final_answer} [{task}]")

    @pytest.fixture
    def adapter(self) -> OpenAIAgentsAdapter:
        return OpenAIAgentsAdapter.default()

    @pytest.fixture
    def agent(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            result = await Runner.run(build_agent(base_url), task)
            return str(result.final_output)

        return run


@pytest.fixture
def agl_script() -> Any:
    """The core's pytest plugin serves the same script as the conformance suite."""
    return TestAgentsSdkConformance().script


async def test_handoff_and_agents_recorded(agl_harness: KitHarness) -> None:
    """Calls are attributed to the agent that made them, and the handoff is a span between them."""
    with agl_harness.instrumented(OpenAIAgentsAdapter.default()):
        record = await agl_harness.collect(
            await agl_harness.run(lambda url, task: Runner.run(build_agent(url), task), "2+3?")
        )
    assert record.transitions is not None
    assert [t.agent_name for t in record.transitions.transitions] == ["triage", "math", "math"]
    handoffs = [s for s in record.spans if s.name.startswith("handoff")]
    assert handoffs and handoffs[0].attributes.get("agentlightning.handoff.to_agent") == "math"
    tools = record.of_kind(semconv.KIND_TOOL)
    assert [s.attributes.get(semconv.GEN_AI_TOOL_NAME) for s in tools] == ["add"]


async def test_spans_go_through_the_given_tracer_provider(agl_harness: KitHarness) -> None:
    """``instrument(tracer_provider=...)``, as OpenTelemetry's instrumentors take it: the app's provider (and its
    exporter) gets the agent spans, and the rollout's store still does."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    adapter = OpenAIAgentsAdapter.default()
    adapter.uninstrument()
    adapter.instrument(tracer_provider=provider)
    try:
        record = await agl_harness.collect(
            await agl_harness.run(lambda url, task: Runner.run(build_agent(url), task), "2+3?")
        )
    finally:
        adapter.uninstrument()
        adapter.instrument()  # back to the default provider for the tests after this one
        adapter.uninstrument()
    exported = {
        str((span.attributes or {}).get(semconv.GEN_AI_AGENT_NAME))
        for span in exporter.get_finished_spans()
        if (span.attributes or {}).get(semconv.SPAN_KIND) == semconv.KIND_AGENT
    }
    stored = {str(span.attributes.get(semconv.GEN_AI_AGENT_NAME)) for span in record.of_kind(semconv.KIND_AGENT)}
    assert exported == stored == {"triage", "math"}


def test_instrument_leaves_the_global_tracer_provider_alone() -> None:
    """An instrumentor never sets the global OpenTelemetry provider (a fresh interpreter tells)."""
    code = (
        "from opentelemetry import trace\n"
        "import agentlightning_openai_agents\n"
        "agentlightning_openai_agents.instrument()\n"
        "print(type(trace.get_tracer_provider()).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.strip() == "ProxyTracerProvider", done.stderr
