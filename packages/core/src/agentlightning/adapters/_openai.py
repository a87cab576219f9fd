"""Spans for raw ``openai`` client calls, through OpenLLMetry's ``opentelemetry-instrumentation-openai``.

The instrumentation makes one ``openai.chat`` span per request, with ``gen_ai.response.id`` set from the
response (streams included). A small span processor maps it to our conventions:

- standalone (no framework LLM span encloses it): the span becomes an LLM span (``SPAN_KIND=llm``), which the
  transition builder joins to the proxy's ``LLMCall`` by response id;
- nested under a live LLM span of a framework adapter (the Agents SDK's generation span, for instance): the
  span stays a plain child and hands its response id and token usage up to that LLM span, so each call is
  counted once and the framework's span becomes joinable.

Framework adapters whose own LLM spans lack the response id turn the hook on with
:func:`acquire_openai_hook` (reference counted); users call :func:`instrument_openai`.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import threading
import traceback
from typing import Any, ClassVar

from opentelemetry import trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import Span as SdkSpan

from agentlightning import semconv
from agentlightning.adapters._base import Adapter, UnsupportedVersionError
from agentlightning.adapters._otel import (
    GatedSpanProcessor,
    add_processor_once,
    is_llm_span,
    lightning_provider,
    pending_llm_spans,
)

__all__ = [
    "OpenAIAdapter",
    "acquire_openai_hook",
    "instrument_openai",
    "release_openai_hook",
    "uninstrument_openai",
]

logger = logging.getLogger(__name__)

_SCOPE_PREFIX = "opentelemetry.instrumentation.openai"
_CONTENT_ENV = "TRACELOOP_TRACE_CONTENT"
_METRICS_ENV = "TRACELOOP_METRICS_ENABLED"
_INSTALL = "pip install 'agentlightning-core[openai]'"


class _OpenAISpanMapper(GatedSpanProcessor):
    """Maps OpenLLMetry's openai spans onto our attribute names (see the module docstring)."""

    def __init__(self) -> None:
        self._nested: dict[int, SdkSpan] = {}
        self.standalone = False

    def on_start(self, span: SdkSpan, parent_context: Any = None) -> None:
        if not self.enabled:
            return
        scope = span.instrumentation_scope
        if scope is None or not scope.name.startswith(_SCOPE_PREFIX):
            return
        parent = trace.get_current_span(parent_context)
        span.set_attribute(semconv.ADAPTER_NAME, "openai")
        framework_span = parent if is_llm_span(parent) else pending_llm_spans.claim()
        if isinstance(framework_span, SdkSpan):
            self._nested[span.get_span_context().span_id] = framework_span
            return
        if not self.standalone:
            return  # only framework adapters hold the hook: a stray client span is not a call to train on
        span.set_attribute(semconv.SPAN_KIND, semconv.KIND_LLM)
        span.set_attribute(semconv.GEN_AI_OPERATION, "chat")

    def on_end(self, span: ReadableSpan) -> None:
        if not self._nested or span.context is None:
            return
        parent = self._nested.pop(span.context.span_id, None)
        if parent is None or not parent.is_recording():
            return
        mine = span.attributes or {}
        theirs = parent.attributes or {}
        for key in (
            semconv.GEN_AI_RESPONSE_ID,
            semconv.GEN_AI_RESPONSE_MODEL,
            semconv.GEN_AI_USAGE_INPUT_TOKENS,
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
        ):
            value = mine.get(key)
            if value is not None and theirs.get(key) is None:
                parent.set_attribute(key, value)


class _Gate:
    on = False


class _GatedTracer(trace.Tracer):
    """Delegates to the real tracer while the gate is on, to a no-op tracer otherwise."""

    def __init__(self, real: trace.Tracer, gate: _Gate) -> None:
        self._real = real
        self._gate = gate
        self._noop = trace.NoOpTracer()

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return (self._real if self._gate.on else self._noop).start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return (self._real if self._gate.on else self._noop).start_as_current_span(*args, **kwargs)


class _GatedTracerProvider(trace.TracerProvider):
    """Hands out `_GatedTracer`s over ``provider``."""

    def __init__(self, provider: trace.TracerProvider, gate: _Gate) -> None:
        self._provider = provider
        self._gate = gate

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _GatedTracer(self._provider.get_tracer(*args, **kwargs), self._gate)


