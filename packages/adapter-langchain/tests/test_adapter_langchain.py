"""The LangChain adapter passes the conformance kit with a real LangGraph graph (2 LLM nodes + a tool)."""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlightning import semconv
from agentlightning.testing import AdapterConformanceTests, KitHarness, ScriptedReply
from agentlightning_langchain import LangChainAdapter, LightningCallbackHandler


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(base_url: str, *, streaming: bool = False) -> Any:
    """planner (LLM with a tool) -> tools -> planner -> reviewer (second LLM node) -> end."""
    llm = ChatOpenAI(base_url=base_url, api_key="kit", model="toy", streaming=streaming, stream_usage=True)
    planner_llm = llm.bind_tools([add])

    async def planner(state: State) -> dict[str, Any]:
        return {"messages": [await planner_llm.ainvoke(state["messages"])]}

    async def reviewer(state: State) -> dict[str, Any]:
        last = state["messages"][-1]
        reply = await llm.ainvoke([SystemMessage("You review answers."), HumanMessage(str(last.content))])
        return {"messages": [AIMessage(content=reply.content, name="reviewer")]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "reviewer"

    graph = StateGraph(State)
    graph.add_node("planner", planner)
    graph.add_node("tools", ToolNode([add]))
    graph.add_node("reviewer", reviewer)
    graph.add_edge(START, "planner")
    graph.add_conditional_edges("planner", route, {"tools": "tools", "reviewer": "reviewer"})
    graph.add_edge("tools", "planner")
    graph.add_edge("reviewer", END)
    return graph.compile()


class TestLangGraphConformance(AdapterConformanceTests):
    supports_streaming = True

    def script(self, body: dict[str, Any]) -> ScriptedReply:
        messages = body.get("messages") or []
        if messages and messages[0].get("role") == "system":  # the reviewer echoes what it reviews
            return ScriptedReply(content=f"Reviewed: {messages[-1].get('content')}")
        return super().script(body)

    @pytest.fixture
    def adapter(self) -> LangChainAdapter:
        return LangChainAdapter.default()

    @pytest.fixture
    def agent(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            out = await build_graph(base_url).ainvoke({"messages": [HumanMessage(task)]})
            return str(out["messages"][-1].content)

        return run

    @pytest.fixture
    def agent_streaming(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            out = await build_graph(base_url, streaming=True).ainvoke({"messages": [HumanMessage(task)]})
            return str(out["messages"][-1].content)

        return run


@pytest.fixture
def agl_script() -> Any:
    """The core's pytest plugin serves the same script as the conformance suite."""
    return TestLangGraphConformance().script


async def test_graph_nodes_become_agents(agl_harness: KitHarness) -> None:
    """Both LLM nodes are agent spans named after the node; the tool span sits under the tools node."""
    with agl_harness.instrumented(LangChainAdapter.default()):
        graph_agent = lambda url, task: build_graph(url).ainvoke({"messages": [HumanMessage(task)]})  # noqa: E731
        record = await agl_harness.collect(await agl_harness.run(graph_agent, "what is 2+3?"))
    assert record.transitions is not None
    agents = [t.agent_name for t in record.transitions.transitions]
    assert agents == ["planner", "planner", "reviewer"]
    names = {s.attributes.get(semconv.GEN_AI_AGENT_NAME) for s in record.of_kind(semconv.KIND_AGENT)}
    assert names == {"planner", "tools", "reviewer"}


async def test_explicit_handler_needs_no_instrument(agl_harness: KitHarness) -> None:
    """The one-line handler alone (no instrument()) records the call as an LLM span joined to its token ids."""
    adapter = LangChainAdapter.default()
    adapter.uninstrument()
    assert not adapter.instrumented

    async def agent(base_url: str, task: str) -> str:
        llm = ChatOpenAI(base_url=base_url, api_key="kit", model="toy")
        reply = await llm.ainvoke(task, config={"callbacks": [LightningCallbackHandler()]})
        return str(reply.content)

    record = await agl_harness.collect(await agl_harness.run(agent, "explain rivers"))
    (span,) = record.of_kind(semconv.KIND_LLM)
    assert span.attributes[semconv.ADAPTER_NAME] == "langchain"
    assert record.transitions is not None
    (transition,) = record.transitions.transitions
    (served,) = agl_harness.server.served
    assert transition.response_token_ids == served.token_ids and transition.final_reward == 1.0


async def test_spans_go_through_the_given_tracer_provider(agl_harness: KitHarness) -> None:
    """``instrument(tracer_provider=...)``, as OpenTelemetry's instrumentors take it: the app's provider (and its
    exporter) gets the spans, and the rollout's store still does."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    adapter = LangChainAdapter.default()
    adapter.uninstrument()
    adapter.instrument(tracer_provider=provider)
    try:
        graph_agent = lambda url, task: build_graph(url).ainvoke({"messages": [HumanMessage(task)]})  # noqa: E731
        record = await agl_harness.collect(await agl_harness.run(graph_agent, "what is 2+3?"))
    finally:
        adapter.uninstrument()
    exported = [span for span in exporter.get_finished_spans() if span.instrumentation_scope is not None]
    assert {span.instrumentation_scope.name for span in exported} == {"agentlightning_langchain"}  # type: ignore[union-attr]
    stored = record.of_kind(semconv.KIND_LLM)
    assert len(stored) == 3
    exported_llm = [s for s in exported if (s.attributes or {}).get(semconv.SPAN_KIND) == semconv.KIND_LLM]
    assert len(exported_llm) == 3


def test_instrument_leaves_the_global_tracer_provider_alone() -> None:
    """An instrumentor never sets the global OpenTelemetry provider (a fresh interpreter tells)."""
    code = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "import agentlightning_langchain\n"
        "agentlightning_langchain.instrument()\n"
        "print(type(trace.get_tracer_provider()).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.strip() == "ProxyTracerProvider", done.stderr
