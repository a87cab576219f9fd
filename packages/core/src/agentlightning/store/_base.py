"""The one store protocol every backend implements, its retry policy and its errors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from agentlightning._models import (
    Attempt,
    AttemptStatus,
    Claim,
    LLMCall,
    RecordModel,
    Resources,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    StoreId,
    check_json_finite,
)
from agentlightning.store._query import RolloutPage, RolloutQuery, RunStats, RunStatsQuery

__all__ = [
    "MAX_DEQUEUE_MANY",
    "RELEASED",
    "AttemptEndedError",
    "ConflictError",
    "DatabaseUnavailableError",
    "InvalidRequestError",
    "LightningStore",
    "NotFoundError",
    "RetryPolicy",
    "RolloutRequest",
    "StorageError",
    "StoreError",
    "StoreStats",
]


MAX_DEQUEUE_MANY = 1024
"""The most rollouts one `LightningStore.dequeue_many` request may claim (and attempts one ``heartbeat_many`` beats)."""

RELEASED = "released by its worker before it finished (the runner was shutting down)"
"""The ``error`` of an attempt given back with ``release_claim``."""


class StoreError(Exception):
    """Base class of store errors; the message says what is wrong."""


class NotFoundError(StoreError, KeyError):
    """An id that the store does not know (rollout, attempt, resources)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"


class StorageError(StoreError):
    """The store cannot write: its disk is full or its database is read-only. Retrying cannot help.

    The message says which (``database or disk is full`` / ``database is read-only``) and where.
    """


class DatabaseUnavailableError(StoreError):
    """The store's database cannot be reached now (a PostgreSQL server stopped or restarting): retrying later helps.

    A served store answers 503 (which its clients retry) and its ``/healthz`` answers 503 until the database is back;
    the message is one line naming the database and its error.
    """


