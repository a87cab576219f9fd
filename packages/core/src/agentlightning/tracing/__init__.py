"""Tracing: OpenTelemetry spans recorded inside a rollout go to that rollout's store.

Adapters get a tracer with `get_tracer()`; the runner (or a test) marks the code that belongs to an attempt
with `rollout_context(...)`; `flush()` / `aflush()` wait until every finished span is stored.
"""

from agentlightning.tracing._context import RolloutContext, current_rollout, rollout_context
from agentlightning.tracing._emit import emit_annotation, emit_reward, llm_base_url
from agentlightning.tracing._loop_thread import LoopThread
from agentlightning.tracing._otlp import (
    OTLP_ENDPOINT_ENV,
    OTLP_INSTALL,
    export_to_otlp,
    flush_otlp,
    otlp_endpoint_from_env,
    stop_otlp_export,
)
from agentlightning.tracing._processor import LightningSpanProcessor, SpanWriteError
from agentlightning.tracing._provider import (
    OwnSpanReader,
    aflush,
    agent_of_span,
    attach_to,
    flush,
    get_span_processor,
    get_tracer,
    get_tracer_provider,
    route_global_provider,
    set_as_global,
    when_global_provider,
)
from agentlightning.tracing._records import to_span_model

__all__ = [
    "OTLP_ENDPOINT_ENV",
    "OTLP_INSTALL",
    "LightningSpanProcessor",
    "LoopThread",
    "OwnSpanReader",
    "RolloutContext",
    "SpanWriteError",
    "aflush",
    "agent_of_span",
    "attach_to",
    "current_rollout",
    "emit_annotation",
    "emit_reward",
    "export_to_otlp",
    "flush",
    "flush_otlp",
    "get_span_processor",
    "get_tracer",
    "get_tracer_provider",
    "llm_base_url",
    "otlp_endpoint_from_env",
    "rollout_context",
    "route_global_provider",
    "set_as_global",
    "stop_otlp_export",
    "to_span_model",
    "when_global_provider",
]
