"""A light recording path for Agent Lightning's own spans (the runner's root span, the openai hook's LLM spans,
rewards and annotations).

The OpenTelemetry SDK's span carries what a general tracer needs (a lock, bounded attribute maps, a resource and
scope, links, a sampler decision, a fan-out to every processor, a ``ReadableSpan`` copy at the end): ~35 µs of CPU
per span here before our processor sees it. A `LightSpan` is an OpenTelemetry ``Span`` (it can be the current span,
frameworks' SDK spans parent to it, ``use_span`` works) that keeps only the fields a stored record has, and hands
itself to our processor when it ends: the same `agentlightning.Span` record comes out (`to_span_model` converts
both kinds), with the same ids, attributes (cleaned as the SDK cleans them), events, status and times.

`LightTracer` makes light spans only where nothing else would see the SDK span: inside a rollout, with our span
processor alone on the provider (no OTLP export or other processor: then every span is an SDK span, exported as
before), the SDK's default span limits and no ``OTEL_SDK_DISABLED``; otherwise it hands the call to the SDK tracer.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import traceback
from collections.abc import Generator, Mapping, Sequence
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util import types

from agentlightning import semconv
from agentlightning.tracing._context import RolloutContext
from agentlightning.tracing._processor import LightningSpanProcessor

__all__ = ["LightSpan", "LightTracer"]

logger = logging.getLogger(__name__)

_SCALARS = frozenset((str, bool, int, float))
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_MAX_ATTRIBUTES = 128  # the SDK's default span limit (other limits: the provider keeps to SDK spans)


def _clean(key: Any, value: Any) -> tuple[bool, Any]:
    """``(keep, value)`` as the SDK's attribute map would store it (lists as tuples; bad keys or values dropped)."""
    if type(value) in _SCALARS and type(key) is str and key:
        return True, value
    bounded = BoundedAttributes(attributes={key: value}, immutable=False)  # the SDK's own cleaning, with its warnings
    if key in bounded:
        return True, bounded[key]
    return False, None


def _span_id() -> int:
    span_id = random.getrandbits(64)
    while span_id == trace.INVALID_SPAN_ID:
        span_id = random.getrandbits(64)
    return span_id


def _trace_id() -> int:
    trace_id = random.getrandbits(128)
    while trace_id == trace.INVALID_TRACE_ID:
        trace_id = random.getrandbits(128)
    return trace_id


