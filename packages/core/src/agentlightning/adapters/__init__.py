"""Adapters: turn a framework's callbacks or tracing into Agent Lightning spans.

Core ships the contract (:class:`Adapter`, :func:`instrument_all`) and the raw-client adapters (``openai``,
``litellm``); framework adapters live in their own packages (``agentlightning-langchain``, ...).
"""

from agentlightning.adapters._base import (
    ENTRY_POINT_GROUP,
    Adapter,
    UnsupportedVersionError,
    get_adapter,
    instrument_all,
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

__all__ = [
    "ENTRY_POINT_GROUP",
    "Adapter",
    "LiteLLMAdapter",
    "OpenAIAdapter",
    "UnsupportedVersionError",
    "acquire_openai_hook",
    "get_adapter",
    "instrument_all",
    "instrument_litellm",
    "instrument_openai",
    "release_openai_hook",
    "uninstrument_all",
    "uninstrument_litellm",
    "uninstrument_openai",
    "version_in_range",
]
