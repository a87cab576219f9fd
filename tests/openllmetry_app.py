"""An app instrumented with OpenLLMetry the way apps do it, trained by `agentlightning.Runner` with no line of ours.

Run as a script in a fresh interpreter (``Traceloop.init()`` and the global OpenTelemetry provider are set once per
process)::

    python tests/openllmetry_app.py SETUP AGENT [AGENT ...]

SETUP is ``traceloop`` (``Traceloop.init()`` with an exporter the app owns: every installed instrumentation at once)
or instrumentors (``langchain``, ``openai_agents``, ``openai``, joined by ``+``) under the app's own global SDK
provider and exporter. Each AGENT (``langgraph``: a researcher -> tools -> writer -> critic graph; ``agents``: an
Agents SDK triage agent handing off to a math agent with a tool; ``openai``: two plain client calls) runs two
rollouts through the LLM proxy on a scripted model server; the last stdout line is a JSON object: per agent, what
the store's spans make of them and what the app's exporter received. `tests/test_openllmetry_apps.py` reads it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, TypedDict

os.environ["TRACELOOP_TELEMETRY"] = "false"  # no network but loopback
os.environ.pop("OPENAI_API_KEY", None)  # the Agents SDK's own trace export stays off
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
"""The app's own exporter: it must keep receiving the app's spans."""


def _instrumentors() -> dict[str, Any]:
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    return {"langchain": LangchainInstrumentor, "openai": OpenAIInstrumentor, "openai_agents": OpenAIAgentsInstrumentor}


INSTRUMENTORS = _instrumentors()


def set_up(setup: str) -> TracerProvider:
    """Turn the app's tracing on, as the app would; returns the global provider it set."""
    if setup == "traceloop":
        from traceloop.sdk import Traceloop

        Traceloop.init(app_name="app", exporter=EXPORTER, disable_batch=True)
    else:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
        for name in setup.split("+"):  # e.g. "openai_agents+openai": the two Traceloop.init() turns on
            instrumentor: Any = INSTRUMENTORS[name]
            instrumentor().instrument()
    provider: Any = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), provider
    return provider


# ---------------------------------------------------------------------------------------------- the app's agents
import openai  # noqa: E402
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

import agentlightning as agl  # noqa: E402
from agentlightning.testing import ScriptedReply  # noqa: E402


def reward_of(task: str) -> float:
    """Each rollout's own reward (task ``"2 + i?"`` earns ``i + 0.5``), so a mixed-up reward shows."""
    return int(task.split("+")[1].strip(" ?")) + 0.5


@tool
def lookup(city: str) -> str:
    """Look up a fact about a city."""
    return f"{city} has a river."


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph() -> Any:
    """researcher (LLM + tool) -> writer (LLM) -> critic (LLM), as LangGraph's docs write a multi-agent graph."""
    llm = ChatOpenAI(model="toy", base_url=agl.llm_base_url(), api_key="sk-local")
    researcher_llm = llm.bind_tools([lookup])

    async def researcher(state: State) -> dict[str, Any]:
        return {"messages": [await researcher_llm.ainvoke(state["messages"])]}

    async def writer(state: State) -> dict[str, Any]:
        reply = await llm.ainvoke([SystemMessage("writer"), *state["messages"][-1:]])
        return {"messages": [AIMessage(content=reply.content, name="writer")]}

    async def critic(state: State) -> dict[str, Any]:
        reply = await llm.ainvoke([SystemMessage("critic"), HumanMessage(str(state["messages"][-1].content))])
        return {"messages": [AIMessage(content=reply.content, name="critic")]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "writer"

    graph = StateGraph(State)
    graph.add_node("researcher", researcher)
    graph.add_node("writer", writer)
    graph.add_node("critic", critic)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "researcher")
    graph.add_conditional_edges("researcher", route, {"tools": "tools", "writer": "writer"})
    graph.add_edge("tools", "researcher")
    graph.add_edge("writer", "critic")
    graph.add_edge("critic", END)
    return graph.compile()


@agl.rollout
async def langgraph_app(task: str) -> float:
    await build_graph().ainvoke({"messages": [HumanMessage(task)]})
    return reward_of(task)


def langgraph_script(body: dict[str, Any]) -> ScriptedReply:
    messages = body.get("messages") or []
    if messages and messages[0].get("role") == "system":
        return ScriptedReply(content=f"{messages[0]['content']} says ok")
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        return ScriptedReply(tool_calls=[{"name": "lookup", "arguments": {"city": "Paris"}}])
    return ScriptedReply(content="Paris has a river.")


