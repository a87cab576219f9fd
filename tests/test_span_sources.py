"""The app's own GenAI instrumentation as a span source: OpenLLMetry's OpenAI / LangChain / OpenAI Agents
instrumentations and OpenTelemetry's openai-v2, each the real package, driving real agents over HTTP.

For each: an agent instrumented only that way yields one transition per served call with the served token ids and
the agent names the instrumentation records; with our own adapter line added, still one transition per call. The
adapter conformance kit runs against every source too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ClassVar

import openai
import pytest
import wrapt.patches

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # instrument_all imports LiteLLM: no network fetch

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_trace_processors
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from opentelemetry.instrumentation.langchain import LangchainInstrumentor
from opentelemetry.instrumentation.openai import OpenAIInstrumentor as OpenLLMetryOpenAIInstrumentor
from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as OpenAIV2Instrumentor

import agentlightning as agl
from agentlightning import semconv
from agentlightning.adapters import (
    Adapter,
    OpenAIAdapter,
    OpenAIV2Source,
    OpenLLMetryAgentsSource,
    OpenLLMetryLangChainSource,
    OpenLLMetryOpenAISource,
    SpanSource,
    active_sources,
    use_active_sources,
)
from agentlightning.testing import AdapterConformanceTests, KitHarness, RunRecord, ScriptedReply
from agentlightning_langchain import LangChainAdapter
from agentlightning_openai_agents import OpenAIAgentsAdapter

AgentFn = Callable[[str, str], Awaitable[Any]]


_MISSING = object()


@contextlib.contextmanager
def app_instrumentation(instrumentor: Any) -> Iterator[None]:
    """The app's own instrumentation line (``Instrumentor().instrument()``), fully undone afterwards.

    Their ``uninstrument()`` leaves things behind in these versions: opentelemetry-instrumentation-openai and
    -langchain 0.62.4 name dotted attributes (``"AsyncCompletions.create"``) to ``unwrap``, which
    opentelemetry-instrumentation 0.66b2 does not resolve, so their wrappers stay; -openai-agents 0.62.4 leaves its
    trace processor registered. A second ``instrument()`` would then record every call twice. An app instruments
    once; these tests instrument per test, so every attribute the instrumentor patched (through wrapt) is put back,
    and the Agents SDK's trace processors are cleared (our Agents SDK adapter re-registers its own).
    """
    patched: list[tuple[Any, str, Any]] = []
    apply_patch = wrapt.patches.apply_patch

    def recording(parent: Any, attribute: str, replacement: Any) -> Any:
        patched.append((parent, attribute, vars(parent).get(attribute, _MISSING)))
        return apply_patch(parent, attribute, replacement)

    wrapt.patches.apply_patch = recording
    try:
        instrumentor().instrument()
    finally:
        wrapt.patches.apply_patch = apply_patch
    try:
        yield
    finally:
        instrumentor().uninstrument()
        for parent, attribute, prior in reversed(patched):
            if prior is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(parent, attribute)
            else:
                setattr(parent, attribute, prior)
        set_trace_processors([])


def script(body: dict[str, Any]) -> ScriptedReply:
    """Call the `add` tool once per conversation, then answer (echoing the task, as the kit expects)."""
    messages: list[dict[str, Any]] = body.get("messages") or []
    task = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        return ScriptedReply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}}])
    return ScriptedReply(content=f"The answer is 5. [{task}]")


async def openai_agent(base_url: str, task: str) -> str:
    """A plain OpenAI client agent: one call, then a second turn (no framework, so no agent name)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="t")
    messages: list[Any] = [{"role": "user", "content": task}]
    first = await client.chat.completions.create(model="toy", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": task}]
    second = await client.chat.completions.create(model="toy", messages=messages)
    return str(second.choices[0].message.content)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def langgraph_agent(base_url: str, task: str) -> Any:
    """A LangGraph ReAct agent named `calc`: tool call, then answer."""
    graph = create_react_agent(ChatOpenAI(base_url=base_url, api_key="t", model="toy"), [add], name="calc")
    return await graph.ainvoke({"messages": [("user", task)]})


@function_tool
def add_numbers(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _agents_script(body: dict[str, Any]) -> ScriptedReply:
    reply = script(body)
    if reply.tool_calls:
        return ScriptedReply(tool_calls=[{"name": "add_numbers", "arguments": {"a": 2, "b": 3}}])
    return reply


async def agents_sdk_agent(base_url: str, task: str) -> Any:
    """An OpenAI Agents SDK agent named `calc` on a chat-completions model: tool call, then answer."""
    model = OpenAIChatCompletionsModel(model="toy", openai_client=openai.AsyncOpenAI(base_url=base_url, api_key="t"))
    agent = Agent(name="calc", instructions="Add.", model=model, tools=[add_numbers])
    return (await Runner.run(agent, task)).final_output


# (source, their instrumentor, agent, script, agent name the instrumentation records, our adapter for those calls,
#  agent name our adapter records). In a LangGraph graph the node is the agent, either way: the ReAct graph's `agent`.
CASES: dict[str, tuple[type[SpanSource], Any, AgentFn, Any, str | None, Callable[[], Adapter], str | None]] = {
    "openllmetry_openai": (
        OpenLLMetryOpenAISource, OpenLLMetryOpenAIInstrumentor, openai_agent, script, None, OpenAIAdapter.default, None
    ),
    "openllmetry_langchain": (
        OpenLLMetryLangChainSource, LangchainInstrumentor, langgraph_agent, script, "agent", LangChainAdapter.default,
        "agent",
    ),
    "openllmetry_openai_agents": (
        OpenLLMetryAgentsSource, OpenAIAgentsInstrumentor, agents_sdk_agent, _agents_script, "calc",
        OpenAIAgentsAdapter.default, "calc",
    ),
    "otel_openai_v2": (
        OpenAIV2Source, OpenAIV2Instrumentor, openai_agent, script, None, OpenAIAdapter.default, None
    ),
}  # fmt: skip


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> Iterator[str]:
    """The app turns its instrumentation on (their own line); undone after the test."""
    source, instrumentor, *_ = CASES[request.param]
    with app_instrumentation(instrumentor):
        try:
            yield request.param
        finally:
            agl.uninstrument_all()
            source.default().uninstrument()


def assert_one_transition_per_call(harness: KitHarness, record: RunRecord, agent_name: str | None) -> None:
    """One transition per served call, joined by response id, with exactly the served token ids."""
    result = record.transitions
    assert result is not None and record.calls
    assert len(record.calls) == len(harness.server.served)
    assert len(result.transitions) == len(record.calls), result.problems
    assert result.diagnostics.joined_by_response_id == len(record.calls)
    served = {c.response_id: c for c in harness.server.served}
    by_call = {c.call_id: c for c in record.calls}
    assert len({t.call_ids[0] for t in result.transitions}) == len(record.calls)
    for transition in result.transitions:
        sent = served[by_call[transition.call_ids[0]].response_id]
        assert transition.prompt_token_ids == sent.prompt_token_ids
        assert transition.response_token_ids == sent.token_ids
        assert transition.agent_name == agent_name


async def test_instrumented_only_their_way(case: str, agl_harness: KitHarness) -> None:
    """No line of ours: the runner's `use_active_sources()` reads their spans; one transition per call."""
    source, _, agent, answers, agent_name, _, _ = CASES[case]
    agl_harness.server.set_script(answers)
    assert source in active_sources()
    assert use_active_sources() == [case]
    record = await agl_harness.collect(await agl_harness.run(agent, "add 2 and 3"))
    assert_one_transition_per_call(agl_harness, record, agent_name)
    llm = record.of_kind(semconv.KIND_LLM)
    assert len(llm) == len(record.calls)
    assert {s.attributes.get(semconv.SPAN_SOURCE) for s in llm} == {case}


@agl.rollout
async def calc_rollout(task: str) -> float:
    """An ordinary LangGraph app as a rollout: nothing of ours but the proxy URL."""
    await langgraph_agent(agl.llm_base_url(), task)
    return 1.0


async def test_runner_trains_an_app_instrumented_with_openllmetry(tmp_path: Any) -> None:
    """A real `agl.Runner` over a SQLite store and the proxy: the app's OpenLLMetry LangChain instrumentation is the
    only instrumentation (no line of ours), and every served call becomes one transition with its token ids."""
    from agentlightning.proxy import LLMProxy
    from agentlightning.testing import ScriptedModelServer
    from agentlightning.transitions import TransitionConfig, results_from_store

    store = agl.SqliteStore(tmp_path / "store.db")
    with app_instrumentation(LangchainInstrumentor), ScriptedModelServer(script) as model:
        try:
            async with LLMProxy(store, [model.base_url]) as proxy:
                llm = agl.LLMResource(endpoint=proxy.url, model="toy")
                await store.add_resources(agl.Resources(resources_id="v1", items={"llm": llm}))
                rollouts = [await store.enqueue_rollout(f"add {i} and 3") for i in range(2)]
                await agl.Runner(calc_rollout, store=store, n_workers=2, stop_when_idle=True).arun()
                await proxy.flush()
        finally:
            OpenLLMetryLangChainSource.default().uninstrument()
        served = {c.response_id: c for c in model.served}
    config = TransitionConfig(order_fallback=False, on_missing="raise")
    results = await results_from_store(store, [r.rollout_id for r in rollouts], config)
    assert sum(len(r.transitions) for r in results) == len(served) == 4
    for result in results:
        assert result.diagnostics.joined_by_response_id == len(result.transitions) == 2
        assert {t.agent_name for t in result.transitions} == {"agent"} and result.final_reward == 1.0
    calls = {c.call_id: c for r in rollouts for c in await store.query_llm_calls(r.rollout_id)}
    for result in results:
        for transition in result.transitions:
            sent = served[calls[transition.call_ids[0]].response_id]
            assert transition.prompt_token_ids == sent.prompt_token_ids
            assert transition.response_token_ids == sent.token_ids


async def test_instrument_all_adds_no_second_hook(case: str, agl_harness: KitHarness) -> None:
    """`instrument_all()` uses the source and skips our adapter for the same calls: one span per call."""
    _, _, agent, answers, agent_name, ours, _ = CASES[case]
    agl_harness.server.set_script(answers)
    names = agl.instrument_all(low_level=True)
    assert case in names and ours().NAME not in names and not ours().instrumented
    record = await agl_harness.collect(await agl_harness.run(agent, "add 2 and 3"))
    assert_one_transition_per_call(agl_harness, record, agent_name)
    assert len(record.of_kind(semconv.KIND_LLM)) == len(record.calls)
    assert record.transitions is not None and record.transitions.diagnostics.duplicate_spans == 0


async def test_our_adapter_line_added_too(case: str, agl_harness: KitHarness) -> None:
    """Their instrumentation and our adapter line: ours wins, still one transition (and LLM span) per call."""
    _, _, agent, answers, _, ours, our_agent_name = CASES[case]
    agl_harness.server.set_script(answers)
    use_active_sources()
    with agl_harness.instrumented(ours()):
        record = await agl_harness.collect(await agl_harness.run(agent, "add 2 and 3"))
    assert_one_transition_per_call(agl_harness, record, our_agent_name)
    llm = record.of_kind(semconv.KIND_LLM)
    assert len(llm) == len(record.calls)
    assert {s.attributes.get(semconv.ADAPTER_NAME) for s in llm} == {ours().NAME}


@pytest.fixture
def openllmetry_openai() -> Iterator[None]:
    with app_instrumentation(OpenLLMetryOpenAIInstrumentor):
        try:
            yield
        finally:
            OpenLLMetryOpenAISource.default().uninstrument()


async def test_client_source_under_our_framework_adapter(openllmetry_openai: None, agl_harness: KitHarness) -> None:
    """Their client spans inside our LangChain adapter's LLM spans record the same calls: ours are kept, theirs
    counted as duplicates, agent names from ours (the LangGraph node)."""
    agl_harness.server.set_script(script)
    use_active_sources()
    with agl_harness.instrumented(LangChainAdapter.default()):
        record = await agl_harness.collect(await agl_harness.run(langgraph_agent, "add 2 and 3"))
    assert_one_transition_per_call(agl_harness, record, "agent")
    assert record.transitions is not None
    assert record.transitions.diagnostics.duplicate_spans == len(record.calls)


def test_out_of_range_source_is_not_used(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed source outside its range is not read; the warning names the version and the range."""
    monkeypatch.setattr(OpenLLMetryOpenAISource, "installed_version", classmethod(lambda cls: "0.40.1"))
    with app_instrumentation(OpenLLMetryOpenAIInstrumentor), caplog.at_level("WARNING"):
        assert "openllmetry_openai" not in use_active_sources()
    assert "0.40.1" in caplog.text and OpenLLMetryOpenAISource.SUPPORTED_RANGE in caplog.text
    assert not OpenLLMetryOpenAISource.default().instrumented


def test_ranges_match_the_dev_group() -> None:
    """Each source's supported range is the one the root pyproject's dev group installs and tests."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as f:
        group = [Requirement(r) for r in tomllib.load(f)["dependency-groups"]["dev"]]
    declared = {r.name: r.specifier for r in group}
    for source in (OpenLLMetryOpenAISource, OpenLLMetryLangChainSource, OpenLLMetryAgentsSource, OpenAIV2Source):
        assert declared[source.FRAMEWORK] == type(declared[source.FRAMEWORK])(source.SUPPORTED_RANGE)
        assert source.check_version() == source.installed_version()


# ---------------------------------------------------------------------- the conformance kit, per source
class _SourceKit(AdapterConformanceTests):
    """The kit against a span source; their instrumentor is on for every test (the app's own line)."""

    source: ClassVar[type[SpanSource]]
    instrumentor: ClassVar[Any]
    concurrency = 4

    @pytest.fixture(autouse=True)
    def their_instrumentation(self) -> Iterator[None]:
        with app_instrumentation(self.instrumentor):
            yield

    @pytest.fixture
    def adapter(self) -> Adapter:
        return self.source.default()


class TestOpenLLMetryOpenAIKit(_SourceKit):
    """A client-level instrumentation records neither agents nor tools: those kit checks do not apply."""

    source = OpenLLMetryOpenAISource
    instrumentor = OpenLLMetryOpenAIInstrumentor
    supports_tools = False
    supports_agent_spans = False

    @pytest.fixture
    def agent(self) -> AgentFn:
        return openai_agent


class TestOpenAIV2Kit(TestOpenLLMetryOpenAIKit):
    source = OpenAIV2Source
    instrumentor = OpenAIV2Instrumentor


class TestOpenLLMetryLangChainKit(_SourceKit):
    source = OpenLLMetryLangChainSource
    instrumentor = LangchainInstrumentor

    @pytest.fixture
    def agent(self) -> AgentFn:
        return langgraph_agent


class TestOpenLLMetryAgentsKit(_SourceKit):
    source = OpenLLMetryAgentsSource
    instrumentor = OpenAIAgentsInstrumentor
    tool_name = "add_numbers"

    @pytest.fixture
    def agent(self) -> AgentFn:
        return agents_sdk_agent
