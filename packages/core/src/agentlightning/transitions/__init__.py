"""Spans -> transitions: rebuild each attempt's trace tree, join LLM spans to the proxy's token ids."""

from agentlightning.transitions._builder import TransitionBuilder
from agentlightning.transitions._config import (
    MissingTokenIds,
    MissingTokenIdsError,
    TransitionConfig,
    TransitionDiagnostics,
    TransitionResult,
)
from agentlightning.transitions._store import results_from_store, transitions_from_store
from agentlightning.transitions._tree import TraceTree, build_trace_tree, span_order_key

__all__ = [
    "MissingTokenIds",
    "MissingTokenIdsError",
    "TraceTree",
    "TransitionBuilder",
    "TransitionConfig",
    "TransitionDiagnostics",
    "TransitionResult",
    "build_trace_tree",
    "results_from_store",
    "span_order_key",
    "transitions_from_store",
]
