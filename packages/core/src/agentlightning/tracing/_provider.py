"""The SDK tracer provider that feeds the store, created once and lazily."""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from agentlightning.tracing._light import LightTracer
from agentlightning.tracing._processor import LightningSpanProcessor

__all__ = [
    "OwnSpanReader",
    "aflush",
    "agent_of_span",
    "attach_to",
    "flush",
    "get_span_processor",
    "get_tracer",
    "get_tracer_provider",
    "light_tracer",
    "route_global_provider",
    "set_as_global",
    "when_global_provider",
]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_processor: LightningSpanProcessor | None = None
_provider: TracerProvider | None = None
_attached: set[int] = set()
_tracers: dict[tuple[str, str | None], trace.Tracer] = {}
_light_tracers: dict[str, LightTracer] = {}
"""Tracers handed out by `get_tracer`: the provider keeps one per scope anyway, but asking it costs a warnings
filter update and two scope objects per call (the runner asks once per rollout, adapters once per span)."""


def get_span_processor() -> LightningSpanProcessor:
    """The one `LightningSpanProcessor` of this process (created on first use)."""
    global _processor
    with _lock:
        if _processor is None:
            _processor = LightningSpanProcessor()
            atexit.register(_at_exit)
        return _processor


def _at_exit() -> None:
    if _processor is not None:
        _processor.shutdown()


def get_tracer_provider() -> TracerProvider:
    """Agent Lightning's own SDK `TracerProvider` (created once, lazily), with the span processor attached.

    It is not made the global OpenTelemetry provider unless `set_as_global` is called, so it never takes over
    an application's own tracing.
    """
    global _provider
    processor = get_span_processor()
    with _lock:
        if _provider is None:
            provider = _Provider(resource=Resource.create({"service.name": "agentlightning"}), sampler=ALWAYS_ON)
            provider.add_span_processor(processor)
            _attached.add(id(provider))
            _provider = provider
        return _provider


@runtime_checkable
class OwnSpanReader(Protocol):
    """A span processor that declares whether it must see Agent Lightning's own spans (root, LLM, reward) now.

    Our own spans inside a rollout skip the OpenTelemetry SDK (light spans) only while no other processor on our
    provider reads them. A processor that does not implement this protocol (an exporter, the application's own) is
    taken to read them for good: adding it turns light spans off, and says so once in the log (INFO).
    `agentlightning.adapters.GatedSpanProcessor` (a mapper of a framework's spans: ``False``) and the OTLP exporter
    (``True`` until `stop_otlp_export` switches it off) implement it.
    """

    def reads_own_spans(self) -> bool:
        """Whether this processor must now receive our own spans as SDK spans."""
        ...


def _always() -> bool:
    return True


