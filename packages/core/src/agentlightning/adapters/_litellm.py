"""Spans for LiteLLM calls, through LiteLLM's public custom-callback API (``litellm.callbacks``).

LiteLLM reports a call after it finished, possibly from a worker thread or a separate task, so the callback
captures the caller's context when the call starts (``log_pre_api_call`` runs inline in the caller) and writes
the span inside that context at the end: the span then belongs to the caller's rollout and parent span. Each
call yields one LLM span with ``gen_ai.response.id`` (LiteLLM may report a call through both its sync and async
hooks; the first report wins).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import logging
import threading
from typing import Any, ClassVar, cast

from opentelemetry.trace import Status, StatusCode

from agentlightning import semconv
from agentlightning.adapters._base import Adapter, supported_range
from agentlightning.adapters._otel import lightning_tracer

__all__ = ["LiteLLMAdapter", "instrument_litellm", "uninstrument_litellm"]

logger = logging.getLogger(__name__)


def _ns(value: Any) -> int | None:
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1e9)
    if isinstance(value, (int, float)):
        return int(value * 1e9)
    return None


class _LightningLiteLLMCallback:
    """The callback object; built on first use as a subclass of LiteLLM's ``CustomLogger``."""

    def __init__(self) -> None:
        self.enabled = True
        self._tracer = lightning_tracer("agentlightning.litellm")
        self._contexts: dict[str, contextvars.Context] = {}
        self._lock = threading.Lock()

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: dict[str, Any]) -> None:
        call_id = kwargs.get("litellm_call_id")
        if self.enabled and call_id:
            with self._lock:
                self._contexts.setdefault(str(call_id), contextvars.copy_context())

    def _report(self, kwargs: dict[str, Any], response: Any, start: Any, end: Any, error: bool) -> None:
        call_id = kwargs.get("litellm_call_id")
        with self._lock:
            ctx = self._contexts.pop(str(call_id), None) if call_id else None
        if ctx is None or not self.enabled:
            return
        ctx.run(self._emit, kwargs, response, start, end, error)

    def _emit(self, kwargs: dict[str, Any], response: Any, start: Any, end: Any, error: bool) -> None:
        model = kwargs.get("model")
        attributes: dict[str, Any] = {
            semconv.SPAN_KIND: semconv.KIND_LLM,
            semconv.ADAPTER_NAME: "litellm",
            semconv.GEN_AI_OPERATION: "chat",
            semconv.GEN_AI_SYSTEM: kwargs.get("custom_llm_provider") or "litellm",
        }
        if model:
            attributes[semconv.GEN_AI_REQUEST_MODEL] = str(model)
        if not error and response is not None:
            response_id = getattr(response, "id", None)
            if response_id:
                attributes[semconv.GEN_AI_RESPONSE_ID] = str(response_id)
            if getattr(response, "model", None):
                attributes[semconv.GEN_AI_RESPONSE_MODEL] = str(response.model)
            usage = getattr(response, "usage", None)
            if usage is not None:
                attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] = getattr(usage, "prompt_tokens", None)
                attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = getattr(usage, "completion_tokens", None)
        attributes = {k: v for k, v in attributes.items() if v is not None}
        span = self._tracer.start_span(
            f"chat {model}" if model else "chat", attributes=attributes, start_time=_ns(start)
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, str(kwargs.get("exception") or response)))
        span.end(end_time=_ns(end))

    def log_success_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._report(kwargs, response_obj, start_time, end_time, error=False)

    def log_failure_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._report(kwargs, response_obj, start_time, end_time, error=True)

    async def async_log_pre_api_call(self, model: Any, messages: Any, kwargs: dict[str, Any]) -> None:
        self.log_pre_api_call(model, messages, kwargs)

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._report(kwargs, response_obj, start_time, end_time, error=False)

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._report(kwargs, response_obj, start_time, end_time, error=True)


class LiteLLMAdapter(Adapter):
    """Adapter for agents that call ``litellm.completion`` / ``acompletion`` directly."""

    NAME: ClassVar[str] = "litellm"
    FRAMEWORK: ClassVar[str] = "litellm"
    SUPPORTED_RANGE: ClassVar[str] = supported_range("agentlightning-core", "litellm")
    INSTALL: ClassVar[str] = "pip install 'agentlightning-core[litellm]'"
    LOW_LEVEL: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self._callback: Any = None

    def _instrument(self) -> None:
        import litellm
        from litellm.integrations.custom_logger import CustomLogger

        if self._callback is None:
            cls = type("LightningLiteLLMCallback", (_LightningLiteLLMCallback, CustomLogger), {})
            self._callback = cls()
        self._callback.enabled = True
        if self._callback not in litellm.callbacks:
            litellm.callbacks.append(self._callback)

    def pending(self) -> int:
        """LiteLLM calls started but not reported yet (LiteLLM reports from a background task or thread)."""
        return 0 if self._callback is None else len(self._callback._contexts)

    def _uninstrument(self) -> None:
        self._callback.enabled = False
        _remove_everywhere(self._callback)


def _callback_lists() -> list[list[Any]]:
    """Every list in LiteLLM that may hold a callback object.

    LiteLLM copies each entry of ``litellm.callbacks`` into its per-event lists (``input_callback``,
    ``success_callback``, ``_async_success_callback``, the failure lists...) on its next call, and
    ``litellm.utils`` keeps the first set it saw as ``callback_list``. The names differ between releases, so every
    module-level list whose name says "callback" is taken, rather than a fixed set that a release could outgrow.
    """
    import litellm
    import litellm.utils

    found: list[list[Any]] = []
    for module in (litellm, litellm.utils):
        for name, value in vars(module).items():
            if "callback" in name and isinstance(value, list) and not any(value is seen for seen in found):
                found.append(cast(list[Any], value))
    return found


def _remove_everywhere(callback: object) -> None:
    """Take ``callback`` out of every LiteLLM callback list (by identity), under LiteLLM's own lock when it has one."""
    import litellm

    manager = getattr(litellm, "logging_callback_manager", None)
    lock = getattr(manager, "callback_lists_lock", None) or contextlib.nullcontext()
    with lock:
        for entries in _callback_lists():
            entries[:] = [entry for entry in entries if entry is not callback]


def instrument_litellm() -> LiteLLMAdapter:
    """Record every LiteLLM call made inside a rollout as an LLM span (idempotent)."""
    adapter = LiteLLMAdapter.default()
    adapter.instrument()
    return adapter


def uninstrument_litellm() -> None:
    """Stop recording LiteLLM calls (idempotent)."""
    LiteLLMAdapter.default().uninstrument()
