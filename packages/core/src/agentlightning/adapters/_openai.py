"""Spans for raw ``openai`` client calls: a small instrumentation of the client's public request methods.

While the hook is held, ``chat.completions.create`` / ``chat.completions.parse``, ``responses.create`` /
``responses.parse`` and ``completions.create`` of the
sync and async clients (the classes ``openai.resources.chat.Completions`` ... as exported by ``openai``) are
wrapped. Inside a rollout each call maps onto our conventions:

- standalone (no framework LLM span encloses it): one span per call, an LLM span (``SPAN_KIND=llm``) carrying
  ``gen_ai.response.id``, which the transition builder joins to the proxy's ``LLMCall``;
- under a live LLM span of a framework adapter (the Agents SDK's generation span, LangChain's chat model span,
  found as the current span or in `pending_llm_spans`): no span is recorded; the response id, response model
  and token usage are handed up to that span, so each call is counted once and the framework's span becomes
  joinable.

Streams (``stream=True``) are handed back wrapped: the id comes from the first chunk, usage from the chunk that
carries it, and the span ends when the stream is exhausted or closed. Nothing else is recorded: no message
contents, no metrics, no trace headers, no per-chunk events. A call made under an agent span (a LangGraph node, an
Agents SDK agent, an AutoGen agent) carries one request header, `agentlightning.AGENT_HEADER`, naming that agent:
the LLM proxy routes the call to the agent's policy with it (`agentlightning.PolicyMap`). Outside a rollout, or
with the hook off, the wrapper calls straight through. The original methods are put back when nobody holds the hook.

Framework adapters whose own LLM spans lack the response id turn the hook on with :func:`acquire_openai_hook`
(reference counted); users call :func:`instrument_openai`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, ClassVar, cast

from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.trace import Status, StatusCode, Tracer, get_current_span

from agentlightning import semconv
from agentlightning._policies import AGENT_HEADER, encode_agent_header
from agentlightning.adapters._base import Adapter, UnsupportedVersionError, supported_range
from agentlightning.adapters._otel import is_llm_span, pending_llm_spans
from agentlightning.tracing import agent_of_span, current_rollout
from agentlightning.tracing._genai import client_calls_recorded, is_source_span, live_agent_name
from agentlightning.tracing._light import LightSpan
from agentlightning.tracing._provider import light_tracer

__all__ = [
    "OpenAIAdapter",
    "acquire_openai_hook",
    "instrument_openai",
    "release_openai_hook",
    "uninstrument_openai",
]

logger = logging.getLogger(__name__)

_INSTALL = "pip install 'agentlightning-core[openai]'"

# (module, class, method, gen_ai.operation.name): the public request methods that are wrapped.
_TARGETS = (
    ("openai.resources.chat", "Completions", "create", "chat"),
    ("openai.resources.chat", "AsyncCompletions", "create", "chat"),
    ("openai.resources.chat", "Completions", "parse", "chat"),
    ("openai.resources.chat", "AsyncCompletions", "parse", "chat"),
    ("openai.resources", "Completions", "create", "text_completion"),
    ("openai.resources", "AsyncCompletions", "create", "text_completion"),
    ("openai.resources.responses", "Responses", "create", "chat"),
    ("openai.resources.responses", "AsyncResponses", "create", "chat"),
    ("openai.resources.responses", "Responses", "parse", "chat"),
    ("openai.resources.responses", "AsyncResponses", "parse", "chat"),
)


def _in_chain(cls: type, method: str, wrapper: Any) -> bool:
    """Whether ``wrapper`` is ``cls.method`` or lies under it in a chain of ``__wrapped__`` links."""
    found = cls.__dict__.get(method)
    for _ in range(32):  # a chain deeper than this is no chain of wrappers
        if found is wrapper:
            return True
        found = getattr(found, "__wrapped__", None)
        if found is None:
            return False
    return False


class _Sink:
    """Where what a call returns is written: our own span (`_SpanSink`) or a framework span (`_RelaySink`)."""

    __slots__ = ("done", "seen_id", "span")

    def __init__(self, span: SdkSpan | LightSpan) -> None:
        self.span = span
        self.seen_id = False
        self.done = False

    def _set(self, attributes: dict[str, Any]) -> None:
        self.span.set_attributes(attributes)

    def record(self, obj: Any) -> None:
        """Take the response id, model and usage from a response or a streamed chunk (or a Responses stream event
        that carries the response: ``response.created``, ``response.completed``...)."""
        inner = getattr(obj, "response", None)
        if inner is not None and isinstance(getattr(obj, "type", None), str):
            obj = inner
        found: dict[str, Any] = {}
        if not self.seen_id:
            response_id = getattr(obj, "id", None)
            if response_id:
                self.seen_id = True
                found[semconv.GEN_AI_RESPONSE_ID] = str(response_id)
                model = getattr(obj, "model", None)
                if model:
                    found[semconv.GEN_AI_RESPONSE_MODEL] = str(model)
        usage = getattr(obj, "usage", None)
        if usage is not None:
            prompt, completion = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
            if prompt is None:  # the Responses API's names
                prompt, completion = getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None)
            if prompt is not None:
                found[semconv.GEN_AI_USAGE_INPUT_TOKENS] = prompt
            if completion is not None:
                found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = completion
        if found:  # one update (one lock) per response or chunk, not one per attribute
            self._set(found)

    def end(self, error: BaseException | None = None) -> None:
        """The call is over (the response arrived, or the stream ended or was closed)."""
        if self.done:
            return
        self.done = True
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.end()


class _RelaySink(_Sink):
    """Hands the call's ids up to an enclosing framework LLM span, where that span lacks them; records nothing."""

    __slots__ = ()

    def _set(self, attributes: dict[str, Any]) -> None:
        span = self.span
        if span.is_recording():
            present = span.attributes
            missing = {k: v for k, v in attributes.items() if present is None or present.get(k) is None}
            if missing:
                span.set_attributes(missing)

    def end(self, error: BaseException | None = None) -> None:
        self.done = True