class LightSpan(trace.Span):
    """A recording span of a rollout, written to its store through our processor when it ends (see the module).

    Reads like an SDK ``ReadableSpan`` (``name``, ``context``, ``parent``, ``attributes``, ``events``, ``status``,
    ``start_time``, ``end_time``, ``kind``, ``instrumentation_scope``); behaves like an SDK span where the API leaves
    room (status ``OK`` is final, nothing changes after `end`, which warns as the SDK does).
    """

    __slots__ = (
        "_attributes",
        "_end_time",
        "_events",
        "_name",
        "_processor",
        "_record_exception",
        "_set_status_on_exception",
        "_status",
        "context",
        "instrumentation_scope",
        "parent",
        "start_time",
    )

    def __init__(
        self,
        processor: LightningSpanProcessor,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        scope: InstrumentationScope,
        start_time: int,
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> None:
        self._processor = processor
        self._name = name
        self.context = context
        self.parent = parent
        self.instrumentation_scope = scope
        self.start_time = start_time
        self._end_time: int | None = None
        self._attributes: dict[str, Any] = {}
        self._events: list[Event] = []
        self._status = _UNSET
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception

    # ------------------------------------------------------------------ read side (as a ReadableSpan)
    @property
    def name(self) -> str:
        """The span's name."""
        return self._name

    @property
    def attributes(self) -> Mapping[str, Any]:
        """The span's attributes (lists as tuples, as the SDK keeps them)."""
        return self._attributes

    @property
    def events(self) -> Sequence[Event]:
        """The span's events (exceptions recorded on it included)."""
        return self._events

    @property
    def status(self) -> Status:
        """The span's status."""
        return self._status

    @property
    def end_time(self) -> int | None:
        """When the span ended (ns since the epoch; ``None`` while it runs)."""
        return self._end_time

    @property
    def kind(self) -> SpanKind:
        """Always ``INTERNAL`` (other kinds take the SDK path)."""
        return SpanKind.INTERNAL

    # ------------------------------------------------------------------ the Span API
    def get_span_context(self) -> SpanContext:
        """The span's context (its trace and span ids)."""
        return self.context

    def is_recording(self) -> bool:
        """Whether the span still runs."""
        return self._end_time is None

    def _ended(self, what: str) -> bool:
        if self._end_time is None:
            return False
        logger.warning("Tried calling %s on an ended span.", what)
        return True

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        """Set one attribute (cleaned as the SDK cleans it)."""
        self.set_attributes({key: value})

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        """Set attributes (cleaned as the SDK cleans them; ignored with a warning once the span ended)."""
        if self._end_time is not None:
            logger.warning("Setting attribute on ended span.")
            return
        mine = self._attributes
        for key, value in attributes.items():
            if not (type(value) in _SCALARS and type(key) is str and key):
                keep, value = _clean(key, value)
                if not keep:
                    continue
            if key in mine:  # a key set again moves to the end, as in the SDK's attribute map
                del mine[key]
            elif len(mine) >= _MAX_ATTRIBUTES:
                logger.warning("Attributes dict is full. Dropping the oldest key-value pair from attributes.")
                del mine[next(iter(mine))]
            mine[key] = value

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        """Add an event (its attributes cleaned and frozen, as the SDK does)."""
        if not self._ended("add_event"):
            self._events.append(Event(name, BoundedAttributes(attributes=attributes, immutable=True), timestamp))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        """Links are not part of a stored span record: a link added later is left out (the SDK path keeps none
        either, since `agentlightning.Span` has no links)."""

    def update_name(self, name: str) -> None:
        """Rename the span."""
        self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """Set the status (``OK`` is final and ``UNSET`` is ignored, as in the SDK)."""
        if self._ended("set_status"):
            return
        if self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is StatusCode.UNSET:
                return
            if description is not None:
                logger.warning("Description %s ignored; use a `Status` or `(StatusCode, description)`", description)
            self._status = status
        elif status is not StatusCode.UNSET:
            self._status = Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """Record an exception as an ``exception`` event (the SDK's attributes: type, message, stack trace)."""
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        recorded: dict[str, Any] = {
            "exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            recorded.update(attributes)
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        """End the span and queue its record for the rollout's store (a second call warns and does nothing)."""
        if self._end_time is not None:
            logger.warning("Calling end() on an ended span.")
            return
        self._end_time = end_time if end_time is not None else time.time_ns()
        self._processor.on_end(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        """End the span; an exception is recorded first (per ``record_exception`` / ``set_status_on_exception``)."""
        if exc_val is not None and self.is_recording():
            if self._record_exception:
                self.record_exception(exc_val, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        super().__exit__(exc_type, exc_val, exc_tb)


class LightTracer(trace.Tracer):
    """A tracer that records spans of a rollout as `LightSpan` s, and everything else through the SDK tracer.

    Args:
        sdk: The SDK tracer of the same scope (spans outside a rollout, other kinds, links, or whenever the
            provider has a processor besides ours).
        processor: Our span processor.
        scope: The instrumentation scope of ``sdk``.
        light_allowed: Whether light spans may be made now (see the module).
    """

    def __init__(
        self,
        sdk: trace.Tracer,
        processor: LightningSpanProcessor,
        scope: InstrumentationScope,
        light_allowed: Any,
    ) -> None:
        self.sdk = sdk
        self._processor = processor
        self._scope = scope
        self._light_allowed = light_allowed

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        """A `LightSpan` inside a rollout when allowed, else the SDK tracer's span (same arguments)."""
        if kind is SpanKind.INTERNAL and not links and self._light_allowed():
            span = self._start_light(name, context, attributes, start_time, record_exception, set_status_on_exception)
            if span is not None:
                return span
        return self.sdk.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )

    def _start_light(
        self,
        name: str,
        context: otel_context.Context | None,
        attributes: types.Attributes,
        start_time: int | None,
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> LightSpan | None:
        processor = self._processor
        ctx: RolloutContext | None = processor.rollout_of(context)
        if ctx is None:
            return None  # outside a rollout: the SDK span (counted as dropped by our processor, as ever)
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            sc = SpanContext(parent.trace_id, _span_id(), False, _SAMPLED, parent.trace_state)
            parent_sc: SpanContext | None = parent
        else:
            sc = SpanContext(_trace_id(), _span_id(), False, _SAMPLED)
            parent_sc = None
        span = LightSpan(
            processor,
            name,
            sc,
            parent_sc,
            self._scope,
            start_time if start_time is not None else time.time_ns(),
            record_exception,
            set_status_on_exception,
        )
        if attributes:
            span.set_attributes(attributes)
        processor.stamp(ctx, span, sc, parent_sc, span.attributes.get(semconv.GEN_AI_AGENT_NAME))
        return span

    @contextlib.contextmanager
    def start_as_current_span(  # pyright: ignore[reportIncompatibleMethodOverride] - the API's private decorator
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Generator[trace.Span]:
        """`start_span`, made the current span for the ``with`` body (as the SDK tracer does)."""
        span = self.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current
