"""`StoreClient`: the `LightningStore` protocol over HTTP, talking to ``agl store serve``."""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from agentlightning._fast import calls_from_json, fast_model, fast_replace, resources_from_json, spans_from_json
from agentlightning._models import (
    TERMINAL_ROLLOUT_STATUSES,
    Attempt,
    AttemptStatus,
    Claim,
    LLMCall,
    Resources,
    Rollout,
    RolloutStatus,
    Span,
    new_id,
)
from agentlightning.store._base import (
    ConflictError,
    RetryPolicy,
    RolloutRequest,
    StoreError,
    StoreStats,
)
from agentlightning.store._client_transport import (
    InvalidRequestError,
    RetriedConflict,
    StoreTransport,
    StoreUnavailableError,
    UnauthorizedError,
    raise_for,
)
from agentlightning.store._query import RolloutPage, RolloutQuery, RunStats, RunStatsQuery
from agentlightning.store._wire import (
    MAX_WAIT_SECONDS,
    AddedResponse,
    AttemptRef,
    AttemptsResponse,
    DequeueManyRequest,
    DequeueManyResponse,
    DequeueRequest,
    DequeueResponse,
    EnqueueRequest,
    FinishRequest,
    HeartbeatManyRequest,
    LLMCallsRequest,
    QueryRolloutsRequest,
    RecordQuery,
    ResourcesQuery,
    RolloutRef,
    RolloutsResponse,
    SpansRequest,
    WaitRequest,
    spans_request_json,
)

__all__ = ["InvalidRequestError", "StoreClient", "StoreUnavailableError", "UnauthorizedError"]  # errors: re-exported

logger = logging.getLogger(__name__)


# Answers made of stored records (see StoreTransport._call): read with trusted construction, not validated again.
def _spans_answer(payload: bytes) -> list[Span]:
    return spans_from_json(from_json(payload, allow_inf_nan=False)["spans"])


def _calls_answer(payload: bytes) -> list[LLMCall]:
    return calls_from_json(from_json(payload, allow_inf_nan=False)["calls"])


def _resources_answer(payload: bytes) -> Resources | None:
    found = from_json(payload, allow_inf_nan=False)["resources"]
    return None if found is None else resources_from_json(found)


def _resources_list_answer(payload: bytes) -> list[Resources]:
    return [resources_from_json(item) for item in from_json(payload, allow_inf_nan=False)["resources"]]


