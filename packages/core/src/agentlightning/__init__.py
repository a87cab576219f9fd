"""Agent Lightning: train any AI agent with reinforcement learning.

The public API is re-exported here; see the README for the five-line tour.
"""

from typing import Any

from agentlightning._deprecation import warn_renamed
from agentlightning._distribution import ForeignDistributionWarning, installed_version, warn_if_foreign
from agentlightning._eventloop import run_async
from agentlightning._gc import defer_full_gc
from agentlightning._models import (
    Attempt,
    Claim,
    LLMCall,
    LLMResource,
    PromptTemplateResource,
    Resources,
    Rollout,
    Span,
    SpanEvent,
    SpanStatus,
    ValueResource,
    new_id,
)
from agentlightning._policies import AGENT_HEADER, FROZEN, PolicyMap
from agentlightning._training_models import TrainingBatch, TrainingSample, Transition
from agentlightning.adapters import instrument_all, instrument_openai, uninstrument_all, uninstrument_openai
from agentlightning.algorithm import Algorithm
from agentlightning.credit import (
    CreditConfig,
    build_batch_from_results,
    build_batch_from_store,
    build_training_batch,
    get_advantage_estimator,
    get_credit_strategy,
    register_advantage_estimator,
    register_credit_strategy,
)
from agentlightning.loop import Engine, IterationReport, LoopConfig, ProxySettings, RLLoop
from agentlightning.runner import CommandAgent, CommandAgentError, RolloutAgent, Runner, load_agent, rollout
from agentlightning.store import (
    ConflictError,
    LightningStore,
    MemoryStore,
    NotFoundError,
    PostgresStore,
    RetryPolicy,
    RolloutPage,
    RolloutQuery,
    RolloutRequest,
    RolloutSummary,
    RunStats,
    RunStatsQuery,
    SqliteStore,
    StoreClient,
    StoreError,
    StoreServerProcess,
    StoreServing,
)
from agentlightning.tracing import (
    aflush,
    current_rollout,
    emit_annotation,
    emit_reward,
    flush,
    get_tracer,
    llm_base_url,
    rollout_context,
)
from agentlightning.transitions import (
    MissingTokenIdsError,
    TraceTree,
    TransitionBuilder,
    TransitionConfig,
    TransitionResult,
    build_trace_tree,
    transitions_from_store,
)

__version__ = installed_version("0.1.0")

warn_if_foreign()

__all__ = [
    "AGENT_HEADER",
    "FROZEN",
    "Algorithm",
    "Attempt",
    "Claim",
    "CommandAgent",
    "CommandAgentError",
    "ConflictError",
    "CreditConfig",
    "Engine",
    "ForeignDistributionWarning",
    "IterationReport",
    "LLMCall",
    "LLMResource",
    "LightningStore",
    "LoopConfig",
    "MemoryStore",
    "MissingTokenIdsError",
    "NotFoundError",
    "PolicyMap",
    "PostgresStore",
    "PromptTemplateResource",
    "ProxySettings",
    "RLLoop",
    "Resources",
    "RetryPolicy",
    "Rollout",
    "RolloutAgent",
    "RolloutPage",
    "RolloutQuery",
    "RolloutRequest",
    "RolloutSummary",
    "RunStats",
    "RunStatsQuery",
    "Runner",
    "Span",
    "SpanEvent",
    "SpanStatus",
    "SqliteStore",
    "StoreClient",
    "StoreError",
    "StoreServerProcess",
    "StoreServing",
    "TraceTree",
    "TrainingBatch",
    "TrainingSample",
    "Transition",
    "TransitionBuilder",
    "TransitionConfig",
    "TransitionResult",
    "ValueResource",
    "__version__",
    "aflush",
    "build_batch_from_results",
    "build_batch_from_store",
    "build_trace_tree",
    "build_training_batch",
    "current_rollout",
    "defer_full_gc",
    "emit_annotation",
    "emit_reward",
    "flush",
    "get_advantage_estimator",
    "get_credit_strategy",
    "get_tracer",
    "instrument_all",
    "instrument_openai",
    "llm_base_url",
    "load_agent",
    "new_id",
    "register_advantage_estimator",
    "register_credit_strategy",
    "rollout",
    "rollout_context",
    "run_async",
    "transitions_from_store",
    "uninstrument_all",
    "uninstrument_openai",
]


def __getattr__(name: str) -> Any:
    """Deprecated names: ``StoreServer`` is `StoreServerProcess` (it runs ``agl store serve`` as a child process)."""
    if name == "StoreServer":
        warn_renamed("agentlightning.StoreServer", "agentlightning.StoreServerProcess", removed_in="0.3.0")
        return StoreServerProcess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
