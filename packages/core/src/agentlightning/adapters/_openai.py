"""Spans for raw ``openai`` client calls, through OpenLLMetry's ``opentelemetry-instrumentation-openai``.

The instrumentation makes one ``openai.chat`` span per request, with ``gen_ai.response.id`` set from the
response (streams included). The tracer we hand it maps that span to our conventions:

- standalone (no framework LLM span encloses it): the span becomes an LLM span (``SPAN_KIND=llm``), which the
  transition builder joins to the proxy's ``LLMCall`` by response id;
- under a live LLM span of a framework adapter (the Agents SDK's generation span, LangChain's chat model span):
  no span is recorded; what the instrumentation would write on it only hands the response id, model and token
  usage up to that LLM span, so each call is counted (and paid for) once and the framework's span becomes
  joinable.

The instrumentation runs lean: no message contents, no metrics, no trace header injection, no event per
streamed chunk, and two per-call costs that change no recorded attribute are removed (`_lean_instrumentation`).

Framework adapters whose own LLM spans lack the response id turn the hook on with
:func:`acquire_openai_hook` (reference counted); users call :func:`instrument_openai`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
import logging
import os
import sys
import threading
import traceback
from collections.abc import Generator, Mapping
from typing import Any, ClassVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import Span as SdkSpan

from agentlightning import semconv
from agentlightning.adapters._base import Adapter, UnsupportedVersionError
from agentlightning.adapters._otel import is_llm_span, lightning_provider, pending_llm_spans

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
_CHUNK_EVENT = "gen_ai.content.completion.chunk"
_INSTALL = "pip install 'agentlightning-core[openai]'"


_FORWARDED = frozenset(
    {
        semconv.GEN_AI_RESPONSE_ID,
        semconv.GEN_AI_RESPONSE_MODEL,
        semconv.GEN_AI_USAGE_INPUT_TOKENS,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
    }
)


class _RelaySpan(trace.Span):
    """The client span of a call that a framework LLM span already records: it records nothing itself.

    It only hands the response id, response model and token usage up to that framework span (when the span
    lacks them), so no second span per call is built, processed and stored. Code running under it sees the
    framework span as its parent.
    """

    __slots__ = ("_target",)

    def __init__(self, target: SdkSpan) -> None:
        self._target = target

    def get_span_context(self) -> trace.SpanContext:
        return self._target.get_span_context()

    def set_attribute(self, key: str, value: Any) -> None:
        if key in _FORWARDED and value is not None:
            target = self._target
            if target.is_recording():
                attributes = target.attributes
                if attributes is None or attributes.get(key) is None:
                    target.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        return None

    def update_name(self, name: str) -> None:
        return None

    def is_recording(self) -> bool:
        return self._target.is_recording()

    def set_status(self, status: Any, description: str | None = None) -> None:
        return None

    def record_exception(
        self, exception: BaseException, attributes: Any = None, timestamp: int | None = None, escaped: bool = False
    ) -> None:
        return None

    def end(self, end_time: int | None = None) -> None:
        return None


class _ClientSpan(trace.Span):
    """A recorded client span, minus the attribute-less event the instrumentation adds for every streamed chunk.

    Hundreds of those per streamed call would each cost an event on the hot path and a record in the store.
    """

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def __getattr__(self, name: str) -> Any:  # SDK extras (``attributes``, ``name``...) of the real span
        return getattr(self._span, name)

    def get_span_context(self) -> trace.SpanContext:
        return self._span.get_span_context()

    def set_attribute(self, key: str, value: Any) -> None:
        self._span.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self._span.set_attributes(attributes)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        if name != _CHUNK_EVENT:
            self._span.add_event(name, attributes, timestamp)

    def add_link(self, context: trace.SpanContext, attributes: Any = None) -> None:
        self._span.add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self._span.update_name(name)

    def is_recording(self) -> bool:
        return self._span.is_recording()

    def set_status(self, status: Any, description: str | None = None) -> None:
        self._span.set_status(status, description)

    def record_exception(
        self, exception: BaseException, attributes: Any = None, timestamp: int | None = None, escaped: bool = False
    ) -> None:
        self._span.record_exception(exception, attributes, timestamp, escaped)

    def end(self, end_time: int | None = None) -> None:
        self._span.end(end_time)


class _Gate:
    """What the hook's tracers do: nothing while off; standalone client spans become LLM spans."""

    def __init__(self) -> None:
        self.on = False
        self.standalone = False


_STANDALONE = {semconv.ADAPTER_NAME: "openai", semconv.SPAN_KIND: semconv.KIND_LLM, semconv.GEN_AI_OPERATION: "chat"}
_STRAY = {semconv.ADAPTER_NAME: "openai"}


class _GatedTracer(trace.Tracer):
    """The instrumentation's tracer: maps each client span onto our conventions (see the module docstring).

    Off, it hands out the invalid span (no-op). Under a live framework LLM span (the current span, or one
    registered in ``pending_llm_spans``) it hands out a `_RelaySpan`. Otherwise it starts a real span, an LLM
    span when standalone client spans are wanted, a plain one (a stray call, not one to train on) when not.
    """

    def __init__(self, real: trace.Tracer, gate: _Gate) -> None:
        self._real = real
        self._gate = gate

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: Any = None,
        links: Any = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        gate = self._gate
        if not gate.on:
            return trace.INVALID_SPAN
        parent = trace.get_current_span(context)
        framework = parent if is_llm_span(parent) else pending_llm_spans.claim()
        if framework is not None:
            return _RelaySpan(framework)
        extra = _STANDALONE if gate.standalone else _STRAY
        return _ClientSpan(
            self._real.start_span(
                name,
                context,
                kind,
                {**attributes, **extra} if attributes else extra,
                links,
                start_time,
                record_exception,
                set_status_on_exception,
            )
        )

    @contextlib.contextmanager
    def start_as_current_span(  # pyright: ignore[reportIncompatibleMethodOverride]
        self,
        name: str,
        context: Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: Any = None,
        links: Any = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Generator[trace.Span]:
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


class _GatedTracerProvider(trace.TracerProvider):
    """Hands out `_GatedTracer`s over ``provider``."""

    def __init__(self, provider: trace.TracerProvider, gate: _Gate) -> None:
        self._provider = provider
        self._gate = gate

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _GatedTracer(self._provider.get_tracer(*args, **kwargs), self._gate)


class _OpenAIHook:
    """Reference-counted switch for the OpenLLMetry instrumentation (and whether client spans stand alone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._standalone = 0
        self._instrumentor: Any = None
        self._gate = _Gate()
        self._set_content_env = False

    def acquire(self, standalone: bool) -> None:
        with self._lock:
            if self._count == 0:
                self._start()
            self._count += 1
            self._standalone += int(standalone)
            self._gate.standalone = self._standalone > 0

    def release(self, standalone: bool) -> None:
        with self._lock:
            if self._count == 0:
                return
            self._count -= 1
            self._standalone = max(0, self._standalone - int(standalone))
            self._gate.standalone = self._standalone > 0
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

    def _stop(self) -> None:
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
    # Only where the module's one use of ``traceback`` is that log argument (what this was checked against).
    if getattr(utils, "traceback", None) is traceback and _only_logs_tracebacks(utils):
        utils.traceback = _LazyTraceback()  # type: ignore[attr-defined]


def _only_logs_tracebacks(module: Any) -> bool:
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return False
    return source.count("traceback.") == 1 and source.count("traceback.format_exc(),") == 1


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