class StoreClient(StoreTransport):
    """A `LightningStore` served elsewhere, reached over HTTP (one kept-alive aiohttp session per event loop).

    The client may be used from several event loops and threads at once (a runner's loop and the tracing
    exporter's background loop, say): each loop gets its own connection pool, created on first use.
    Call `close` from each loop that used the client (or let the process end); it only closes that loop's pool.

    Failed requests are retried with exponential backoff on connection errors, answers that break off, timeouts
    and 5xx answers for ``retry_for`` seconds (a minute by default: long enough to ride out a store restart), then raise
    `StoreUnavailableError`. That is safe because every write is idempotent on a client id: rollouts without an
    id get one here before the first try, and ``dequeue_rollout`` / ``add_spans`` / ``add_llm_calls`` carry a
    request id the store remembers, so a retried dequeue returns the same claim and a retried write the right
    count. 4xx answers are not retried; they raise `NotFoundError` (404), `ConflictError` (409),
    `UnauthorizedError` (401) or `StoreError` (other 4xx) with the server's message. A store whose disk is full or
    read-only answers 507, raised at once as `StorageError` (retrying cannot help).

    A store served by several servers over one PostgreSQL database (``agl store serve --db postgresql://...``) is
    given as all their URLs: requests go to the first until it fails (a connection error, a broken-off answer, a
    timeout or a 5xx), then to the next, and so on round the list. Each request's retry is safe on another server
    as on the same one: they share the database, which remembers request ids.

    Args:
        url: Base URL of the served store, e.g. ``http://127.0.0.1:4747``; several servers of one store as a list
            or separated by commas (``http://a:4747,http://b:4747``), the preferred one first.
        token: Bearer token (``agl store serve --token``); ``None`` when the server has none.
        timeout: Seconds one request may take (long-polls of ``wait_for_rollouts`` get their wait added).
        retries: Most extra tries after a failed one (0 = never retry; ``None``: as many as ``retry_for`` allows).
        backoff: First wait between tries, in seconds; doubled each try up to ``backoff_max``.
        backoff_max: Longest wait between two tries.
        retry_for: Seconds after the first try during which failed tries are retried.
    """

    def __repr__(self) -> str:
        return f"StoreClient({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Sessions belong to one process; a pickled client reconnects lazily on the other side.
        return (_rebuild, (self.reopen_spec()[1],))

    def reopen_spec(self) -> tuple[type[StoreClient], dict[str, Any]]:
        """How to build an equivalent client in another process: ``cls(**kwargs)``."""
        return StoreClient, {
            "url": ",".join(self.urls),
            "token": self.token,
            "timeout": self.timeout,
            "retries": self.retries,
            "backoff": self.backoff,
            "backoff_max": self.backoff_max,
            "retry_for": self.retry_for,
        }

    # --- retry policy -------------------------------------------------------------------------------------------

    @property
    def retry_policy(self) -> RetryPolicy:
        """The served store's retry policy (fetched once, on first use).

        It is set where the store is served; assigning it here raises `StoreError`.
        """
        if self._retry_policy is None:
            # A blocking fetch is acceptable here: it happens once per client and the protocol makes this an
            # attribute, not a coroutine. Async callers can warm it with `fetch_retry_policy`.
            request = urllib.request.Request(f"{self._api}/retry_policy", headers=self._headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                    self._retry_policy = RetryPolicy.model_validate_json(resp.read())
            except urllib.error.HTTPError as exc:
                raise_for(exc.code, exc.read())
                raise  # pragma: no cover - _raise_for always raises
            except OSError as exc:
                raise StoreUnavailableError(f"cannot reach the store at {self.url}: {exc}") from exc
        return self._retry_policy

    @retry_policy.setter
    def retry_policy(self, value: RetryPolicy) -> None:
        raise StoreError("the retry policy of a served store is set where it is served (agl store serve)")

    async def fetch_retry_policy(self) -> RetryPolicy:
        """Fetch (and cache) the served store's retry policy without blocking the event loop."""
        self._retry_policy = await self._call("GET", "/retry_policy", None, RetryPolicy)
        return self._retry_policy

    # --- protocol -----------------------------------------------------------------------------------------------

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Queue rollouts (batched); returns them in request order."""
        # Validated at the boundary (StoreBoundary), as every argument below. Every request gets an id before the
        # first try so that a retry cannot queue it twice.
        fixed = [r if r.rollout_id is not None else fast_replace(r, rollout_id=new_id("ro")) for r in requests]
        body = fast_model(EnqueueRequest, {"requests": fixed})
        return (await self._call("POST", "/rollouts/enqueue", body, RolloutsResponse)).rollouts

    async def dequeue_rollout(self, worker_id: str | None = None, *, request_id: str | None = None) -> Claim | None:
        """Claim the oldest queuing rollout, or ``None`` when the queue is empty.

        Every try of one call carries the same request id (``request_id`` or a fresh one), so a retry after a lost
        answer gets the same claim.
        """
        body = fast_model(DequeueRequest, {"worker_id": worker_id, "request_id": request_id or uuid.uuid4().hex})
        return (await self._call("POST", "/rollouts/dequeue", body, DequeueResponse)).claim

    async def dequeue_many(self, worker_ids: Sequence[str | None], *, request_id: str | None = None) -> list[Claim]:
        """Claim up to ``len(worker_ids)`` queuing rollouts in one request, the i-th for ``worker_ids[i]``.

        Every try carries the same request id (as in `dequeue_rollout`), so a retry gets the same claims.
        """
        if not worker_ids:
            return []
        body = fast_model(DequeueManyRequest, {"worker_ids": worker_ids, "request_id": request_id or uuid.uuid4().hex})
        return (await self._call("POST", "/rollouts/dequeue_many", body, DequeueManyResponse)).claims

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record a sign of life; raises `ConflictError` if the attempt is no longer running."""
        body = fast_model(AttemptRef, {"rollout_id": rollout_id, "attempt_id": attempt_id})
        return await self._call("POST", "/attempts/heartbeat", body, Attempt)

    async def heartbeat_many(self, attempts: Sequence[tuple[str, str]]) -> list[Attempt]:
        """Record a sign of life for several attempts in one request; those no longer running come back unchanged."""
        refs = list(attempts)  # checked by the store boundary
        if not refs:
            return []
        body = HeartbeatManyRequest(attempts=[AttemptRef(rollout_id=r, attempt_id=a) for r, a in refs])
        return (await self._call("POST", "/attempts/heartbeat_many", body, AttemptsResponse)).attempts

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None = None
    ) -> Rollout:
        """End an attempt and move its rollout on according to the retry policy."""
        body = fast_model(
            FinishRequest, {"rollout_id": rollout_id, "attempt_id": attempt_id, "status": status, "error": error}
        )
        return await self._call("POST", "/attempts/finish", body, Rollout)

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""
        body = fast_model(AttemptRef, {"rollout_id": rollout_id, "attempt_id": attempt_id})
        return await self._call("POST", "/attempts/release", body, Rollout)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished."""
        body = RolloutRef(rollout_id=rollout_id)
        try:
            return await self._call("POST", "/rollouts/cancel", body, Rollout)
        except RetriedConflict as exc:
            # An earlier try may have cancelled it before its answer was lost.
            rollout = await self.get_rollout(rollout_id)
            if rollout.status == "cancelled":
                return rollout
            raise ConflictError(str(exc)) from None

    async def check_timeouts(self) -> list[Attempt]:
        """Apply heartbeat/rollout timeouts now; returns the attempts that were ended."""
        return (await self._call("POST", "/attempts/check_timeouts", None, AttemptsResponse)).attempts

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; raises `NotFoundError`."""
        return await self._call("GET", "/rollouts/" + urllib.parse.quote(rollout_id, safe=""), None, Rollout)

    async def query_rollouts(
        self, status: Sequence[RolloutStatus] | None = None, rollout_ids: Sequence[str] | None = None
    ) -> list[Rollout]:
        """Rollouts filtered by status and/or ids, in enqueue order."""
        # the boundary made both lists (or left them None)
        body = fast_model(QueryRolloutsRequest, {"status": status, "rollout_ids": rollout_ids})
        return (await self._call("POST", "/rollouts/query", body, RolloutsResponse)).rollouts

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout in order."""
        body = RolloutRef(rollout_id=rollout_id)
        return (await self._call("POST", "/attempts/query", body, AttemptsResponse)).attempts

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until the rollouts finish or ``timeout`` seconds pass (long-polls in slices of up to 20 s)."""
        ids = list(rollout_ids)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(timeout, 0.0)
        while True:
            left = MAX_WAIT_SECONDS if deadline is None else max(0.0, min(MAX_WAIT_SECONDS, deadline - loop.time()))
            body = WaitRequest(rollout_ids=ids, timeout=left)
            done = (await self._call("POST", "/rollouts/wait", body, RolloutsResponse, extra_timeout=left)).rollouts
            finished = {r.rollout_id for r in done if r.status in TERMINAL_ROLLOUT_STATUSES}
            if finished.issuperset(ids) or (deadline is not None and loop.time() >= deadline):
                return done

    async def add_spans(self, spans: Sequence[Span], *, request_id: str | None = None) -> int:
        """Store spans (idempotent on (rollout_id, attempt_id, span_id)); returns how many were new.

        Every try carries the same request id, so a retry after a lost answer still reports the right count.
        """
        if not spans:
            return 0
        batch = spans if type(spans) is list else list(spans)  # (a served store's CheckedSpans: its models)
        body = fast_model(SpansRequest, {"spans": batch, "request_id": request_id or uuid.uuid4().hex})
        return (await self._call("POST", "/spans", spans_request_json(body), AddedResponse)).added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (or one attempt), ordered by attempt then sequence_id."""
        body = RecordQuery(rollout_id=rollout_id, attempt_id=attempt_id)
        return await self._call("POST", "/spans/query", body, _spans_answer)

    async def add_llm_calls(self, calls: Sequence[LLMCall], *, request_id: str | None = None) -> int:
        """Store proxy records (idempotent on call_id); returns how many were new (request ids as in `add_spans`)."""
        if not calls:
            return 0
        body = fast_model(LLMCallsRequest, {"calls": calls, "request_id": request_id or uuid.uuid4().hex})
        return (await self._call("POST", "/llm_calls", body, AddedResponse)).added

    async def query_llm_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
        """LLM calls of a rollout (or one attempt) in start order."""
        body = RecordQuery(rollout_id=rollout_id, attempt_id=attempt_id)
        return await self._call("POST", "/llm_calls/query", body, _calls_answer)

    async def add_resources(self, resources: Resources) -> Resources:
        """Store a new resources version; returns it with its assigned version."""
        return await self._call("POST", "/resources", resources, resources_from_json)

    async def get_resources(self, resources_id: str | None = None) -> Resources | None:
        """Resources by id, or the latest version when ``resources_id`` is ``None``."""
        body = ResourcesQuery(resources_id=resources_id)
        return await self._call("POST", "/resources/get", body, _resources_answer)

    async def query_resources(self) -> list[Resources]:
        """Every stored resources version, oldest first (the last one is the current one)."""
        return await self._call("GET", "/resources/all", None, _resources_list_answer)

    async def list_rollouts(self, query: RolloutQuery | None = None) -> RolloutPage:
        """A page of rollout summaries matching ``query``, newest first, with the total number of matches."""
        body = query or RolloutQuery()  # the boundary passes a validated query
        return await self._call("POST", "/rollouts/list", body, RolloutPage)

    async def run_stats(self, query: RunStatsQuery | None = None) -> RunStats:
        """Counts per status, reward and success rate per (model version, mode), and recent throughput."""
        body = query or RunStatsQuery()
        return await self._call("POST", "/runs/stats", body, RunStats)

    async def stats(self) -> StoreStats:
        """Counts of what is stored."""
        return await self._call("GET", "/stats", None, StoreStats)


def _rebuild(kwargs: dict[str, Any]) -> StoreClient:
    return StoreClient(**kwargs)