@agl.rollout
async def agents_app(task: str) -> float:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    client = openai.AsyncOpenAI(base_url=agl.llm_base_url(), api_key="sk-local")
    model = OpenAIChatCompletionsModel(model="toy", openai_client=client)
    math = Agent(name="math", instructions="Solve arithmetic with add.", model=model, tools=[add])
    triage = Agent(name="triage", instructions="Hand arithmetic to math.", model=model, handoffs=[math])
    await Runner.run(triage, task)
    return reward_of(task)


def agents_script(body: dict[str, Any]) -> ScriptedReply:
    messages = body.get("messages") or []
    tools = {t["function"]["name"] for t in body.get("tools") or []}
    if "transfer_to_math" in tools:
        return ScriptedReply(tool_calls=[{"name": "transfer_to_math", "arguments": {}}])
    if "add" in tools and not any(m.get("role") == "tool" and m.get("content") == "4" for m in messages):
        return ScriptedReply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 2}}])
    return ScriptedReply(content="4")


@agl.rollout
async def openai_app(task: str) -> float:
    client = openai.AsyncOpenAI(base_url=agl.llm_base_url(), api_key="sk-local")
    first = await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": task}])
    messages: Any = [
        {"role": "user", "content": task},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Sure?"},
    ]
    await client.chat.completions.create(model="toy", messages=messages)
    return reward_of(task)


APPS: dict[str, tuple[Any, Any, str | None]] = {
    "langgraph": (langgraph_app, langgraph_script, "writer"),
    "agents": (agents_app, agents_script, "math"),
    "openai": (openai_app, lambda body: ScriptedReply(content="4"), None),
}
"""agent -> (rollout function, model script, the agent `agent_filter` selects)."""


# ---------------------------------------------------------------------------------------------- the run
async def run_app(name: str) -> dict[str, Any]:
    """Two rollouts of one app under `agl.Runner`; what the store's spans make of them, and what was exported."""
    from agentlightning.proxy import LLMProxy
    from agentlightning.testing import ScriptedModelServer
    from agentlightning.transitions import TransitionConfig, results_from_store

    app, script, selected = APPS[name]
    EXPORTER.clear()
    store = agl.SqliteStore(Path(tempfile.mkdtemp()) / "store.db")
    with ScriptedModelServer(script) as model:
        async with LLMProxy(store, [model.base_url]) as proxy:
            llm = agl.LLMResource(endpoint=proxy.url, model="toy")
            await store.add_resources(agl.Resources(resources_id="v1", items={"llm": llm}))
            rollouts = [await store.enqueue_rollout(f"2 + {i}?") for i in range(2)]
            await agl.Runner(app, store=store, n_workers=2, stop_when_idle=True).arun()
            await proxy.flush()
        served = {c.response_id: c for c in model.served}
    ids = [r.rollout_id for r in rollouts]
    results = await results_from_store(store, ids, TransitionConfig(order_fallback=False, on_missing="raise"))
    chosen = await results_from_store(store, ids, TransitionConfig(order_fallback=False, agent_filter=[selected or ""]))
    out: dict[str, Any] = {"served": len(served), "rollouts": [], "exported": {}}
    for rollout, result, filtered in zip(rollouts, results, chosen, strict=True):
        calls = {c.call_id: c for c in await store.query_llm_calls(rollout.rollout_id)}
        exact = all(
            t.prompt_token_ids == served[calls[t.call_ids[0]].response_id].prompt_token_ids
            and t.response_token_ids == served[calls[t.call_ids[0]].response_id].token_ids
            for t in result.transitions
        )
        out["rollouts"].append(
            {
                "reward": reward_of(str(rollout.input)),
                "calls": len(calls),
                "agents": [t.agent_name for t in result.transitions],
                "call_agents": [c.agent_name for c in sorted(calls.values(), key=lambda c: c.start_time)],
                "final_rewards": [t.final_reward for t in result.transitions],
                "joined_by_response_id": result.diagnostics.joined_by_response_id,
                "attempts_without_reward": result.diagnostics.attempts_without_reward,
                "exact_ids": exact,
                "filtered": [t.agent_name for t in filtered.transitions] if selected else None,
            }
        )
    for span in EXPORTER.get_finished_spans():
        scope = span.instrumentation_scope.name if span.instrumentation_scope else ""
        out["exported"][scope] = out["exported"].get(scope, 0) + 1
    return out


async def main(setup: str, names: list[str]) -> None:
    provider = set_up(setup)
    report: dict[str, Any] = {name: await run_app(name) for name in names}
    report["global_is_the_apps"] = trace.get_tracer_provider() is provider
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
