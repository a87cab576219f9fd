"""Span sources: the GenAI instrumentation an app already has (OpenLLMetry, OpenTelemetry's ``openai-v2``).

An app instrumented with OpenLLMetry's ``opentelemetry-instrumentation-openai`` / ``-langchain`` / ``-openai-agents``
or with OpenTelemetry's ``opentelemetry-instrumentation-openai-v2`` already emits one span per LLM call. A
`SpanSource` is an `Adapter` that hooks nothing itself: ``instrument()`` makes the span processor read that
instrumentation's spans as ours (`agentlightning.tracing` maps them by instrumentation scope). Those
instrumentations report to the global OpenTelemetry provider, and a source, like every adapter, never sets it: it
waits for it (`when_global_provider`). If the app set an SDK provider, our span processor is attached to it at once;
if the app set none, the next rollout start (the runner, which owns the process) makes ours the global one
(`route_global_provider`). Their tracers are the API's proxy tracers until then, so they follow.

`active_sources` finds the ones the app turned on, without importing any of them: a source is active when its
instrumentor module was imported and its instrumentor's public ``is_instrumented_by_opentelemetry`` is true.
`instrument_all` (and the runner, before each rollout) instruments the active ones and skips our adapters for the
same calls, so each call is recorded once; our adapter instrumented explicitly wins (the source's spans are then
left as they are).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from agentlightning.adapters._base import Adapter, UnsupportedVersionError
from agentlightning.adapters._otel import pending_llm_spans
from agentlightning.tracing._genai import LANGGRAPH_NODE

__all__ = [
    "SOURCES",
    "OpenAIV2Source",
    "OpenLLMetryAgentsSource",
    "OpenLLMetryLangChainSource",
    "OpenLLMetryOpenAISource",
    "SpanSource",
    "active_sources",
    "use_active_sources",
]

logger = logging.getLogger(__name__)


def _instrumented(name: str) -> bool:
    adapter = next((a for a in Adapter.instances() if name == a.NAME and not isinstance(a, SpanSource)), None)
    return adapter is not None and adapter.instrumented


class SpanSource(Adapter):
    """An instrumentation the app already runs, read as a source of our spans (see the module docstring).

    Attributes:
        MODULE: The instrumentation's module (looked up in ``sys.modules``, never imported here).
        INSTRUMENTOR: Its `BaseInstrumentor` subclass's name in ``MODULE``.
        SCOPES: Instrumentation scope names of its spans.
        COVERS: Our adapters that record the same calls: `instrument_all` skips them while this source is active.
        NEEDS_RELAY: Its LLM spans may lack the response id; the openai client relay (no span of its own) fills it.
        AGENT_ATTRIBUTE: The attribute (or attributes: the first one set wins) that names, on its live spans, the
            agent they run under, where its agent spans carry ``gen_ai.agent.name`` only after they start: the openai
            client hook reads it from the call's LLM span for the agent header (`agentlightning.AGENT_HEADER`) the
            proxy routes policies by.
    """

    MODULE: ClassVar[str]
    INSTRUMENTOR: ClassVar[str]
    SCOPES: ClassVar[tuple[str, ...]]
    COVERS: ClassVar[tuple[str, ...]]
    NEEDS_RELAY: ClassVar[bool] = False
    AGENT_ATTRIBUTE: ClassVar[str | tuple[str, ...] | None] = None

    @classmethod
    def active(cls) -> bool:
        """Whether the app turned this instrumentation on (its instrumentor reports being instrumented)."""
        module = sys.modules.get(cls.MODULE)
        instrumentor_cls: Any = getattr(module, cls.INSTRUMENTOR, None) if module is not None else None
        if instrumentor_cls is None or not callable(getattr(instrumentor_cls, "__new__", None)):
            return False
        # BaseInstrumentor is a singleton made in __new__; calling the class would re-run __init__, which resets
        # some instrumentors' settings (OpenLLMetry's), so only __new__ is called to get the instance.
        instrumentor: Any = instrumentor_cls.__new__(instrumentor_cls)
        return getattr(instrumentor, "is_instrumented_by_opentelemetry", False) is True

    def _hooks_client(self) -> bool:
        # our openai client hook relays missing ids to its LLM spans and adds the agent header naming their agent
        return self.NEEDS_RELAY or self.AGENT_ATTRIBUTE is not None

    def _suppressed(self) -> bool:
        return any(_instrumented(name) for name in self.COVERS)

    _withdraw_routing: Callable[[], None] | None = None

    def _instrument(self) -> None:
        from agentlightning.tracing import when_global_provider
        from agentlightning.tracing._genai import SourceRegistration, register_source

        # The adapter contract: never set the global provider here (see the module docstring).
        self._withdraw_routing = when_global_provider(_provider_routed)
        client = "openai" in self.COVERS
        registration = SourceRegistration(
            self.NAME, self._suppressed, client=client, agent_attribute=self.AGENT_ATTRIBUTE
        )
        if not client:  # its LLM span may not be current during the client call: our client hook finds it here
            registration.on_llm_start = pending_llm_spans.add
            registration.on_llm_end = pending_llm_spans.discard
        register_source(self.SCOPES, registration)
        if self._hooks_client():
            from agentlightning.adapters._openai import acquire_openai_hook

            acquire_openai_hook()

    def _uninstrument(self) -> None:
        from agentlightning.tracing._genai import unregister_source

        unregister_source(self.SCOPES, self.NAME)
        if self._withdraw_routing is not None:
            self._withdraw_routing()
            self._withdraw_routing = None
        if self._hooks_client():
            from agentlightning.adapters._openai import release_openai_hook

            release_openai_hook()


def _provider_routed(provider: Any) -> None:
    """Nothing more to do once the global provider feeds the store: the processor maps the source's spans."""


