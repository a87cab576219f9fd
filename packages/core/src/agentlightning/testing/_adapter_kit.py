"""`AdapterConformanceTests`: the shared pytest suite every framework adapter passes.

A package subclasses the suite and supplies two fixtures; the kit starts a real `ScriptedModelServer`, a real
`LLMProxy` in front of it and a `MemoryStore`, runs the framework's agent inside rollout contexts with the
per-rollout proxy URL, and checks spans, the trace tree, transitions, rewards and isolation::

    class TestMyAdapter(AdapterConformanceTests):
        @pytest.fixture
        def adapter(self):
            return MyAdapter.default()

        @pytest.fixture
        def agent(self):
            async def run(base_url: str, task: str) -> str:
                ...  # build the framework's agent against base_url and run it on task
            return run

The default script answers every request with one call of ``tool_name`` (with ``tool_arguments``) until a tool
result is in the conversation, then with a final answer; override `script` for agents that need more.
Capability flags (``supports_tools``, ``supports_streaming``, ``supports_agent_spans``) skip what does not
apply. pytest is imported only here, so importing ``agentlightning.testing`` does not need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from agentlightning import semconv
from agentlightning._models import LLMCall, Span
from agentlightning._training_models import Transition
from agentlightning.adapters import Adapter, UnsupportedVersionError
from agentlightning.proxy import LLMProxy
from agentlightning.proxy._responses_answer import responses_id
from agentlightning.store import MemoryStore
from agentlightning.testing._guard import KitGuard
from agentlightning.testing._model_answers import ServedCall
from agentlightning.testing._model_server import ScriptedModelServer, ScriptedReply
from agentlightning.tracing import aflush, emit_reward, rollout_context
from agentlightning.transitions import TransitionBuilder, TransitionConfig, TransitionResult

__all__ = ["AdapterConformanceTests", "KitHarness", "RunRecord"]

AgentFn = Callable[[str, str], Awaitable[Any]]


@dataclass
class RunRecord:
    """What one rollout left behind."""

    rollout_id: str
    attempt_id: str
    task: str
    result: Any
    spans: list[Span] = field(default_factory=list[Span])
    calls: list[LLMCall] = field(default_factory=list[LLMCall])
    transitions: TransitionResult | None = None

    def of_kind(self, kind: str) -> list[Span]:
        """Spans of one ``agentlightning.span.kind``."""
        return [s for s in self.spans if s.attributes.get(semconv.SPAN_KIND) == kind]


class KitHarness:
    """Model server + proxy + store; runs an agent inside rollout contexts (the ``agl_harness`` fixture).

    Args:
        server: The scripted model server the proxy forwards to.
        proxy: The running proxy; agents get its per-rollout base URL.
        store: Where rollouts, spans and the proxy's calls go.
        adapters: Adapters whose late-reported calls `collect` waits for (see `instrumented`).
    """

    def __init__(self, server: ScriptedModelServer, proxy: LLMProxy, store: MemoryStore, *adapters: Adapter) -> None:
        self.server = server
        self.proxy = proxy
        self.store = store
        self.adapters: list[Adapter] = list(adapters)

    @contextlib.contextmanager
    def instrumented(self, *adapters: Adapter) -> Generator[KitHarness]:
        """Instrument ``adapters`` for a ``with`` block (uninstrumented after it, in reverse order)."""
        done: list[Adapter] = []
        try:
            for adapter in adapters:
                adapter.instrument()
                done.append(adapter)
                self.adapters.append(adapter)
            yield self
        finally:
            for adapter in reversed(done):
                adapter.uninstrument()
                self.adapters.remove(adapter)

    async def run(self, agent: AgentFn, task: str, *, reward: float | None = 1.0, stream: bool = False) -> RunRecord:
        """Run ``agent`` on ``task`` in a fresh rollout; emit ``reward`` as the final reward inside it."""
        rollout = await self.store.enqueue_rollout(input=task)
        claim = await self.store.dequeue_rollout("kit")
        assert claim is not None, f"rollout {rollout.rollout_id} was queued but nothing could be dequeued"
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        base_url = self.proxy.base_url(rid, aid)
        with rollout_context(self.store, rid, aid, input=claim.rollout.input):
            result = await agent(base_url, str(claim.rollout.input))
            if reward is not None:
                emit_reward(reward, final=True)
        return RunRecord(rid, aid, str(claim.rollout.input), result)

    async def collect(self, record: RunRecord, config: TransitionConfig | None = None) -> RunRecord:
        """Flush spans and proxy records, read them back and build transitions (response-id joins only)."""
        for adapter in self.adapters:
            assert await adapter.adrain(), f"{adapter.NAME}: calls still unreported after 5 s"
        await aflush()
        await self.proxy.flush()
        record.spans = await self.store.query_spans(record.rollout_id, record.attempt_id)
        record.calls = await self.store.query_llm_calls(record.rollout_id, record.attempt_id)
        builder = TransitionBuilder(config or TransitionConfig(order_fallback=False, on_missing="raise"))
        record.transitions = builder.build(record.spans, record.calls)
        return record


def _served(harness: KitHarness) -> dict[str | None, ServedCall]:
    """The model server's answers by response id: the chat id, and the id of the Responses answer the proxy made of
    it (an agent on the Responses API is served through chat completions: `responses_id`)."""
    served: dict[str | None, ServedCall] = {}
    for call in harness.server.served:
        served[call.response_id] = call
        if call.response_id is not None:
            served[responses_id(call.response_id)] = call
    return served


class AdapterConformanceTests(KitGuard):
    """Checks every adapter must pass; subclass it and provide the ``adapter`` and ``agent`` fixtures.

    Attributes:
        supports_tools: The agent calls a tool (checked: a tool span under an agent span).
        supports_streaming: The agent can stream (the ``agent`` fixture is then also run with ``stream=True``
            through ``agent_streaming``).
        supports_agent_spans: The framework has agents (checked: every LLM span has an enclosing agent span).
        names_agents_live: Each call's agent header names its agent (checked): its agent spans carry
            ``gen_ai.agent.name`` when they start, or a span source names the agent on its live LLM spans
            (`agentlightning.adapters.SpanSource.AGENT_ATTRIBUTE`). Without either, calls go to the default policy,
            counted by the proxy.
        tool_name: Name of the tool the default script calls.
        tool_arguments: Its arguments.
        final_answer: The default script's final answer.
        concurrency: Rollouts run at once in the isolation test.
    """

    supports_tools: ClassVar[bool] = True
    supports_streaming: ClassVar[bool] = False
    supports_agent_spans: ClassVar[bool] = True
    names_agents_live: ClassVar[bool] = True
    tool_name: ClassVar[str] = "add"
    tool_arguments: ClassVar[dict[str, Any]] = {"a": 2, "b": 3}
    final_answer: ClassVar[str] = "The answer is 5."
    concurrency: ClassVar[int] = 16

    # ------------------------------------------------------------------ hooks for subclasses
    @pytest.fixture
    def adapter(self) -> Adapter:
        """The adapter under test (usually ``MyAdapter.default()``)."""
        raise NotImplementedError("subclass AdapterConformanceTests and provide an `adapter` fixture")

    @pytest.fixture
    def agent(self) -> AgentFn:
        """``async (base_url, task) -> result`` running the framework's agent against ``base_url``."""
        raise NotImplementedError("subclass AdapterConformanceTests and provide an `agent` fixture")

    @pytest.fixture
    def agent_streaming(self) -> AgentFn:
        """Like ``agent`` but streaming the model's replies (only with ``supports_streaming``)."""
        pytest.skip("the adapter's suite has no streaming agent")

    def script(self, body: dict[str, Any]) -> ScriptedReply:
        """The scripted model: call the tool once per conversation, then answer (tag echoes the task)."""
        messages: list[dict[str, Any]] = body.get("messages") or []
        task = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        if self.supports_tools and body.get("tools") and not any(m.get("role") == "tool" for m in messages):
            return ScriptedReply(tool_calls=[{"name": self.tool_name, "arguments": dict(self.tool_arguments)}])
        return ScriptedReply(content=f"{self.final_answer} [{task}]")

    # ------------------------------------------------------------------ harness (the core's pytest plugin)
    @pytest.fixture
    def agl_script(self) -> Callable[[dict[str, Any]], ScriptedReply]:
        """The plugin's model server answers with `script`."""
        return self.script

    @pytest.fixture
    def harness(self, agl_harness: KitHarness, adapter: Adapter) -> Iterator[KitHarness]:
        """The plugin's ``agl_harness`` with the adapter instrumented for the test and uninstrumented after."""
        with agl_harness.instrumented(adapter):
            yield agl_harness

    # ------------------------------------------------------------------ checks
    async def test_spans_are_valid(self, harness: KitHarness, agent: AgentFn, adapter: Adapter) -> None:
        """Every stored span re-validates as a `Span`, carries the rollout ids, and some carry this adapter."""
        record = await harness.collect(await harness.run(agent, "task-valid"))
        assert record.spans, "the agent run left no spans"
        for span in record.spans:
            Span.model_validate(span.model_dump())
            assert span.attributes.get(semconv.ROLLOUT_ID) == record.rollout_id
            assert span.attributes.get(semconv.ATTEMPT_ID) == record.attempt_id
        names = {str(s.attributes.get(semconv.ADAPTER_NAME)) for s in record.spans}
        assert adapter.NAME in names, f"no span has {semconv.ADAPTER_NAME}={adapter.NAME!r}; found {names}"

    async def test_llm_spans_carry_response_ids(self, harness: KitHarness, agent: AgentFn) -> None:
        """Every LLM span carries the response id of a call the model server actually answered."""
        record = await harness.collect(await harness.run(agent, "task-ids"))
        llm = record.of_kind(semconv.KIND_LLM)
        assert llm, "no span of kind 'llm'"
        served = set(_served(harness))
        for span in llm:
            response_id = span.attributes.get(semconv.GEN_AI_RESPONSE_ID)
            assert response_id in served, f"LLM span {span.name!r} has response id {response_id!r}, not served"

    async def test_trace_tree(self, harness: KitHarness, agent: AgentFn) -> None:
        """Parents exist; LLM and tool spans sit under an agent span; tools are not under LLM spans."""
        record = await harness.collect(await harness.run(agent, "task-tree"))
        by_id = {s.span_id: s for s in record.spans}
        for span in record.spans:
            if span.parent_id is not None:
                assert span.parent_id in by_id, f"span {span.name!r} has a parent that is not in the trace"

        def ancestors(span: Span) -> list[Span]:
            out: list[Span] = []
            while span.parent_id is not None and span.parent_id in by_id:
                span = by_id[span.parent_id]
                out.append(span)
            return out

        def kinds(spans: list[Span]) -> list[Any]:
            return [s.attributes.get(semconv.SPAN_KIND) for s in spans]

        if self.supports_agent_spans:
            for span in record.of_kind(semconv.KIND_LLM):
                assert semconv.KIND_AGENT in kinds(ancestors(span)), f"LLM span {span.name!r} has no agent ancestor"
        if self.supports_tools:
            tools = record.of_kind(semconv.KIND_TOOL)
            assert tools, "the agent called a tool but no span of kind 'tool' was recorded"
            for span in tools:
                up = kinds(ancestors(span))
                assert semconv.KIND_LLM not in up, f"tool span {span.name!r} sits under an LLM span"
                if self.supports_agent_spans:
                    assert semconv.KIND_AGENT in up, f"tool span {span.name!r} has no agent ancestor"
                assert span.attributes.get(semconv.GEN_AI_TOOL_NAME), "tool span without gen_ai.tool.name"

    async def test_one_transition_per_llm_call(self, harness: KitHarness, agent: AgentFn) -> None:
        """One transition per proxy call, joined by response id, with exactly the token ids the server sent."""
        record = await harness.collect(await harness.run(agent, "task-transitions"))
        result = record.transitions
        assert result is not None
        assert record.calls, "the proxy recorded no call: did the agent use the base URL it was given?"
        llm = record.of_kind(semconv.KIND_LLM)
        assert len(llm) == len(record.calls), (
            f"{len(llm)} LLM spans ({[s.name for s in llm]}) but {len(record.calls)} proxy calls"
        )
        assert len(result.transitions) == len(record.calls)
        assert result.diagnostics.joined_by_response_id == len(record.calls)
        served = _served(harness)
        by_call = {c.call_id: c for c in record.calls}
        for transition in result.transitions:
            (call_id,) = transition.call_ids
            sent = served[by_call[call_id].response_id]
            assert transition.prompt_token_ids == sent.prompt_token_ids
            assert transition.response_token_ids == sent.token_ids

    async def test_calls_name_their_agent(self, harness: KitHarness, agent: AgentFn) -> None:
        """Each call reaches the proxy naming the agent that made it (the header the proxy routes policies by).

        The name the proxy recorded is the name of the call's nearest agent span, as its transition says: no agent
        code passes it.
        """
        if not self.supports_agent_spans:
            pytest.skip("the framework has no agents")
        if not self.names_agents_live:
            pytest.skip("its agent spans name the agent only in other attributes: calls go to the default policy")
        record = await harness.collect(await harness.run(agent, "task-agent-header"))
        assert record.transitions is not None and record.calls
        by_call = {c.call_id: c for c in record.calls}
        for transition in record.transitions.transitions:
            (call_id,) = transition.call_ids
            assert transition.agent_name, "a transition without an agent name"
            assert by_call[call_id].agent_name == transition.agent_name, (
                f"call {call_id} reached the proxy naming agent {by_call[call_id].agent_name!r}, "
                f"but it runs under agent {transition.agent_name!r}"
            )

    async def test_streaming_transitions(self, harness: KitHarness, agent_streaming: AgentFn) -> None:
        """A streaming agent still yields one transition per call with the served token ids."""
        if not self.supports_streaming:
            pytest.skip("adapter does not support streaming")
        record = await harness.collect(await harness.run(agent_streaming, "task-stream"))
        assert record.transitions is not None
        assert len(record.transitions.transitions) == len(record.calls) > 0
        served = _served(harness)
        for call in record.calls:
            assert served[call.response_id].token_ids == call.response_token_ids

    async def test_rewards_attached(self, harness: KitHarness, agent: AgentFn) -> None:
        """The final reward emitted inside the rollout reaches every transition."""
        record = await harness.collect(await harness.run(agent, "task-reward", reward=0.75))
        assert record.transitions is not None
        assert record.transitions.transitions
        assert all(t.final_reward == 0.75 for t in record.transitions.transitions)

    async def test_concurrent_rollouts_never_mix(self, harness: KitHarness, agent: AgentFn) -> None:
        """Rollouts run at once keep their own spans, calls and transitions (tasks are echoed by the model)."""
        tasks = [f"task-{i:02d}" for i in range(self.concurrency)]
        records = await asyncio.gather(*(harness.run(agent, t, reward=float(i)) for i, t in enumerate(tasks)))
        seen_spans: set[str] = set()
        for i, record in enumerate(records):
            await harness.collect(record)
            assert record.transitions is not None
            transitions: list[Transition] = record.transitions.transitions
            assert transitions and len(transitions) == len(record.calls)
            for call in record.calls:
                body = json.dumps(call.request)
                assert record.task in body
                assert all(other not in body for other in tasks if other != record.task)
            assert all(t.final_reward == float(i) for t in transitions)
            ids = {s.span_id for s in record.spans}
            assert not ids & seen_spans
            seen_spans |= ids

    async def test_instrument_twice_is_harmless(self, harness: KitHarness, agent: AgentFn, adapter: Adapter) -> None:
        """A second instrument() adds no second set of spans."""
        adapter.instrument()
        record = await harness.collect(await harness.run(agent, "task-twice"))
        assert len(record.of_kind(semconv.KIND_LLM)) == len(record.calls)
        assert record.transitions is not None and len(record.transitions.transitions) == len(record.calls)

    async def test_nothing_after_uninstrument(self, harness: KitHarness, agent: AgentFn, adapter: Adapter) -> None:
        """After uninstrument() the agent still runs, and no adapter span (or LLM/agent/tool span) is stored."""
        adapter.uninstrument()
        adapter.uninstrument()
        record = await harness.collect(
            await harness.run(agent, "task-off", reward=None), TransitionConfig(on_missing="skip")
        )
        assert record.calls, "the agent did not run"
        emitted = [
            s
            for s in record.spans
            if s.attributes.get(semconv.ADAPTER_NAME) == adapter.NAME
            or s.attributes.get(semconv.SPAN_KIND) in (semconv.KIND_LLM, semconv.KIND_AGENT, semconv.KIND_TOOL)
        ]
        assert not emitted, f"spans emitted after uninstrument(): {[s.name for s in emitted]}"
        adapter.instrument()  # back on: instrument/uninstrument cycles work
        record = await harness.collect(await harness.run(agent, "task-on-again"))
        assert len(record.of_kind(semconv.KIND_LLM)) == len(record.calls) > 0

    def test_version_outside_range_refused(self, adapter: Adapter) -> None:
        """A framework version outside SUPPORTED_RANGE is refused, naming the versions and what to install."""
        with pytest.raises(UnsupportedVersionError) as info:
            adapter.check_version("0.0.1")
        message = str(info.value)
        assert "0.0.1" in message and adapter.SUPPORTED_RANGE in message and "install" in message.lower()
        assert adapter.check_version() == adapter.installed_version()

    def test_instrument_refuses_unsupported_install(self, adapter: Adapter, monkeypatch: pytest.MonkeyPatch) -> None:
        """instrument() with an out-of-range framework installed raises before hooking anything."""
        adapter.uninstrument()
        monkeypatch.setattr(type(adapter), "installed_version", classmethod(lambda cls: "0.0.1"))
        with pytest.raises(UnsupportedVersionError, match=r"0\.0\.1"):
            adapter.instrument()
        assert not adapter.instrumented