class InvalidRequestError(StoreError, ValueError):
    """A request a store refuses as invalid, the same way on every backend (a served store answers 400/413/422).

    Raised at the store boundary (`agentlightning.store._boundary`) before anything is stored; the message is one
    line naming the argument or field (``spans.2.span_id: ...``).
    """

    def __init__(self, message: str, errors: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(message)
        self._errors = [dict(error) for error in errors]

    def errors(self) -> list[dict[str, Any]]:
        """pydantic's description of each invalid field (``loc``, ``type``, ``msg``), where a model found them.

        Empty for a rule outside a model, and for a served store's refusal (its client gets the message only).
        """
        return list(self._errors)


class ConflictError(StoreError):
    """A request that contradicts the stored state (e.g. finishing an attempt that is not running)."""


class AttemptEndedError(ConflictError):
    """Records (spans, LLM calls) for an attempt that no longer runs: a late record, refused and not stored.

    An attempt ends when its runner finishes it, when the store times it out (``unresponsive`` / ``timeout``), when
    its rollout is cancelled or when its claim is released; whatever arrives after that is refused, the same way by
    every backend (the rule is `agentlightning.store._common.check_record_attempts`), so a finished rollout's
    training data never grows. A served store answers 409 with the error ``attempt_ended``.
    """


class RetryPolicy(BaseModel):
    """When a failed or silent attempt is retried.

    Attributes:
        max_attempts: Total attempts per rollout (1 = never retry).
        retry_on: Attempt outcomes that trigger a retry (``failed``, ``timeout``, ``unresponsive``).
        heartbeat_timeout: Seconds without a heartbeat after which a running attempt is ``unresponsive``.
        rollout_timeout: Seconds after which a running attempt is ``timeout`` (``None``: no limit).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=3, ge=1)
    retry_on: frozenset[AttemptStatus] = frozenset({"failed", "timeout", "unresponsive"})
    heartbeat_timeout: float = Field(default=30.0, gt=0)
    rollout_timeout: float | None = Field(default=None, gt=0)


class RolloutRequest(RecordModel):
    """What a caller asks to enqueue; the store fills in status and times."""

    input: Any = None
    rollout_id: StoreId | None = None
    mode: RolloutMode | None = None
    group_id: StoreId | None = None
    resources_id: StoreId | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("input", "metadata")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        return check_json_finite(value, info.field_name or "value")


class StoreStats(BaseModel):
    """Counts for dashboards and tests."""

    model_config = ConfigDict(frozen=True)

    rollouts: dict[str, int]
    attempts: int
    spans: int
    llm_calls: int
    resources: int


@runtime_checkable
class LightningStore(Protocol):
    """Where runners and trainers meet. Every method is async; every write is idempotent on its client id.

    Semantics every backend shares (``agentlightning.testing.StoreConformanceTests`` checks them):

    * ``enqueue_rollouts`` with an existing ``rollout_id`` returns the stored rollout unchanged.
    * ``dequeue_rollout`` atomically moves the oldest ``queuing`` rollout to ``running`` and starts an attempt;
      ``dequeue_many`` does the same for several workers in one request (and one transaction).
    * ``finish_attempt`` with ``succeeded`` finishes the rollout; with a status in ``retry_on`` and attempts
      left it sends the rollout back to ``queuing`` (``retry_count`` + 1); otherwise the rollout ``failed``.
      Finishing an already finished attempt with the same status is a no-op; with another status a conflict.
    * ``check_timeouts`` marks silent attempts ``unresponsive`` and over-long ones ``timeout`` and applies the
      retry policy; backends also run it at the start of ``dequeue_rollout``.
    * ``release_claim`` gives a running attempt back at once (a runner shutting down): the attempt ends
      ``cancelled`` with the error `RELEASED`, and the rollout goes back to ``queuing`` whatever the retry
      policy says (it still counts as an attempt). Releasing an attempt that no longer runs changes nothing.
    * ``add_spans`` / ``add_llm_calls`` ignore records whose ids are already stored and return how many were
      new. A batch is validated as a whole first: one bad record (a NaN or Infinity included, or an attempt the
      store never started) rejects the batch and stores nothing. Records are only added to a running attempt:
      one of an attempt that ended (any status but ``running``) rejects the batch with `AttemptEndedError`,
      checked in the same transaction as the write, so a record either lands before its attempt's end or not at all.
      The one exception: a batch made only of judge verdicts (spans of kind ``judge``, `agentlightning.judge`)
      annotates an attempt after its end, and is accepted for any attempt the store started.
    * ``dequeue_rollout``, ``dequeue_many``, ``add_spans`` and ``add_llm_calls`` take an optional ``request_id``: a
      repeated request returns the first answer (what a retry after a lost answer needs).
    * ``add_resources`` assigns the next version; re-adding a known ``resources_id`` returns the stored one.
    * Every attempt keeps its final reward (the last span of kind ``reward`` marked final, by sequence id) and
      the newest ``model_version`` of its LLM calls; ``list_rollouts`` and ``run_stats`` report them.
    """

    retry_policy: RetryPolicy

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Queue rollouts (batched); returns them in request order."""
        ...

    async def enqueue_rollout(self, input: Any = None, **fields: Any) -> Rollout:
        """Queue one rollout; ``fields`` are those of `RolloutRequest`."""
        ...

    async def dequeue_rollout(self, worker_id: str | None = None, *, request_id: str | None = None) -> Claim | None:
        """Claim the oldest queuing rollout and start an attempt for it, or ``None`` when the queue is empty.

        ``request_id``: a client-chosen id; repeating a request with the same id returns the first answer (the
        same claim) instead of claiming another rollout, so a retry after a lost answer leaves no orphan attempt.
        """
        ...

    async def dequeue_many(self, worker_ids: Sequence[str | None], *, request_id: str | None = None) -> list[Claim]:
        """Claim up to ``len(worker_ids)`` of the oldest queuing rollouts at once, the i-th for ``worker_ids[i]``.

        One request for a runner with several idle workers instead of one per worker. Returns the claims in queue
        order (fewer than asked when the queue runs short, ``[]`` when it is empty); each is what
        `dequeue_rollout` would have returned for that worker. ``request_id``: a repeated request returns the
        first answer (the same claims). At most `MAX_DEQUEUE_MANY` workers per request.
        """
        ...

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record a sign of life; raises `ConflictError` if the attempt is no longer running."""
        ...

    async def heartbeat_many(self, attempts: Sequence[tuple[str, str]]) -> list[Attempt]:
        """Record a sign of life for several attempts, given as (rollout id, attempt id), in one request.

        Returns each attempt as stored afterwards, in order: one that no longer runs comes back unchanged (its status
        says why) instead of raising `ConflictError`. An unknown id raises `NotFoundError` and records nothing.
        At most `MAX_DEQUEUE_MANY` attempts per request.
        """
        ...

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None = None
    ) -> Rollout:
        """End an attempt and move its rollout on according to the retry policy."""
        ...

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""
        ...

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished (its running attempt is cancelled too)."""
        ...

    async def check_timeouts(self) -> list[Attempt]:
        """Apply heartbeat/rollout timeouts now; returns the attempts that were ended."""
        ...

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; raises `NotFoundError`."""
        ...

    async def query_rollouts(
        self, status: Sequence[RolloutStatus] | None = None, rollout_ids: Sequence[str] | None = None
    ) -> list[Rollout]:
        """Rollouts filtered by status and/or ids, in enqueue order."""
        ...

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout in order."""
        ...

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until the rollouts reach a terminal status or ``timeout`` seconds pass; returns the finished ones."""
        ...

    async def add_spans(self, spans: Sequence[Span], *, request_id: str | None = None) -> int:
        """Store spans (idempotent on (rollout_id, attempt_id, span_id)); returns how many were new.

        Raises `NotFoundError` for a span of an attempt the store never started and `AttemptEndedError` for one of
        an attempt that no longer runs (nothing of the batch is stored). A request repeated with the same
        ``request_id`` returns the first answer's count (the spans it stored are new to the caller).
        """
        ...

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (or one attempt), ordered by attempt then sequence_id."""
        ...

    async def add_llm_calls(self, calls: Sequence[LLMCall], *, request_id: str | None = None) -> int:
        """Store proxy records (idempotent on call_id); returns how many were new (``request_id``: see `add_spans`).

        Raises `NotFoundError` for a call of an attempt the store never started and `AttemptEndedError` for one of
        an attempt that no longer runs (nothing of the batch is stored).
        """
        ...

    async def query_llm_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
        """LLM calls of a rollout (or one attempt) in start order."""
        ...

    async def add_resources(self, resources: Resources) -> Resources:
        """Store a new resources version; returns it with its assigned version."""
        ...

    async def get_resources(self, resources_id: str | None = None) -> Resources | None:
        """Resources by id, or the latest version when ``resources_id`` is ``None``."""
        ...

    async def query_resources(self) -> list[Resources]:
        """Every stored resources version, oldest first (the last one is the current one)."""
        ...

    async def list_rollouts(self, query: RolloutQuery | None = None) -> RolloutPage:
        """A page of rollout summaries matching ``query``, newest first, with the total number of matches.

        Each row carries its latest attempt's status, final reward, serving model version, duration and error,
        so a dashboard shows a table of any size without reading spans.
        """
        ...

    async def run_stats(self, query: RunStatsQuery | None = None) -> RunStats:
        """Counts per status, reward and success rate per (model version, mode), and recent throughput."""
        ...

    async def stats(self) -> StoreStats:
        """Counts of what is stored."""
        ...

    async def close(self) -> None:
        """Release files and connections."""
        ...
