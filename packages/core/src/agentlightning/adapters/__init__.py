"""Adapters: turn a framework's callbacks or tracing into Agent Lightning spans.

Core ships the contract (:class:`Adapter`, :func:`instrument_all`) and the raw-client adapters (``openai``,
``litellm``); framework adapters live in their own packages (``agentlightning-langchain``, ...).

Everything an adapter package needs is public here (see the core README, "Write an adapter"):

- the contract: :class:`Adapter`, :class:`UnsupportedVersionError`, :func:`supported_range` (read the
  framework range from the adapter's own package metadata), :func:`version_in_range`;
- spans: :func:`lightning_tracer` / :func:`lightning_provider` (spans land in the current rollout's store),
  :class:`GatedSpanProcessor` + :func:`add_processor_once` (a processor that can be switched off),
  :func:`is_llm_span`, :data:`pending_llm_spans` (framework LLM spans waiting for the client span's response id);
- the ``openai`` client hook: :func:`acquire_openai_hook` / :func:`release_openai_hook`;
- span sources: the app's own OpenLLMetry / OpenTelemetry GenAI instrumentation read as ours (:class:`SpanSource`,
  :data:`SOURCES`, :func:`active_sources`, :func:`use_active_sources`).
"""

from agentlightning.adapters._base import (
    ENTRY_POINT_GROUP,
    Adapter,
    UnsupportedVersionError,
    get_adapter,
    instrument_all,
    supported_range,
    uninstrument_all,
    version_in_range,
)
from agentlightning.adapters._litellm import LiteLLMAdapter, instrument_litellm, uninstrument_litellm
from agentlightning.adapters._openai import (
    OpenAIAdapter,
    acquire_openai_hook,
    instrument_openai,
    release_openai_hook,
    uninstrument_openai,
)
from agentlightning.adapters._otel import (
    GatedSpanProcessor,
    PendingLLMSpans,
    add_processor_once,
    is_llm_span,
    lightning_provider,
    lightning_tracer,
    pending_llm_spans,
)
from agentlightning.adapters._sources import (
    SOURCES,
    OpenAIV2Source,
    OpenLLMetryAgentsSource,
    OpenLLMetryLangChainSource,
    OpenLLMetryOpenAISource,
    SpanSource,
    active_sources,
    use_active_sources,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "SOURCES",
    "Adapter",
    "GatedSpanProcessor",
    "LiteLLMAdapter",
    "OpenAIAdapter",
    "OpenAIV2Source",
    "OpenLLMetryAgentsSource",
    "OpenLLMetryLangChainSource",
    "OpenLLMetryOpenAISource",
    "PendingLLMSpans",
    "SpanSource",
    "UnsupportedVersionError",
    "acquire_openai_hook",
    "active_sources",
    "add_processor_once",
    "get_adapter",
    "instrument_all",
    "instrument_litellm",
    "instrument_openai",
    "is_llm_span",
    "lightning_provider",
    "lightning_tracer",
    "pending_llm_spans",
    "release_openai_hook",
    "supported_range",
    "uninstrument_all",
    "uninstrument_litellm",
    "uninstrument_openai",
    "use_active_sources",
    "version_in_range",
]
