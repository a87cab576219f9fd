"""Adapter for TEMPLATE_FRAMEWORK: turn its public callbacks/tracing into Agent Lightning spans.

Fill in `_instrument` / `_uninstrument` with the framework's PUBLIC hook (a callback registry, a tracing
processor, an OpenTelemetry tracer provider argument). In each hook, start spans with
``agentlightning.adapters.lightning_tracer(...)`` and set the attributes of `agentlightning.semconv`:

- agent turn:  SPAN_KIND=KIND_AGENT, GEN_AI_AGENT_NAME=<agent name>
- model call:  SPAN_KIND=KIND_LLM, GEN_AI_RESPONSE_ID=<the OpenAI response "id"> (the join key to token ids),
               GEN_AI_REQUEST_MODEL, GEN_AI_USAGE_INPUT_TOKENS / GEN_AI_USAGE_OUTPUT_TOKENS
- tool call:   SPAN_KIND=KIND_TOOL, GEN_AI_TOOL_NAME=<tool name>
- always:      ADAPTER_NAME=Adapter.NAME

Parent each span on the span of the enclosing framework step. If the framework cannot tell you the response id
but calls the ``openai`` client, call ``acquire_openai_hook()`` in `_instrument` (``standalone=True`` if the
framework makes no LLM span of its own) and ``release_openai_hook()`` in `_uninstrument`.
"""

from __future__ import annotations

from typing import ClassVar

from agentlightning.adapters import Adapter, supported_range

__all__ = ["SUPPORTED_RANGE", "TemplateAdapter", "instrument", "uninstrument"]

SUPPORTED_RANGE = supported_range("agentlightning-template", "TEMPLATE_DIST")
"""TEMPLATE_DIST versions this adapter supports: read from this package's dependency in pyproject.toml."""


class TemplateAdapter(Adapter):
    """Adapter for TEMPLATE_FRAMEWORK."""

    NAME: ClassVar[str] = "template"
    FRAMEWORK: ClassVar[str] = "TEMPLATE_DIST"
    SUPPORTED_RANGE: ClassVar[str] = SUPPORTED_RANGE
    INSTALL: ClassVar[str] = f"pip install agentlightning-template 'TEMPLATE_DIST{SUPPORTED_RANGE}'"

    def _instrument(self) -> None:
        raise NotImplementedError("register your callback / processor with the framework's public API here")

    def _uninstrument(self) -> None:
        raise NotImplementedError("unregister it (or switch it off) here")


def instrument() -> TemplateAdapter:
    """Record TEMPLATE_FRAMEWORK runs inside rollouts (idempotent)."""
    adapter = TemplateAdapter.default()
    adapter.instrument()
    return adapter


def uninstrument() -> None:
    """Stop recording (idempotent)."""
    TemplateAdapter.default().uninstrument()
