"""An OpenAI Agents SDK `TracingProcessor` that mirrors the SDK's traces as Agent Lightning spans.

Agent spans become ``agent`` spans, generation/response spans ``llm`` spans, function spans ``tool`` spans and
handoffs plain spans naming both agents. Each mirrored span is made the current OpenTelemetry span while the
SDK span is open, so the openai client span of a generation nests under it and hands up the response id
(the Chat Completions path of the SDK does not record it), and code a tool runs (another framework, a manual
span) nests under the tool span.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from agents.tracing import Span as AgentsSpan
from agents.tracing import Trace as AgentsTrace
from agents.tracing import TracingProcessor
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, Status, StatusCode

from agentlightning import semconv
from agentlightning.adapters import lightning_tracer

__all__ = ["LightningTracingProcessor"]

logger = logging.getLogger(__name__)

ADAPTER = "openai_agents"


class _Open:
    __slots__ = ("ctx", "span", "token")

    def __init__(self, span: Span, token: object, ctx: otel_context.Context) -> None:
        self.span = span
        self.token = token
        self.ctx = ctx


class LightningTracingProcessor(TracingProcessor):
    """Mirrors Agents SDK traces and spans into the current rollout (register with ``add_trace_processor``).

    Args:
        tracer_name: Instrumentation scope of the spans.
        tracer_provider: The OpenTelemetry SDK provider the spans go through (default: Agent Lightning's own).
    """

    def __init__(
        self, tracer_name: str = "agentlightning_openai_agents", tracer_provider: TracerProvider | None = None
    ) -> None:
        self.enabled = True
        self._tracer_name = tracer_name
        self._tracer = lightning_tracer(tracer_name, tracer_provider)
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()

    def use_tracer_provider(self, tracer_provider: TracerProvider | None) -> None:
        """Start the next spans through ``tracer_provider`` (``None``: Agent Lightning's own provider)."""
        self._tracer = lightning_tracer(self._tracer_name, tracer_provider)

    # ------------------------------------------------------------------ helpers
    def _begin(self, key: str, parent: _Open | None, name: str, attributes: dict[str, Any]) -> None:
        attributes[semconv.ADAPTER_NAME] = ADAPTER
        # The parent's own context (made when it started) already holds it as the current span: no new one per span.
        span = self._tracer.start_span(name, context=parent.ctx if parent is not None else None, attributes=attributes)
        current = trace.set_span_in_context(span)
        self._open[key] = _Open(span, otel_context.attach(current), current)

    def _finish(self, key: str, attributes: dict[str, Any] | None = None, error: Any = None) -> None:
        entry = self._open.pop(key, None)
        if entry is None:
            return
        if otel_context.get_current() is entry.ctx:  # only restore where it was made current
            otel_context.detach(entry.token)  # type: ignore[arg-type]
        if attributes:
            entry.span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if error:
            message = error.get("message") if isinstance(error, dict) else str(error)
            entry.span.set_status(Status(StatusCode.ERROR, str(message)))
        entry.span.end()

    # ------------------------------------------------------------------ TracingProcessor
    def on_trace_start(self, trace: AgentsTrace) -> None:
        """Open a plain span for the SDK trace (the workflow)."""
        if self.enabled:
            self._begin(trace.trace_id, None, f"agents.workflow {trace.name}", {})

    def on_trace_end(self, trace: AgentsTrace) -> None:
        """Close the workflow span."""
        self._finish(trace.trace_id)

    def on_span_start(self, span: AgentsSpan[Any]) -> None:
        """Open the mirrored span, typed by the SDK span's data."""
        if not self.enabled:
            return
        data = span.span_data
        kind = getattr(data, "type", "custom")
        attributes: dict[str, Any] = {}
        if kind == "agent":
            name = f"invoke_agent {data.name}"
            attributes = {
                semconv.SPAN_KIND: semconv.KIND_AGENT,
                semconv.GEN_AI_AGENT_NAME: data.name,
                semconv.GEN_AI_OPERATION: "invoke_agent",
            }
        elif kind in ("generation", "response"):
            model = getattr(data, "model", None)
            name = f"chat {model}" if model else "chat"
            attributes = {semconv.SPAN_KIND: semconv.KIND_LLM, semconv.GEN_AI_OPERATION: "chat"}
            if model:
                attributes[semconv.GEN_AI_REQUEST_MODEL] = str(model)
        elif kind == "function":
            name = f"execute_tool {data.name}"
            attributes = {
                semconv.SPAN_KIND: semconv.KIND_TOOL,
                semconv.GEN_AI_TOOL_NAME: data.name,
                semconv.GEN_AI_OPERATION: "execute_tool",
            }
        elif kind == "handoff":
            name = f"handoff {data.from_agent} -> {data.to_agent}"
            attributes = {
                "agentlightning.handoff.from_agent": data.from_agent,
                "agentlightning.handoff.to_agent": data.to_agent,
            }
        else:
            name = str(getattr(data, "name", None) or kind)
        parent = self._open.get(span.parent_id) if span.parent_id is not None else None
        if parent is None:
            parent = self._open.get(span.trace_id)
        self._begin(span.span_id, parent, name, {k: v for k, v in attributes.items() if v is not None})

    def on_span_end(self, span: AgentsSpan[Any]) -> None:
        """Close the mirrored span with what the SDK learned (response id, usage, handoff target)."""
        data = span.span_data
        kind = getattr(data, "type", "custom")
        attributes: dict[str, Any] = {}
        if kind == "generation":
            usage = data.usage or {}
            attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] = usage.get("input_tokens")
            attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = usage.get("output_tokens")
        elif kind == "response":
            response = data.response
            attributes[semconv.GEN_AI_RESPONSE_ID] = getattr(response, "id", None)
            attributes[semconv.GEN_AI_RESPONSE_MODEL] = getattr(response, "model", None)
            usage = getattr(response, "usage", None)
            attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] = getattr(usage, "input_tokens", None)
            attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = getattr(usage, "output_tokens", None)
        elif kind == "handoff":
            attributes["agentlightning.handoff.to_agent"] = data.to_agent
        self._finish(span.span_id, attributes, span.error)

    def shutdown(self) -> None:
        """Nothing to release (spans are written by Agent Lightning's span processor)."""

    def force_flush(self) -> None:
        """Nothing buffered here."""