class _OpenAIHook:
    """Reference-counted switch for the OpenLLMetry instrumentation and our mapper."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._standalone = 0
        self._mapper = _OpenAISpanMapper()
        self._instrumentor: Any = None
        self._gate = _Gate()
        self._set_content_env = False

    def acquire(self, standalone: bool) -> None:
        with self._lock:
            if self._count == 0:
                self._start()
            self._count += 1
            self._standalone += int(standalone)
            self._mapper.standalone = self._standalone > 0

    def release(self, standalone: bool) -> None:
        with self._lock:
            if self._count == 0:
                return
            self._count -= 1
            self._standalone = max(0, self._standalone - int(standalone))
            self._mapper.standalone = self._standalone > 0
            if self._count == 0:
                self._stop()

    def _start(self) -> None:
        try:
            from opentelemetry.instrumentation.openai import OpenAIInstrumentor
        except ImportError as exc:
            raise UnsupportedVersionError(
                f"OpenAI call tracing needs opentelemetry-instrumentation-openai ({exc}). Install it with: {_INSTALL}"
            ) from exc
        provider = lightning_provider()
        add_processor_once(provider, self._mapper)
        # Message contents make spans large and slow; keep them off unless the user asked for them.
        if _CONTENT_ENV not in os.environ:
            os.environ[_CONTENT_ENV] = "false"
            self._set_content_env = True
        if self._instrumentor is None:
            # Wrapped once per process: the instrumentation's uninstrument() does not unwrap under wrapt 2, so a
            # second instrument() would wrap twice. Off means the gated provider hands out no-op spans.
            # Lean: no trace header injection, no metrics (read once, at instrument time), no content.
            self._instrumentor = OpenAIInstrumentor(enable_trace_context_propagation=False)
            metrics_env = os.environ.get(_METRICS_ENV)
            os.environ[_METRICS_ENV] = "false"
            try:
                self._instrumentor.instrument(
                    tracer_provider=_GatedTracerProvider(provider, self._gate), meter_provider=NoOpMeterProvider()
                )
            finally:
                if metrics_env is None:
                    os.environ.pop(_METRICS_ENV, None)
                else:
                    os.environ[_METRICS_ENV] = metrics_env
            _lean_instrumentation()
        self._gate.on = True
        self._mapper.enabled = True

    def _stop(self) -> None:
        self._mapper.enabled = False
        self._gate.on = False
        if self._set_content_env:
            os.environ.pop(_CONTENT_ENV, None)
            self._set_content_env = False


class _LazyTraceback:
    """Stands in for the ``traceback`` module inside the instrumentation's ``dont_throw`` helper.

    That helper logs every exception it swallows as ``logger.debug(..., traceback.format_exc())``, which formats
    the traceback (tens of microseconds) even when debug logging is off. Some servers (vLLM without prompt token
    details) make it swallow one exception on every call; here the traceback is formatted only if the record
    is actually emitted.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)

    @staticmethod
    def format_exc(limit: int | None = None, chain: bool = True) -> object:
        return _FormatOnStr(sys.exc_info(), limit, chain)


class _FormatOnStr:
    __slots__ = ("_chain", "_exc_info", "_limit")

    def __init__(self, exc_info: Any, limit: int | None, chain: bool) -> None:
        self._exc_info = exc_info
        self._limit = limit
        self._chain = chain

    def __str__(self) -> str:
        return "".join(traceback.format_exception(*self._exc_info, limit=self._limit, chain=self._chain))


def _lean_instrumentation() -> None:
    """Take per-call costs out of the instrumentation that do not change a single recorded attribute.

    - ``is_openai_v1()`` / ``is_reasoning_supported()`` parse two version strings on every call (five times per
      chat request, once per streamed chunk); the installed openai version cannot change, so they become
      constants.
    - ``dont_throw`` formats a traceback for a debug line nobody reads (see `_LazyTraceback`).
    """
    from opentelemetry.instrumentation.openai import utils

    for name in ("is_openai_v1", "is_reasoning_supported"):
        original = getattr(utils, name, None)
        if not callable(original):
            continue
        value = bool(original())

        def constant(value: bool = value) -> bool:
            return value

        for module_name, module in list(sys.modules.items()):
            if module_name.startswith(_SCOPE_PREFIX) and getattr(module, name, None) is original:
                setattr(module, name, constant)
    if getattr(utils, "traceback", None) is traceback:
        utils.traceback = _LazyTraceback()  # type: ignore[attr-defined]


_HOOK = _OpenAIHook()


def acquire_openai_hook(*, standalone: bool = False) -> None:
    """Turn on openai client spans; pair every call with :func:`release_openai_hook` (same ``standalone``).

    Args:
        standalone: Client spans that no framework LLM span encloses become LLM spans themselves (for
            frameworks that make no LLM span of their own, e.g. AutoGen). Without it (and without
            :func:`instrument_openai`), client spans only hand their response id to the enclosing framework
            LLM span (the current span, or the oldest live one registered in ``pending_llm_spans``).

    Raises:
        UnsupportedVersionError: ``opentelemetry-instrumentation-openai`` is not installed.
    """
    _HOOK.acquire(standalone)


def release_openai_hook(*, standalone: bool = False) -> None:
    """Undo one :func:`acquire_openai_hook`; the instrumentation goes off when nobody holds it."""
    _HOOK.release(standalone)


class OpenAIAdapter(Adapter):
    """Adapter for agents that call the ``openai`` client directly (no framework)."""

    NAME: ClassVar[str] = "openai"
    FRAMEWORK: ClassVar[str] = "openai"
    SUPPORTED_RANGE: ClassVar[str] = ">=1.50,<4"
    INSTALL: ClassVar[str] = "pip install 'agentlightning-core[openai]' 'openai>=1.50,<4'"
    LOW_LEVEL: ClassVar[bool] = True

    @classmethod
    def check_version(cls, version: str | None = None) -> str:
        """Check openai's version and that the OpenLLMetry instrumentation is installed."""
        found = super().check_version(version)
        try:
            importlib.metadata.version("opentelemetry-instrumentation-openai")
        except importlib.metadata.PackageNotFoundError as exc:
            raise UnsupportedVersionError(
                f"The openai adapter needs opentelemetry-instrumentation-openai, which is not installed. "
                f"Install it with: {_INSTALL}"
            ) from exc
        return found

    def _instrument(self) -> None:
        acquire_openai_hook(standalone=True)

    def _uninstrument(self) -> None:
        release_openai_hook(standalone=True)


def instrument_openai() -> OpenAIAdapter:
    """Record every ``openai`` chat/completions call made inside a rollout as an LLM span (idempotent).

    Returns:
        The process-wide adapter (call ``uninstrument()`` on it, or :func:`uninstrument_openai`).
    """
    adapter = OpenAIAdapter.default()
    adapter.instrument()
    assert isinstance(adapter, OpenAIAdapter)
    return adapter


def uninstrument_openai() -> None:
    """Stop recording ``openai`` calls started by :func:`instrument_openai` (idempotent)."""
    OpenAIAdapter.default().uninstrument()
