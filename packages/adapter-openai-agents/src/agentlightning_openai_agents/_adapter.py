"""``instrument()`` for the OpenAI Agents SDK: register `LightningTracingProcessor` through its public API."""

from __future__ import annotations

import logging
from typing import ClassVar

from opentelemetry.sdk.trace import TracerProvider

from agentlightning.adapters import Adapter, acquire_openai_hook, release_openai_hook, supported_range
from agentlightning_openai_agents._processor import LightningTracingProcessor

__all__ = ["SUPPORTED_RANGE", "OpenAIAgentsAdapter", "instrument", "uninstrument"]

logger = logging.getLogger(__name__)

SUPPORTED_RANGE = supported_range("agentlightning-openai-agents", "openai-agents")
"""openai-agents versions this adapter supports (read from this package's dependency in pyproject.toml)."""


class OpenAIAgentsAdapter(Adapter):
    """Adapter for the OpenAI Agents SDK.

    Args:
        keep_openai_export: Keep the SDK's default processor that uploads traces to OpenAI. Off by default:
            training runs point the SDK at a local proxy and have no OpenAI key.
    """

    NAME: ClassVar[str] = "openai_agents"
    FRAMEWORK: ClassVar[str] = "openai-agents"
    SUPPORTED_RANGE: ClassVar[str] = SUPPORTED_RANGE
    INSTALL: ClassVar[str] = f"pip install agentlightning-openai-agents 'openai-agents{SUPPORTED_RANGE}'"

    def __init__(self, keep_openai_export: bool = False) -> None:
        super().__init__()
        self.keep_openai_export = keep_openai_export
        self._processor: LightningTracingProcessor | None = None
        self._replaced = False

    @property
    def processor(self) -> LightningTracingProcessor | None:
        """The registered processor (``None`` before the first ``instrument()``)."""
        return self._processor

    def _instrument(self) -> None:
        from agents.tracing import add_trace_processor, set_trace_processors

        # The Chat Completions path records no response id on its generation span: the client span hands it up.
        acquire_openai_hook()
        if self._processor is None:
            self._processor = LightningTracingProcessor(tracer_provider=self.tracer_provider)
            if not self.keep_openai_export:
                set_trace_processors([self._processor])  # public API: replaces the OpenAI upload processor
                self._replaced = True
            else:
                add_trace_processor(self._processor)
        else:
            self._processor.use_tracer_provider(self.tracer_provider)
            if self._replaced:
                set_trace_processors([self._processor])
        self._processor.enabled = True

    def _uninstrument(self) -> None:
        if self._processor is not None:
            self._processor.enabled = False
        release_openai_hook()


def instrument(keep_openai_export: bool = False, tracer_provider: TracerProvider | None = None) -> OpenAIAgentsAdapter:
    """Record every Agents SDK run inside a rollout (idempotent).

    Args:
        keep_openai_export: Keep uploading traces to OpenAI as well (first call only).
        tracer_provider: The OpenTelemetry SDK provider the spans go through (default: Agent Lightning's own); the
            global provider is never set.

    Raises:
        UnsupportedVersionError: openai-agents is missing or outside `SUPPORTED_RANGE`.
    """
    adapter = OpenAIAgentsAdapter.default()
    if adapter.processor is None:
        adapter.keep_openai_export = keep_openai_export
    adapter.instrument(tracer_provider)
    return adapter


def uninstrument() -> None:
    """Stop recording runs (idempotent)."""
    OpenAIAgentsAdapter.default().uninstrument()