_OPENLLMETRY = ">=0.62,<0.63"
_OPENLLMETRY_INSTALL = "pip install '{}>=0.62,<0.63'"


class OpenLLMetryOpenAISource(SpanSource):
    """OpenLLMetry's OpenAI instrumentation (``opentelemetry-instrumentation-openai``)."""

    NAME: ClassVar[str] = "openllmetry_openai"
    FRAMEWORK: ClassVar[str] = "opentelemetry-instrumentation-openai"
    SUPPORTED_RANGE: ClassVar[str] = _OPENLLMETRY
    INSTALL: ClassVar[str] = _OPENLLMETRY_INSTALL.format(FRAMEWORK)
    MODULE: ClassVar[str] = "opentelemetry.instrumentation.openai"
    INSTRUMENTOR: ClassVar[str] = "OpenAIInstrumentor"
    SCOPES: ClassVar[tuple[str, ...]] = (
        "opentelemetry.instrumentation.openai",
        "opentelemetry.instrumentation.openai.v1",
        "opentelemetry.instrumentation.openai.v0",
    )
    COVERS: ClassVar[tuple[str, ...]] = ("openai",)


class OpenLLMetryLangChainSource(SpanSource):
    """OpenLLMetry's LangChain instrumentation (``opentelemetry-instrumentation-langchain``, LangGraph too).

    Its agent spans are its workflow spans (a run's root chain: ``gen_ai.operation.name=invoke_agent``, the graph's
    name as ``gen_ai.agent.name``) and, in a LangGraph graph, each node's own task span (the node is the agent, as
    our LangChain adapter has it), named only after they start. Its LLM spans carry, before the client call, the
    node they run in (``traceloop.association.properties.langgraph_node``) and the workflow's name
    (``traceloop.workflow.name``): the first of them names the call's agent.
    """

    NAME: ClassVar[str] = "openllmetry_langchain"
    FRAMEWORK: ClassVar[str] = "opentelemetry-instrumentation-langchain"
    SUPPORTED_RANGE: ClassVar[str] = _OPENLLMETRY
    INSTALL: ClassVar[str] = _OPENLLMETRY_INSTALL.format(FRAMEWORK)
    MODULE: ClassVar[str] = "opentelemetry.instrumentation.langchain"
    INSTRUMENTOR: ClassVar[str] = "LangchainInstrumentor"
    SCOPES: ClassVar[tuple[str, ...]] = ("opentelemetry.instrumentation.langchain",)
    COVERS: ClassVar[tuple[str, ...]] = ("langchain",)
    AGENT_ATTRIBUTE: ClassVar[str | tuple[str, ...] | None] = (LANGGRAPH_NODE, "traceloop.workflow.name")