class _Provider(TracerProvider):
    """Our SDK provider, which knows whether a processor besides ours sees its spans (an OTLP exporter, a user's)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.others: list[Callable[[], bool]] = []
        """For each processor besides ours: whether it reads our own spans now (`OwnSpanReader`)."""
        limits = SpanLimits()  # from the OTEL_*_LIMIT variables: light spans keep the SDK's defaults only
        self.default_limits = (
            (limits.max_attribute_length, limits.max_span_attribute_length) == (None, None)
            and (limits.max_span_attributes, limits.max_event_attributes) == (128, 128)
            and os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"
        )

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        if span_processor is _processor:
            return
        if isinstance(span_processor, OwnSpanReader):
            self.others.append(span_processor.reads_own_spans)
            return
        # Right for an exporter or the app's own processor (it sees our spans), but worth a line: the SDK path costs.
        logger.info("light spans off: %s also receives Agent Lightning's spans", type(span_processor).__qualname__)
        self.others.append(_always)

    def light_allowed(self) -> bool:
        """Whether our own spans may skip the SDK: the limits are the default and no other processor reads our spans
        now (each one added says so through `OwnSpanReader`; one that does not, reads them)."""
        return self.default_limits and not any(reads() for reads in self.others)


def light_tracer(name: str = "agentlightning") -> trace.Tracer:
    """The tracer of Agent Lightning's own spans (root, LLM, reward, annotation): light spans inside a rollout
    while nothing but the store sees them (`agentlightning.tracing._light`), else the SDK tracer of ``name``."""
    tracer = _light_tracers.get(name)
    if tracer is None:
        provider = get_tracer_provider()
        assert isinstance(provider, _Provider)
        sdk = get_tracer(name)
        tracer = LightTracer(sdk, get_span_processor(), InstrumentationScope(name), provider.light_allowed)
        _light_tracers[name] = tracer
    return tracer


def get_tracer(name: str = "agentlightning", version: str | None = None) -> trace.Tracer:
    """A tracer whose spans, started inside a rollout, are written to that rollout's store.

    Args:
        name: Instrumentation scope name (e.g. the adapter's package name).
        version: Instrumentation scope version.
    """
    tracer = _tracers.get((name, version))
    if tracer is None:
        tracer = _tracers[(name, version)] = get_tracer_provider().get_tracer(name, version)
    return tracer


def agent_of_span(span: trace.Span) -> str | None:
    """The agent a live span of a rollout runs under: its own ``gen_ai.agent.name``, else its nearest ancestor's.

    Known for spans started inside a rollout through a provider this module's processor is attached to, while they
    are live; ``None`` otherwise.
    """
    processor = _processor
    return processor.agent_of(span) if processor is not None else None


def attach_to(provider: TracerProvider) -> None:
    """Add the span processor to another SDK provider (idempotent), so its spans inside rollouts are stored too."""
    processor = get_span_processor()
    with _lock:
        if id(provider) in _attached:
            return
        _attached.add(id(provider))
    provider.add_span_processor(processor)


def set_as_global() -> TracerProvider:
    """Make libraries that use the global OpenTelemetry provider report into rollouts.

    If no SDK provider is global yet, ours becomes the global one. If the application already set its own SDK
    provider, the span processor is attached to it instead (OpenTelemetry allows setting the global once).

    Returns:
        The global provider that now feeds the store.
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        attach_to(current)
        return current
    ours = get_tracer_provider()
    trace.set_tracer_provider(ours)
    if trace.get_tracer_provider() is not ours:  # someone else won a race to set it
        actual = trace.get_tracer_provider()
        if isinstance(actual, TracerProvider):
            attach_to(actual)
            return actual
        logger.warning("the global tracer provider is %r and could not be replaced", type(actual).__name__)
    return ours


_waiting: dict[object, Callable[[TracerProvider], None]] = {}
_route_lock = threading.Lock()


def when_global_provider(callback: Callable[[TracerProvider], None]) -> Callable[[], None]:
    """Run ``callback`` with the global SDK provider once the spans reported there reach rollouts.

    For an instrumentor whose framework reports only to the global OpenTelemetry provider (AutoGen): it never sets
    that provider itself. If the application has set an SDK provider, the span processor is attached to it and
    ``callback`` runs now. Otherwise it runs when the next rollout starts (`rollout_context`, which every runner
    enters): the code that runs rollouts owns the process, so `route_global_provider` then makes the global provider
    feed the store (ours, or the application's if it set one meanwhile).

    Args:
        callback: Called once with the global provider (e.g. to add a processor that maps the framework's spans).

    Returns:
        A function that withdraws ``callback`` if it has not run yet (an instrumentor's ``uninstrument``).
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        attach_to(current)
        callback(current)
        return lambda: None
    key = object()
    with _lock:
        _waiting[key] = callback

    def withdraw() -> None:
        with _lock:
            _waiting.pop(key, None)

    return withdraw


def route_global_provider() -> TracerProvider | None:
    """Before a rollout: if an instrumentor waits for the global provider (`when_global_provider`), make it feed the
    store (`set_as_global`: the application's SDK provider if it set one, else ours) and run what waited.

    Cheap when nothing waits (what every rollout start pays). `rollout_context` calls it.

    Returns:
        The global provider now feeding the store, or ``None`` when nothing waited.
    """
    if not _waiting:
        return None
    with _route_lock:  # a concurrent rollout start waits here until the provider is routed
        with _lock:
            callbacks = list(_waiting.items())
        if not callbacks:
            return None
        provider = set_as_global()
        for key, callback in callbacks:
            try:
                callback(provider)
            except Exception:
                logger.exception("routing the global tracer provider: %r failed", callback)
            with _lock:
                _waiting.pop(key, None)
        return provider


def flush(timeout: float | None = None, attempt_id: str | None = None) -> None:
    """Write every finished span to its store and wait for the stores to acknowledge them.

    Args:
        timeout: Seconds to wait at most (``None``: no limit).
        attempt_id: Raise for write failures of this attempt's spans (default: the current rollout's attempt;
            outside a rollout: failures of any batch this call waited for).

    Raises:
        RuntimeError: When called in a running event loop (use `aflush` there).
        TimeoutError: When the timeout passes first.
        SpanWriteError: When a batch could not be written.
    """
    get_span_processor().flush(timeout, attempt_id)


async def aflush(timeout: float | None = None, attempt_id: str | None = None) -> None:
    """Async `flush`, for use inside event loops (including the loop that owns a store)."""
    await get_span_processor().aflush(timeout, attempt_id)
