"""OpenTelemetry helpers for adapter authors: our tracer provider, switchable processors, LLM-span lookups.

Public through :mod:`agentlightning.adapters`; an adapter package imports them from there.
"""

from __future__ import annotations

import threading
from typing import Any, TypeGuard

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan

from agentlightning import semconv
from agentlightning.tracing._context import _CURRENT  # pyright: ignore[reportPrivateUsage]
from agentlightning.tracing._light import LightSpan

__all__ = [
    "GatedSpanProcessor",
    "PendingLLMSpans",
    "add_processor_once",
    "is_llm_span",
    "lightning_provider",
    "lightning_tracer",
    "pending_llm_spans",
]

_added: set[int] = set()
_added_lock = threading.Lock()


def lightning_provider() -> TracerProvider:
    """The SDK tracer provider of :mod:`agentlightning.tracing` (spans go to the current rollout's store)."""
    from agentlightning.tracing import get_tracer_provider

    provider: Any = get_tracer_provider()
    return provider


def lightning_tracer(name: str, tracer_provider: TracerProvider | None = None) -> trace.Tracer:
    """A tracer whose spans started inside a rollout are stamped with it and stored.

    With Agent Lightning's own provider, a span started inside a rollout while nothing but the store reads that
    provider's spans is a light span (`agentlightning.tracing.light_tracer`: an OpenTelemetry ``Span`` that is not
    the SDK's, giving the same stored record at a third of the cost); anywhere else it is the SDK's span. Code that
    needs to know whether a span is a live LLM span asks :func:`is_llm_span`, which knows both kinds.

    Args:
        name: Instrumentation scope name.
        tracer_provider: An adapter's ``instrument(tracer_provider=...)``: the tracer comes from it (SDK spans
            only), and the rollouts' span processor is attached to it (`agentlightning.tracing.attach_to`).
            ``None``: :func:`lightning_provider`.
    """
    from agentlightning.tracing import attach_to
    from agentlightning.tracing._provider import light_tracer

    if tracer_provider is None:
        return light_tracer(name)
    attach_to(tracer_provider)
    return tracer_provider.get_tracer(name)


class GatedSpanProcessor(SpanProcessor):
    """A span processor that can be switched off: an SDK provider cannot remove a processor once added."""

    enabled: bool = False

    def reads_own_spans(self) -> bool:
        """Whether it must see Agent Lightning's own spans (root, LLM, reward): an `OwnSpanReader`.

        A mapper of a framework's spans does not, so our own spans keep to the light path while it is on the
        provider (`agentlightning.tracing.light_tracer`). Override to return ``True`` for one that does.
        """
        return False

    def on_start(self, span: SdkSpan, parent_context: Any = None) -> None:  # pragma: no cover - overridden
        """Called when a span starts (span still writable)."""

    def on_end(self, span: ReadableSpan) -> None:  # pragma: no cover - overridden
        """Called when a span ends (read-only)."""

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing buffered."""
        return True


def add_processor_once(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Add ``processor`` to ``provider`` unless this very processor was already added to it."""
    key = id(provider) ^ (id(processor) << 1)
    with _added_lock:
        if key in _added:
            return
        provider.add_span_processor(processor)
        _added.add(key)


def is_llm_span(span: Any) -> TypeGuard[SdkSpan | LightSpan]:
    """Whether ``span`` is a live, recording span of kind ``llm`` (an enclosing framework LLM span): an SDK span,
    or a light one of :func:`lightning_tracer`."""
    if not isinstance(span, SdkSpan | LightSpan) or not span.is_recording():
        return False
    attributes = span.attributes or {}
    return attributes.get(semconv.SPAN_KIND) == semconv.KIND_LLM


class PendingLLMSpans:
    """Framework LLM spans waiting for the client span of the same call (to learn its response id).

    A callback-based framework (LangChain) cannot make its LLM span the current OpenTelemetry span, because its
    start and end callbacks may run in copies of the caller's context. The openai client span of the call
    then finds its framework span here instead: the oldest unclaimed live LLM span of the same rollout. With
    concurrent LLM calls inside one rollout, two calls of the same rollout may swap response ids.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_rollout: dict[int, list[SdkSpan | LightSpan]] = {}

    @staticmethod
    def _key() -> int:
        return id(_CURRENT.get())

    def add(self, span: Any) -> None:
        """Register a just-started framework LLM span of the current rollout (an SDK span or a light one)."""
        if not isinstance(span, SdkSpan | LightSpan):
            return
        key = self._key()
        with self._lock:
            self._by_rollout.setdefault(key, []).append(span)

    def discard(self, span: Any) -> None:
        """Forget ``span`` (its call ended)."""
        with self._lock:
            for key, spans in list(self._by_rollout.items()):
                if span in spans:
                    spans.remove(span)
                    if not spans:
                        del self._by_rollout[key]
                    return

    def claim(self) -> SdkSpan | LightSpan | None:
        """Take the oldest live framework LLM span of the current rollout, if any."""
        if not self._by_rollout:
            return None
        key = self._key()
        with self._lock:
            spans = self._by_rollout.get(key)
            while spans:
                span = spans.pop(0)
                if span.is_recording():
                    if not spans:
                        del self._by_rollout[key]
                    return span
            self._by_rollout.pop(key, None)
        return None


pending_llm_spans = PendingLLMSpans()
"""The process-wide registry of framework LLM spans waiting for their client span (see `PendingLLMSpans`)."""
