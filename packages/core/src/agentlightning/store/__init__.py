"""Store protocol and backends."""

from agentlightning.store._base import (
    ConflictError,
    LightningStore,
    NotFoundError,
    RetryPolicy,
    RolloutRequest,
    StoreError,
    StoreStats,
)

__all__ = [
    "ConflictError",
    "LightningStore",
    "NotFoundError",
    "RetryPolicy",
    "RolloutRequest",
    "StoreError",
    "StoreStats",
]
