"""``instrument()`` for LangChain: add one `LightningCallbackHandler` to every run, via langchain-core's hook."""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

from opentelemetry.sdk.trace import TracerProvider

from agentlightning.adapters import (
    Adapter,
    UnsupportedVersionError,
    acquire_openai_hook,
    release_openai_hook,
    supported_range,
)
from agentlightning_langchain._handler import LightningCallbackHandler

__all__ = ["SUPPORTED_RANGE", "LangChainAdapter", "instrument", "uninstrument"]

logger = logging.getLogger(__name__)

SUPPORTED_RANGE = supported_range("agentlightning-langchain", "langchain-core")
"""langchain-core versions this adapter supports (read from this package's dependency in pyproject.toml)."""


class _ProcessWideHandler:
    """What langchain-core's configure hook reads: ``get()`` returns the handler while instrumented.

    The hook expects a ``ContextVar``; a real one set in ``instrument()`` would be invisible to threads started
    without a copied context (a thread has its own, empty context), so this object answers the same way in every
    thread and task.
    """

    def __init__(self) -> None:
        self.handler: LightningCallbackHandler | None = None

    def get(self, default: Any = None) -> LightningCallbackHandler | None:
        return self.handler if self.handler is not None else default


_VAR = _ProcessWideHandler()
_registered = False
_registered_lock = threading.Lock()


def _register_hook() -> None:
    global _registered
    with _registered_lock:
        if _registered:
            return
        from langchain_core.tracers.context import register_configure_hook

        register_configure_hook(_VAR, inheritable=True)  # type: ignore[arg-type]
        _registered = True


class LangChainAdapter(Adapter):
    """Adapter for LangChain and LangGraph (which runs on langchain-core's callbacks)."""

    NAME: ClassVar[str] = "langchain"
    FRAMEWORK: ClassVar[str] = "langchain-core"
    SUPPORTED_RANGE: ClassVar[str] = SUPPORTED_RANGE
    INSTALL: ClassVar[str] = f"pip install agentlightning-langchain 'langchain-core{SUPPORTED_RANGE}'"

    def __init__(self) -> None:
        super().__init__()
        self._hook = False

    def _instrument(self) -> None:
        _register_hook()
        _VAR.handler = LightningCallbackHandler(tracer_provider=self.tracer_provider)
        # LangChain drops the response id of streamed calls; the openai client span hands it up (if installed).
        try:
            acquire_openai_hook()
            self._hook = True
        except UnsupportedVersionError as exc:
            logger.info("streamed LangChain calls will carry no response id: %s", exc)

    def _uninstrument(self) -> None:
        _VAR.handler = None
        if self._hook:
            release_openai_hook()
            self._hook = False

    @property
    def handler(self) -> LightningCallbackHandler | None:
        """The handler added to every run while instrumented."""
        return _VAR.handler


def instrument(tracer_provider: TracerProvider | None = None) -> LangChainAdapter:
    """Record every LangChain / LangGraph run inside a rollout (idempotent).

    Args:
        tracer_provider: The OpenTelemetry SDK provider the spans go through (default: Agent Lightning's own); the
            global provider is never set.

    Raises:
        UnsupportedVersionError: langchain-core is missing or outside `SUPPORTED_RANGE`.
    """
    adapter = LangChainAdapter.default()
    adapter.instrument(tracer_provider)
    return adapter


def uninstrument() -> None:
    """Stop recording runs (idempotent)."""
    LangChainAdapter.default().uninstrument()
