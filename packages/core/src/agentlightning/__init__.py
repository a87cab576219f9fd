"""Agent Lightning: train any AI agent with reinforcement learning.

The public API is re-exported here; see the README for the five-line tour.
"""

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
    TrainingBatch,
    TrainingSample,
    Transition,
    ValueResource,
)
from agentlightning.algorithm import Algorithm
from agentlightning.store import (
    ConflictError,
    LightningStore,
    NotFoundError,
    RetryPolicy,
    RolloutRequest,
    StoreError,
)

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "Attempt",
    "Claim",
    "ConflictError",
    "LLMCall",
    "LLMResource",
    "LightningStore",
    "NotFoundError",
    "PromptTemplateResource",
    "Resources",
    "RetryPolicy",
    "Rollout",
    "RolloutRequest",
    "Span",
    "SpanEvent",
    "SpanStatus",
    "StoreError",
    "TrainingBatch",
    "TrainingSample",
    "Transition",
    "ValueResource",
    "__version__",
]
