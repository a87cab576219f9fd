"""The AutoGen adapter passes the conformance kit: an AssistantAgent with a tool inside a RoundRobinGroupChat.

Nothing here sets the global OpenTelemetry provider (AutoGen's spans go there): the one ``instrument()`` line is
enough, and the rollout's start routes that provider (`agentlightning.tracing.when_global_provider`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
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
    """An instrumentor never sets the global OpenTelemetry provider (a fresh interpreter tells), and does not warn:
    the first rollout routes it."""
    code = (
        "from opentelemetry import trace\n"
        "import agentlightning_autogen\n"
        "agentlightning_autogen.instrument()\n"
        "print(type(trace.get_tracer_provider()).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.strip() == "ProxyTracerProvider", done.stderr
    assert "WARNING" not in done.stderr and "none is set" not in done.stderr, done.stderr


# An ordinary AutoGen team (solver + reviewer, round robin) under agl.Runner, in a fresh interpreter (the global
# OpenTelemetry provider can be set once per process): the app's one line, and, in some cases, its own provider.
_TEAM_APP = """
import asyncio, json, sys, tempfile
from pathlib import Path

import agentlightning_autogen
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agentlightning as agl
from agentlightning.proxy import LLMProxy
from agentlightning.testing import ScriptedModelServer
from agentlightning.transitions import TransitionConfig, results_from_store

app_provider, worker_mode = sys.argv[1], sys.argv[2]
exporter = InMemorySpanExporter()
if app_provider != "none":  # the application's own tracing, with its own exporter
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
if app_provider == "before":
    trace.set_tracer_provider(provider)
agentlightning_autogen.instrument()  # the one line
if app_provider == "after":
    trace.set_tracer_provider(provider)

MODEL_INFO = {"vision": False, "function_calling": False, "json_output": False, "family": "unknown",
              "structured_output": False}


@agl.rollout
async def team(task: str) -> float:
    client = OpenAIChatCompletionClient(model="toy", base_url=agl.llm_base_url(), api_key="sk-local",
                                        model_info=MODEL_INFO)
    solver = AssistantAgent("solver", model_client=client, system_message="Solve the task.")
    reviewer = AssistantAgent("reviewer", model_client=client, system_message="Review the answer.")
    result = await RoundRobinGroupChat([solver, reviewer], max_turns=4).run(task=task)
    await client.close()
    return 1.0 if result.messages else 0.0


