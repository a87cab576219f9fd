"""``instrument()`` for AutoGen AgentChat: map AutoGen's own OpenTelemetry spans onto our conventions.

AutoGen (autogen-core >= 0.6) opens GenAI spans through the *global* OpenTelemetry tracer provider:
``invoke_agent {name}`` around each agent turn and ``execute_tool {name}`` around each tool call. As an
OpenTelemetry instrumentor, the adapter never sets the global provider: it attaches the rollouts' span processor and
a processor that types those spans (``agent`` / ``tool``) to the provider it is given (``tracer_provider``), else to
the global one: at once when the application has set an SDK provider there (its exporters keep receiving every span),
otherwise when the first rollout starts, where the code that runs rollouts (any runner: `agentlightning.Runner`,
``agl runner``, ``agl train``) routes the global provider into rollouts
(`agentlightning.tracing.when_global_provider`). The one ``instrument()`` line is enough either way.
AutoGen makes no span per model call, and its model clients do not expose the
response id, so LLM spans come from the ``openai`` client instrumentation (AutoGen's
``OpenAIChatCompletionClient`` wraps the openai client): the client span nests under the current
``invoke_agent`` span and becomes the LLM span, carrying ``gen_ai.response.id``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace import TracerProvider

from agentlightning import semconv
from agentlightning.adapters import (
    Adapter,
    GatedSpanProcessor,
    acquire_openai_hook,
    add_processor_once,
    release_openai_hook,
    supported_range,
)

__all__ = ["SUPPORTED_RANGE", "AutoGenAdapter", "instrument", "uninstrument"]

SUPPORTED_RANGE = supported_range("agentlightning-autogen", "autogen-agentchat")
"""autogen-agentchat versions this adapter supports (read from this package's dependency in pyproject.toml)."""

logger = logging.getLogger(__name__)

ADAPTER = "autogen"
_KINDS = {"invoke_agent": semconv.KIND_AGENT, "execute_tool": semconv.KIND_TOOL}


class _AutoGenSpanMapper(GatedSpanProcessor):
    """Types AutoGen's GenAI spans (scope ``autogen-core``) as agent and tool spans."""

    def on_start(self, span: SdkSpan, parent_context: Any = None) -> None:
        if not self.enabled:
            return
        scope = span.instrumentation_scope
        if scope is None or scope.name != "autogen-core":
            return
        attributes = span.attributes or {}
        kind = _KINDS.get(str(attributes.get(semconv.GEN_AI_OPERATION)))
        if kind is not None:
            span.set_attribute(semconv.SPAN_KIND, kind)
            span.set_attribute(semconv.ADAPTER_NAME, ADAPTER)


class AutoGenAdapter(Adapter):
    """Adapter for AutoGen AgentChat (agents, teams, tools) with OpenAI-compatible model clients."""

    NAME: ClassVar[str] = "autogen"
    FRAMEWORK: ClassVar[str] = "autogen-agentchat"
    SUPPORTED_RANGE: ClassVar[str] = SUPPORTED_RANGE
    INSTALL: ClassVar[str] = f"pip install agentlightning-autogen 'autogen-agentchat{SUPPORTED_RANGE}'"

    def __init__(self) -> None:
        super().__init__()
        self._mapper = _AutoGenSpanMapper()
        self._withdraw: Callable[[], None] | None = None

    def _instrument(self) -> None:
        from agentlightning.tracing import when_global_provider

        if self.tracer_provider is not None:
            self._use(self.tracer_provider)
        else:  # the global provider, now if the app set one, else once a rollout starts (see the module docstring)
            self._withdraw = when_global_provider(self._use)
        acquire_openai_hook(standalone=True)
        self._mapper.enabled = True

    def _use(self, provider: TracerProvider) -> None:
        from agentlightning.tracing import attach_to

        attach_to(provider)  # AutoGen's spans inside rollouts are stored
        add_processor_once(provider, self._mapper)
        logger.debug("AutoGen's spans are read from %s", type(provider).__name__)

    def _uninstrument(self) -> None:
        self._mapper.enabled = False
        if self._withdraw is not None:
            self._withdraw()
            self._withdraw = None
        release_openai_hook(standalone=True)


def instrument(tracer_provider: TracerProvider | None = None) -> AutoGenAdapter:
    """Record every AutoGen agent turn, tool call and model call inside a rollout (idempotent).

    Args:
        tracer_provider: The SDK provider AutoGen's spans go through (AutoGen uses the global one). Default: the
            global provider: the application's, if it set one; else the runner routes it into rollouts when the first
            rollout starts. An application's global provider is never replaced.

    Raises:
        UnsupportedVersionError: autogen-agentchat is missing or outside `SUPPORTED_RANGE`.
    """
    adapter = AutoGenAdapter.default()
    adapter.instrument(tracer_provider)
    return adapter


def uninstrument() -> None:
    """Stop typing AutoGen spans and recording model calls (idempotent)."""
    AutoGenAdapter.default().uninstrument()