class OpenLLMetryAgentsSource(SpanSource):
    """OpenLLMetry's OpenAI Agents SDK instrumentation (``opentelemetry-instrumentation-openai-agents``).

    Its generation spans carry no response id for chat-completions models, so the openai client relay (which
    records no span) hands the id to them.
    """

    NAME: ClassVar[str] = "openllmetry_openai_agents"
    FRAMEWORK: ClassVar[str] = "opentelemetry-instrumentation-openai-agents"
    SUPPORTED_RANGE: ClassVar[str] = _OPENLLMETRY
    INSTALL: ClassVar[str] = _OPENLLMETRY_INSTALL.format(FRAMEWORK)
    MODULE: ClassVar[str] = "opentelemetry.instrumentation.openai_agents"
    INSTRUMENTOR: ClassVar[str] = "OpenAIAgentsInstrumentor"
    SCOPES: ClassVar[tuple[str, ...]] = ("opentelemetry.instrumentation.openai_agents",)
    COVERS: ClassVar[tuple[str, ...]] = ("openai_agents",)
    NEEDS_RELAY: ClassVar[bool] = True


class OpenAIV2Source(SpanSource):
    """OpenTelemetry's own OpenAI instrumentation (``opentelemetry-instrumentation-openai-v2``)."""

    NAME: ClassVar[str] = "otel_openai_v2"
    FRAMEWORK: ClassVar[str] = "opentelemetry-instrumentation-openai-v2"
    SUPPORTED_RANGE: ClassVar[str] = ">=2.4b0,<2.5"
    INSTALL: ClassVar[str] = "pip install 'opentelemetry-instrumentation-openai-v2>=2.4b0,<2.5'"
    MODULE: ClassVar[str] = "opentelemetry.instrumentation.openai_v2"
    INSTRUMENTOR: ClassVar[str] = "OpenAIInstrumentor"
    # 2.4b0 records through opentelemetry-util-genai's handler; earlier releases under their own scope
    SCOPES: ClassVar[tuple[str, ...]] = ("opentelemetry.util.genai.handler", "opentelemetry.instrumentation.openai_v2")
    COVERS: ClassVar[tuple[str, ...]] = ("openai",)


SOURCES: tuple[type[SpanSource], ...] = (
    OpenLLMetryOpenAISource,
    OpenLLMetryLangChainSource,
    OpenLLMetryAgentsSource,
    OpenAIV2Source,
)
"""Every supported span source."""


_warned: set[str] = set()  # the runner asks before every rollout: warn once per source


def active_sources() -> list[type[SpanSource]]:
    """The span sources whose instrumentation the app turned on (nothing is imported to find out)."""
    return [source for source in SOURCES if source.active()]


def use_active_sources() -> list[str]:
    """Instrument every active span source in a supported version (idempotent; cheap when none is active).

    Returns:
        Names of the sources in use after the call. One outside its supported range is not used: a WARNING names
        its version and the range (our own adapters then record those calls, as without it).
    """
    used: list[str] = []
    for cls in active_sources():
        source = cls.default()
        if not source.instrumented:
            try:
                source.instrument()
            except UnsupportedVersionError as exc:
                if source.NAME in _warned:
                    continue
                _warned.add(source.NAME)
                logger.warning(
                    "span source %s NOT used: %s %s is installed but Agent Lightning reads %s %s; %s",
                    source.NAME,
                    source.FRAMEWORK,
                    source.installed_version(),
                    source.FRAMEWORK,
                    source.SUPPORTED_RANGE,
                    exc,
                )
                continue
        used.append(source.NAME)
    return used