async def main() -> None:
    store = agl.SqliteStore(Path(tempfile.mkdtemp()) / "store.db")
    with ScriptedModelServer(lambda body: "5") as model:
        async with LLMProxy(store, [model.base_url]) as proxy:
            await store.add_resources(agl.Resources(resources_id="v1",
                                                    items={"llm": agl.LLMResource(endpoint=proxy.url, model="toy")}))
            rollouts = [await store.enqueue_rollout(f"2 + {i}?") for i in range(2)]
            await agl.Runner(team, store=store, n_workers=2, worker_mode=worker_mode, stop_when_idle=True).arun()
            await proxy.flush()
        served = len(model.served)
    ids = [r.rollout_id for r in rollouts]
    config = TransitionConfig(order_fallback=False, on_missing="raise")
    results = await results_from_store(store, ids, config)
    reviewer = await results_from_store(store, ids, TransitionConfig(order_fallback=False, agent_filter=["reviewer"]))
    print(json.dumps({
        "served": served,
        "agents": [[t.agent_name for t in r.transitions] for r in results],
        "rewards": [[t.final_reward for t in r.transitions] for r in results],
        "joined": [r.diagnostics.joined_by_response_id for r in results],
        "reviewer": [[t.agent_name for t in r.transitions] for r in reviewer],
        "exported": sorted({s.name for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")}),
        "global_is_app": app_provider != "none" and trace.get_tracer_provider() is provider,
        "global_is_ours": trace.get_tracer_provider() is agl.tracing.get_tracer_provider(),
    }))


asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("app_provider", "worker_mode"), [("none", "async"), ("none", "thread"), ("before", "async"), ("after", "thread")]
)
def test_team_agent_names_with_only_the_one_line(app_provider: str, worker_mode: str) -> None:
    """The one ``instrument()`` line and `agentlightning.Runner`: every call of a solver + reviewer team is a
    transition named after its agent, with the rollout's reward, and ``agent_filter`` picks the reviewer's calls.
    With no global provider the runner routes one in; an application's own provider (set before or after the line)
    stays the global one and its exporter still gets AutoGen's spans."""
    done = subprocess.run(
        [sys.executable, "-c", _TEAM_APP, app_provider, worker_mode],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "none is set" not in done.stderr, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["served"] == 8
    assert out["agents"] == [["solver", "reviewer", "solver", "reviewer"]] * 2
    assert out["rewards"] == [[1.0] * 4] * 2 and out["joined"] == [4, 4]
    assert out["reviewer"] == [["reviewer", "reviewer"]] * 2
    if app_provider == "none":
        assert out["global_is_ours"]  # the runner routed the global provider (ours) into rollouts
    else:
        assert out["global_is_app"], out  # never replaced
        assert out["exported"] == ["invoke_agent reviewer", "invoke_agent solver"]


_TEAM_MODULE = """
import agentlightning_autogen
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agentlightning as agl

agentlightning_autogen.instrument()  # the one line

MODEL_INFO = {"vision": False, "function_calling": False, "json_output": False, "family": "unknown",
              "structured_output": False}


@agl.rollout
async def team(task: str) -> float:
    client = OpenAIChatCompletionClient(model="toy", base_url=agl.llm_base_url(), api_key="sk-local",
                                        model_info=MODEL_INFO)
    solver = AssistantAgent("solver", model_client=client, system_message="Solve the task.")
    reviewer = AssistantAgent("reviewer", model_client=client, system_message="Review the answer.")
    await RoundRobinGroupChat([solver, reviewer], max_turns=2).run(task=task)
    await client.close()
    return 1.0
"""


async def test_team_agent_names_under_agl_runner(tmp_path: Path) -> None:
    """``agl runner`` (a process of its own) runs the team whose module has the one line: agent names stored."""
    import asyncio
    import signal

    import agentlightning as agl
    from agentlightning.proxy import LLMProxy
    from agentlightning.testing import ScriptedModelServer
    from agentlightning.transitions import TransitionConfig, results_from_store

    (tmp_path / "team_app.py").write_text(_TEAM_MODULE)
    store = agl.SqliteStore(tmp_path / "s.db")
    with ScriptedModelServer(lambda body: "5") as model:
        async with LLMProxy(store, [model.base_url]) as proxy:
            llm = agl.LLMResource(endpoint=proxy.url, model="toy")
            await store.add_resources(agl.Resources(resources_id="v1", items={"llm": llm}))
            ids = [(await store.enqueue_rollout(f"2 + {i}?")).rollout_id for i in range(2)]
            command = [sys.executable, "-m", "agentlightning.cli", "runner", "--db", str(tmp_path / "s.db")]
            command += ["--app-dir", str(tmp_path), "--agent", "team_app:team", "--poll-interval", "0.05"]
            runner = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
            try:
                while (await store.stats()).rollouts.get("succeeded", 0) < 2:  # waits on the event, not a clock
                    assert runner.poll() is None, runner.communicate()[1][-4000:]
                    await asyncio.sleep(0.1)
            finally:
                runner.send_signal(signal.SIGTERM)
                _, stderr = runner.communicate(timeout=120)
            await proxy.flush()
    assert "none is set" not in stderr, stderr[-4000:]
    results = await results_from_store(store, ids, TransitionConfig(order_fallback=False, on_missing="raise"))
    assert [[t.agent_name for t in r.transitions] for r in results] == [["solver", "reviewer"]] * 2
    assert [[t.final_reward for t in r.transitions] for r in results] == [[1.0, 1.0]] * 2
