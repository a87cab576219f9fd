"""``instrument()`` for AutoGen AgentChat: map AutoGen's own OpenTelemetry spans onto our conventions.

AutoGen (autogen-core >= 0.6) opens GenAI spans through the *global* OpenTelemetry tracer provider:
``invoke_agent {name}`` around each agent turn and ``execute_tool {name}`` around each tool call. As an
OpenTelemetry instrumentor, the adapter never sets the global provider: it attaches the rollouts' span processor and
a processor that types those spans (``agent`` / ``tool``) to the provider it is given (``tracer_provider``), or to
the global one when the application has set an SDK provider there. The application sets it
(``opentelemetry.trace.set_tracer_provider``, or `agentlightning.tracing.set_as_global` for ours; ``agl runner``
does that). Without one, AutoGen's agent and tool spans are not recorded (a warning says so); the model calls are.
AutoGen makes no span per model call, and its model clients do not expose the
response id, so LLM spans come from the ``openai`` client instrumentation (AutoGen's
``OpenAIChatCompletionClient`` wraps the openai client): the client span nests under the current
``invoke_agent`` span and becomes the LLM span, carrying ``gen_ai.response.id``.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from opentelemetry import trace
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

    def _instrument(self) -> None:
        from agentlightning.tracing import attach_to

        provider = self.tracer_provider or _global_sdk_provider()
        if provider is None:
            logger.warning(
                "AutoGen reports its agent and tool spans to the global OpenTelemetry provider, and none is set: "
                "they will not be recorded. Set one in the application (agentlightning.tracing.set_as_global()) or "
                "pass instrument(tracer_provider=...) the provider set there"
            )
        else:
            attach_to(provider)  # AutoGen's spans inside rollouts are stored
            add_processor_once(provider, self._mapper)
        acquire_openai_hook(standalone=True)
        self._mapper.enabled = True

    def _uninstrument(self) -> None:
        self._mapper.enabled = False
        release_openai_hook(standalone=True)


def _global_sdk_provider() -> TracerProvider | None:
    """The application's global provider when it is an SDK one (what AutoGen's spans go through), else ``None``."""
    provider = trace.get_tracer_provider()
    return provider if isinstance(provider, TracerProvider) else None


def instrument(tracer_provider: TracerProvider | None = None) -> AutoGenAdapter:
    """Record every AutoGen agent turn, tool call and model call inside a rollout (idempotent).

    Args:
        tracer_provider: The SDK provider AutoGen's spans go through (AutoGen uses the global one: pass the provider
            the application set there). Default: the global provider, when it is an SDK one. Never set globally.

    Raises:
        UnsupportedVersionError: autogen-agentchat is missing or outside `SUPPORTED_RANGE`.
    """
    adapter = AutoGenAdapter.default()
    adapter.instrument(tracer_provider)
    return adapter


def uninstrument() -> None:
    """Stop typing AutoGen spans and recording model calls (idempotent)."""
    AutoGenAdapter.default().uninstrument()
