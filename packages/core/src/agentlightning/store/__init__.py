"""Store protocol and backends."""

from agentlightning.store._base import (
    MAX_DEQUEUE_MANY,
    RELEASED,
    AttemptEndedError,
    ConflictError,
    DatabaseUnavailableError,
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
from agentlightning.store._process import StoreServerProcess
from agentlightning.store._query import (
    PolicyStats,
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
from agentlightning.store._worker_stats import WorkerStats, runner_of, runner_totals

__all__ = [
    "MAX_DEQUEUE_MANY",
    "RELEASED",
    "AttemptEndedError",
    "ConflictError",
    "DatabaseUnavailableError",
    "InvalidRequestError",
    "LightningStore",
    "MemoryStore",
    "NotFoundError",
    "OpenedStore",
    "PolicyStats",
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
    "StoreServerProcess",
    "StoreServing",
    "StoreStats",
    "StoreUnavailableError",
    "ThroughputBucket",
    "UnauthorizedError",
    "VersionStats",
    "WorkerStats",
    "runner_of",
    "runner_totals",
]