class _Hook:
    """Reference-counted switch of the client wrapping (and whether client spans stand alone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._standalone = 0
        self.standalone = False
        self._tracer: Tracer | None = None
        self._originals: list[tuple[type, str, Any, Any]] = []  # (class, method, original, wrapper)
        self._stream_types: tuple[type, type] | None = None

    # ------------------------------------------------------------------ reference counting
    def acquire(self, standalone: bool) -> None:
        with self._lock:
            if self._count == 0:
                self._patch()
            self._count += 1
            self._standalone += int(standalone)
            self.standalone = self._standalone > 0

    def release(self, standalone: bool) -> None:
        with self._lock:
            if self._count == 0:
                return
            self._count -= 1
            self._standalone = max(0, self._standalone - int(standalone))
            self.standalone = self._standalone > 0
            if self._count == 0:
                self._unpatch()

    # ------------------------------------------------------------------ wrapping
    def _patch(self) -> None:
        try:
            import openai
        except ImportError as exc:
            raise UnsupportedVersionError(
                f"OpenAI call tracing needs openai ({exc}). Install it with: {_INSTALL}"
            ) from exc
        if self._tracer is None:
            self._tracer = light_tracer("agentlightning.openai")
        if self._stream_types is None:
            self._stream_types = (openai.Stream, openai.AsyncStream)
        # An entry whose wrapper is no longer reachable (another library restored the method it saved before us)
        # is forgotten, so the method is wrapped again instead of being taken as wrapped.
        self._originals = [entry for entry in self._originals if _in_chain(entry[0], entry[1], entry[3])]
        installed = {(cls, method) for cls, method, _, _ in self._originals}
        for module_name, class_name, method, operation in _TARGETS:
            cls = getattr(importlib.import_module(module_name), class_name, None)
            original = getattr(cls, method, None) if isinstance(cls, type) else None
            if cls is None or original is None or (cls, method) in installed:
                continue  # an older client without this method, or our wrapper left in place under another one
            # by class: the async methods are wrapped by a sync decorator in the client, so they do not look async
            if class_name.startswith("Async"):
                wrapper = self._wrap_async(original, operation)
            else:
                wrapper = self._wrap_sync(original, operation)
            setattr(cls, method, wrapper)
            self._originals.append((cls, method, original, wrapper))

    def _unpatch(self) -> None:
        for cls, method, original, wrapper in reversed(self._originals):
            if cls.__dict__.get(method) is wrapper:
                setattr(cls, method, original)
            else:  # someone wrapped over us: leave the chain intact; our wrapper calls straight through while off
                logger.debug("%s.%s was wrapped again after us; left in place", cls.__name__, method)
        self._originals = [entry for entry in self._originals if entry[0].__dict__.get(entry[1]) is entry[3]]

    def _begin(self, operation: str, kwargs: dict[str, Any]) -> _Sink | None:
        """The sink of a call starting now, or ``None`` when it is not traced (off, or outside a rollout)."""
        if self._count == 0 or current_rollout() is None:
            return None
        parent = get_current_span()
        if not is_llm_span(parent):
            framework = pending_llm_spans.claim()
        elif is_source_span(parent):  # another instrumentation's client span: a framework span of ours comes first
            framework = pending_llm_spans.claim() or parent
        else:
            framework = parent
        _name_agent(kwargs, framework or parent)
        if framework is not None:
            return _RelaySink(framework)
        if client_calls_recorded():  # the app's own client instrumentation records this call: one span per call
            return None
        tracer = self._tracer
        assert tracer is not None
        model = kwargs.get("model")
        attributes: dict[str, Any] = {
            semconv.ADAPTER_NAME: "openai",
            semconv.GEN_AI_SYSTEM: "openai",
            semconv.GEN_AI_OPERATION: operation,
        }
        if self.standalone:
            attributes[semconv.SPAN_KIND] = semconv.KIND_LLM
        if isinstance(model, str):
            attributes[semconv.GEN_AI_REQUEST_MODEL] = model
        span = tracer.start_span(f"{operation} {model}" if isinstance(model, str) else operation, attributes=attributes)
        if not isinstance(span, SdkSpan | LightSpan):  # pragma: no cover - our provider is always the SDK's
            return None
        return _Sink(span)

    def _finish(self, sink: _Sink, result: Any) -> Any:
        """Record a returned response (or wrap a returned stream so it records as it is read)."""
        stream_types = self._stream_types
        assert stream_types is not None
        if isinstance(result, stream_types[0]):
            return _traced_stream_types()[0](result, sink)
        if isinstance(result, stream_types[1]):
            return _traced_stream_types()[1](result, sink)
        if getattr(result, "id", None) is None:
            parse = getattr(result, "parse", None)  # ``with_raw_response``: the parsed body is cached, parse it now
            if callable(parse) and not inspect.iscoroutinefunction(parse):
                parsed = parse()
                if isinstance(parsed, stream_types):
                    logger.debug("a raw-response stream is not traced: no response id recorded")
                else:
                    sink.record(parsed)
        else:
            sink.record(result)
        sink.end()
        return result

    def _wrap_sync(self, original: Callable[..., Any], operation: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def traced(resource: Any, *args: Any, **kwargs: Any) -> Any:
            sink = self._begin(operation, kwargs)
            if sink is None:
                return original(resource, *args, **kwargs)
            try:
                result = original(resource, *args, **kwargs)
            except BaseException as exc:
                sink.end(exc)
                raise
            return self._finish(sink, result)

        return traced

    def _wrap_async(self, original: Callable[..., Any], operation: str) -> Callable[..., Any]:
        @functools.wraps(original)
        async def traced(resource: Any, *args: Any, **kwargs: Any) -> Any:
            sink = self._begin(operation, kwargs)
            if sink is None:
                return await original(resource, *args, **kwargs)
            try:
                result = await original(resource, *args, **kwargs)
            except BaseException as exc:
                sink.end(exc)
                raise
            return self._finish(sink, result)

        return traced


def _name_agent(kwargs: dict[str, Any], span: Any) -> None:
    """Add the agent making the call (known from the adapter's agent span, or from what a span source wrote on the
    call's LLM span: `SpanSource.AGENT_ATTRIBUTE`) as a request header for the proxy.

    The LLM proxy routes the call to that agent's policy (`agentlightning.PolicyMap`); an ``extra_headers`` the
    caller passes keeps its own entries (and its own agent header, if it sets one).
    """
    # A span source's agent spans may be named only after they start: it names the agent on its LLM span then, and
    # that name wins over one the span inherited at its start (the rollout's, when no agent span was named yet).
    agent = live_agent_name(span) or agent_of_span(span)
    if agent is None:
        return
    extra = kwargs.get("extra_headers")
    headers: dict[str, Any] = dict(cast(dict[str, Any], extra)) if isinstance(extra, dict) else {}
    headers.setdefault(AGENT_HEADER, encode_agent_header(agent))
    kwargs["extra_headers"] = headers


@functools.cache
def _traced_stream_types() -> tuple[type, type]:
    """Subclasses of ``openai.Stream`` / ``openai.AsyncStream`` that record chunks (built once openai is there).

    They subclass the client's own stream types so ``isinstance`` checks in frameworks still hold; everything
    but iteration and closing is delegated to the wrapped stream.
    """
    import openai

    class TracedStream(openai.Stream[Any]):
        def __init__(self, inner: Any, sink: _Sink) -> None:  # no super().__init__: it would open the body
            self._agl_inner = inner
            self._agl_sink = sink

        def __getattr__(self, name: str) -> Any:
            return getattr(self.__dict__["_agl_inner"], name)

        def __iter__(self) -> Any:
            return self

        def __next__(self) -> Any:
            try:
                chunk = next(self._agl_inner)
            except StopIteration:
                self._agl_sink.end()
                raise
            except BaseException as exc:
                self._agl_sink.end(exc)
                raise
            self._agl_sink.record(chunk)
            return chunk

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc_info: Any) -> None:
            self.close()

        def close(self) -> None:
            try:
                self._agl_inner.close()
            finally:
                self._agl_sink.end()

    class AsyncTracedStream(openai.AsyncStream[Any]):
        def __init__(self, inner: Any, sink: _Sink) -> None:  # no super().__init__: it would open the body
            self._agl_inner = inner
            self._agl_sink = sink

        def __getattr__(self, name: str) -> Any:
            return getattr(self.__dict__["_agl_inner"], name)

        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> Any:
            try:
                chunk = await self._agl_inner.__anext__()
            except StopAsyncIteration:
                self._agl_sink.end()
                raise
            except BaseException as exc:
                self._agl_sink.end(exc)
                raise
            self._agl_sink.record(chunk)
            return chunk

        async def __aenter__(self) -> Any:
            return self

        async def __aexit__(self, *exc_info: Any) -> None:
            await self.close()

        async def close(self) -> None:
            try:
                await self._agl_inner.close()
            finally:
                self._agl_sink.end()

    return TracedStream, AsyncTracedStream


_HOOK = _Hook()


def acquire_openai_hook(*, standalone: bool = False) -> None:
    """Turn on openai client tracing; pair every call with :func:`release_openai_hook` (same ``standalone``).

    Args:
        standalone: Client calls that no framework LLM span encloses become LLM spans themselves (for
            frameworks that make no LLM span of their own, e.g. AutoGen). Without it (and without
            :func:`instrument_openai`), client calls only hand their response id to the enclosing framework
            LLM span (the current span, or the oldest live one registered in ``pending_llm_spans``).

    Raises:
        UnsupportedVersionError: ``openai`` is not installed.
    """
    _HOOK.acquire(standalone)


def release_openai_hook(*, standalone: bool = False) -> None:
    """Undo one :func:`acquire_openai_hook`; the client methods are restored when nobody holds the hook."""
    _HOOK.release(standalone)


class OpenAIAdapter(Adapter):
    """Adapter for agents that call the ``openai`` client directly (no framework)."""

    NAME: ClassVar[str] = "openai"
    FRAMEWORK: ClassVar[str] = "openai"
    SUPPORTED_RANGE: ClassVar[str] = supported_range("agentlightning-core", "openai")
    INSTALL: ClassVar[str] = _INSTALL
    LOW_LEVEL: ClassVar[bool] = True

    def _instrument(self) -> None:
        acquire_openai_hook(standalone=True)

    def _uninstrument(self) -> None:
        release_openai_hook(standalone=True)


def instrument_openai() -> OpenAIAdapter:
    """Record every ``openai`` chat/completions/responses call made inside a rollout as an LLM span (idempotent).

    Returns:
        The process-wide adapter (call ``uninstrument()`` on it, or :func:`uninstrument_openai`).
    """
    adapter = OpenAIAdapter.default()
    adapter.instrument()
    return adapter


def uninstrument_openai() -> None:
    """Stop recording ``openai`` calls started by :func:`instrument_openai` (idempotent)."""
    OpenAIAdapter.default().uninstrument()
