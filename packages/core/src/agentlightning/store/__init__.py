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
from agentlightning.store._client import StoreClient
from agentlightning.store._memory import MemoryStore
from agentlightning.store._query import (
    RolloutPage,
    RolloutQuery,
    RolloutSummary,
    RunStats,
    RunStatsQuery,
    ThroughputBucket,
    VersionStats,
)
from agentlightning.store._sqlite import SqliteStore

__all__ = [
    "ConflictError",
    "LightningStore",
    "MemoryStore",
    "NotFoundError",
    "RetryPolicy",
    "RolloutPage",
    "RolloutQuery",
    "RolloutRequest",
    "RolloutSummary",
    "RunStats",
    "RunStatsQuery",
    "SqliteStore",
    "StoreClient",
    "StoreError",
    "StoreStats",
    "ThroughputBucket",
    "VersionStats",
]
