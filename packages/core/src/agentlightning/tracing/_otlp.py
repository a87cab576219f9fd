"""Send spans to any OpenTelemetry collector too (OTLP over HTTP), for users who keep their own trace viewer.

Spans still go to the store as always; this adds a second, independent exporter (a standard
``BatchSpanProcessor`` with the OTLP/HTTP exporter) to Agent Lightning's tracer provider, so Jaeger, Phoenix,
Langfuse or any OTLP collector sees the same spans with the same ``gen_ai.*`` / ``agentlightning.*``
attributes.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from agentlightning.tracing._provider import get_tracer_provider

__all__ = [
    "OTLP_ENDPOINT_ENV",
    "OTLP_INSTALL",
    "export_to_otlp",
    "flush_otlp",
    "otlp_endpoint_from_env",
    "stop_otlp_export",
]

logger = logging.getLogger(__name__)

OTLP_ENDPOINT_ENV = "AGL_OTLP_ENDPOINT"
"""Environment variable naming the collector (e.g. ``http://localhost:4318``); the runner reads it."""

OTLP_INSTALL = 'pip install "agentlightning-core[otlp]"'
"""How to install the optional exporter (it brings ``opentelemetry-exporter-otlp-proto-http``)."""

_lock = threading.Lock()
_processors: dict[str, _Switchable] = {}  # traces URL -> its processor


class _Switchable(SpanProcessor):
    """A span processor that can be switched off for good (the SDK provider cannot remove a processor).

    An `OwnSpanReader`: while on, it reads our own spans (so they take the SDK path); once off, light spans again.
    """

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.active = True

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.active:
            self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self.active:
            self.inner.on_end(span)

    def shutdown(self) -> None:
        self.active = False
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis) if self.active else True

    def reads_own_spans(self) -> bool:
        return self.active


def otlp_endpoint_from_env() -> str | None:
    """The collector named by ``AGL_OTLP_ENDPOINT``, or ``None`` when it is unset or empty."""
    return os.environ.get(OTLP_ENDPOINT_ENV) or None


def _traces_url(endpoint: str) -> str:
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"OTLP endpoint must be an http:// or https:// URL, got {endpoint!r}")
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


def export_to_otlp(endpoint: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> str:
    """Also export every span of Agent Lightning's tracer provider to an OTLP/HTTP collector (idempotent).

    Args:
        endpoint: The collector's base URL (``http://localhost:4318``; ``/v1/traces`` is appended) or the full
            traces URL.
        headers: Extra HTTP headers (e.g. an API key for a hosted collector).
        timeout: Seconds one export request may take.

    Returns:
        The traces URL spans are sent to.

    Raises:
        ImportError: ``opentelemetry-exporter-otlp-proto-http`` is not installed (the message says how).
        ValueError: ``endpoint`` is not an http(s) URL.
    """
    url = _traces_url(endpoint)
    with _lock:
        if url in _processors:
            return url
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ImportError(
                f"exporting spans to an OpenTelemetry collector needs the OTLP/HTTP exporter: {OTLP_INSTALL}"
            ) from exc
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        processor = _Switchable(BatchSpanProcessor(OTLPSpanExporter(endpoint=url, headers=headers, timeout=timeout)))
        get_tracer_provider().add_span_processor(processor)
        _processors[url] = processor
    logger.info("spans are also exported to the OTLP collector at %s", url)
    return url


def flush_otlp(timeout: float = 30.0) -> bool:
    """Send every span the OTLP exporters still hold; returns ``False`` if one did not finish in time."""
    with _lock:
        processors = list(_processors.values())
    return all(processor.force_flush(int(timeout * 1000)) for processor in processors)


def stop_otlp_export(endpoint: str | None = None) -> None:
    """Send what is pending and stop exporting to ``endpoint`` (``None``: to every collector)."""
    with _lock:
        urls = list(_processors) if endpoint is None else [_traces_url(endpoint)]
        stopped = [_processors.pop(url) for url in urls if url in _processors]
    for processor in stopped:
        processor.shutdown()
