"""Store protocol and backends."""

from agentlightning.store._base import (
    MAX_DEQUEUE_MANY,
    RELEASED,
    ConflictError,
    LightningStore,
    NotFoundError,
    RetryPolicy,
    RolloutRequest,
    StorageError,
    StoreError,
    StoreStats,
)
from agentlightning.store._client import InvalidRequestError, StoreClient, StoreUnavailableError, UnauthorizedError
from agentlightning.store._memory import MemoryStore
from agentlightning.store._postgres import PostgresStore
from agentlightning.store._process import StoreServer
from agentlightning.store._query import (
    RolloutPage,
    RolloutQuery,
    RolloutSummary,
    RunStats,
    RunStatsQuery,
    ThroughputBucket,
    VersionStats,
)
from agentlightning.store._serving import OpenedStore, StoreServing
from agentlightning.store._sqlite import SqliteStore

__all__ = [
    "MAX_DEQUEUE_MANY",
    "RELEASED",
    "ConflictError",
    "InvalidRequestError",
    "LightningStore",
    "MemoryStore",
    "NotFoundError",
    "OpenedStore",
    "PostgresStore",
    "RetryPolicy",
    "RolloutPage",
    "RolloutQuery",
    "RolloutRequest",
    "RolloutSummary",
    "RunStats",
    "RunStatsQuery",
    "SqliteStore",
    "StorageError",
    "StoreClient",
    "StoreError",
    "StoreServer",
    "StoreServing",
    "StoreStats",
    "StoreUnavailableError",
    "ThroughputBucket",
    "UnauthorizedError",
    "VersionStats",
]
