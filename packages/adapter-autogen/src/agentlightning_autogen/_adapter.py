"""``instrument()`` for AutoGen AgentChat: map AutoGen's own OpenTelemetry spans onto our conventions.

AutoGen (autogen-core >= 0.6) opens GenAI spans through the *global* OpenTelemetry tracer provider:
``invoke_agent {name}`` around each agent turn and ``execute_tool {name}`` around each tool call. The adapter
routes the global provider into rollouts (`agentlightning.tracing.set_as_global`) and a span processor types
those spans (``agent`` / ``tool``). AutoGen makes no span per model call, and its model clients do not expose the
response id, so LLM spans come from the ``openai`` client instrumentation (AutoGen's
``OpenAIChatCompletionClient`` wraps the openai client): the client span nests under the current
``invoke_agent`` span and becomes the LLM span, carrying ``gen_ai.response.id``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from opentelemetry.sdk.trace import Span as SdkSpan

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

    def _instrument(self) -> None:
        from agentlightning.tracing import set_as_global

        provider = set_as_global()  # AutoGen only reports to the global provider
        add_processor_once(provider, self._mapper)
        acquire_openai_hook(standalone=True)
        self._mapper.enabled = True

    def _uninstrument(self) -> None:
        self._mapper.enabled = False
        release_openai_hook(standalone=True)


def instrument() -> AutoGenAdapter:
    """Record every AutoGen agent turn, tool call and model call inside a rollout (idempotent).

    Raises:
        UnsupportedVersionError: autogen-agentchat is missing or outside `SUPPORTED_RANGE`.
    """
    adapter = AutoGenAdapter.default()
    adapter.instrument()
    return adapter


def uninstrument() -> None:
    """Stop typing AutoGen spans and recording model calls (idempotent)."""
    AutoGenAdapter.default().uninstrument()
