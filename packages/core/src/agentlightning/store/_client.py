"""`StoreClient`: the `LightningStore` protocol over HTTP, talking to ``agl store serve``."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

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
    NotFoundError,
    RetryPolicy,
    RolloutRequest,
    StorageError,
    StoreError,
    StoreStats,
)
from agentlightning.store._common import (
    check_finish_status,
    check_id,
    check_statuses,
    validate_calls,
    validate_ids,
    validate_requests,
    validate_resources,
    validate_spans,
)
from agentlightning.store._query import RolloutPage, RolloutQuery, RunStats, RunStatsQuery
from agentlightning.store._wire import (
    API_PREFIX,
    MAX_WAIT_SECONDS,
    AddedResponse,
    AttemptRef,
    AttemptsResponse,
    DequeueRequest,
    DequeueResponse,
    EnqueueRequest,
    FinishRequest,
    LLMCallsRequest,
    LLMCallsResponse,
    QueryRolloutsRequest,
    RecordQuery,
    ResourcesListResponse,
    ResourcesQuery,
    ResourcesResponse,
    RolloutRef,
    RolloutsResponse,
    SpansRequest,
    SpansResponse,
    WaitRequest,
)

if TYPE_CHECKING:
    import aiohttp
    import yarl

__all__ = ["InvalidRequestError", "StoreClient", "StoreUnavailableError", "UnauthorizedError"]

logger = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)
_JSON_HEADERS = {"Content-Type": "application/json"}


class StoreUnavailableError(StoreError):
    """The server could not be reached (or kept answering 5xx) after every retry."""


class UnauthorizedError(StoreError):
    """The server refused the bearer token (HTTP 401)."""


class InvalidRequestError(StoreError, ValueError):
    """The server rejected the request as invalid (HTTP 400/413/422); the message names the problem."""


class StoreClient:
    """A `LightningStore` served elsewhere, reached over HTTP (one kept-alive aiohttp session per event loop).

    The client may be used from several event loops and threads at once (a runner's loop and the tracing
    exporter's background loop, say): each loop gets its own connection pool, created on first use.
    Call `close` from each loop that used the client (or let the process end); it only closes that loop's pool.

    Failed requests are retried with exponential backoff on connection errors, timeouts and 5xx answers for
    ``retry_for`` seconds (a minute by default: long enough to ride out a store restart), then raise
    `StoreUnavailableError`. That is safe because every write is idempotent on a client id: rollouts without an
    id get one here before the first try, and ``dequeue_rollout`` / ``add_spans`` / ``add_llm_calls`` carry a
    request id the store remembers, so a retried dequeue returns the same claim and a retried write the right
    count. 4xx answers are not retried; they raise `NotFoundError` (404), `ConflictError` (409),
    `UnauthorizedError` (401) or `StoreError` (other 4xx) with the server's message. A store whose disk is full or
    read-only answers 507, raised at once as `StorageError` (retrying cannot help).

    Args:
        url: Base URL of the served store, e.g. ``http://127.0.0.1:4747``.
        token: Bearer token (``agl store serve --token``); ``None`` when the server has none.
        timeout: Seconds one request may take (long-polls of ``wait_for_rollouts`` get their wait added).
        retries: Most extra tries after a failed one (0 = never retry; ``None``: as many as ``retry_for`` allows).
        backoff: First wait between tries, in seconds; doubled each try up to ``backoff_max``.
        backoff_max: Longest wait between two tries.
        retry_for: Seconds after the first try during which failed tries are retried.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int | None = None,
        backoff: float = 0.1,
        backoff_max: float = 3.0,
        retry_for: float = 60.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"store url must look like http://host:port, got {url!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if retries is not None and retries < 0:
            raise ValueError(f"retries must be >= 0 or None, got {retries}")
        if not retry_for >= 0:
            raise ValueError(f"retry_for must be >= 0 seconds, got {retry_for}")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.retry_for = retry_for
        self._api = self.url + API_PREFIX
        self._headers = dict(_JSON_HEADERS)
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._lock = threading.Lock()
        self._retry_policy: RetryPolicy | None = None
        # Parsed once and reused: aiohttp would otherwise parse the URL string and build a timeout per request.
        self._urls: dict[str, yarl.URL] = {}
        self._timeout: aiohttp.ClientTimeout | None = None

    def __repr__(self) -> str:
        return f"StoreClient({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Sessions belong to one process; a pickled client reconnects lazily on the other side.
        return (_rebuild, (self.reopen_spec()[1],))

    def reopen_spec(self) -> tuple[type[StoreClient], dict[str, Any]]:
        """How to build an equivalent client in another process: ``cls(**kwargs)``."""
        return StoreClient, {
            "url": self.url,
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
                _raise_for(exc.code, exc.read())
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
        # Give every request an id before the first try so that a retry cannot queue it twice.
        checked = validate_requests(requests)
        fixed = [r if r.rollout_id is not None else r.model_copy(update={"rollout_id": new_id("ro")}) for r in checked]
        body = EnqueueRequest.model_construct(requests=fixed)
        return (await self._call("POST", "/rollouts/enqueue", body, RolloutsResponse)).rollouts

    async def enqueue_rollout(self, input: Any = None, **fields: Any) -> Rollout:
        """Queue one rollout; ``fields`` are those of `RolloutRequest`."""
        return (await self.enqueue_rollouts([RolloutRequest(input=input, **fields)]))[0]

    async def dequeue_rollout(self, worker_id: str | None = None, *, request_id: str | None = None) -> Claim | None:
        """Claim the oldest queuing rollout, or ``None`` when the queue is empty.

        Every try of one call carries the same request id (``request_id`` or a fresh one), so a retry after a lost
        answer gets the same claim.
        """
        body = DequeueRequest(worker_id=worker_id, request_id=request_id or uuid.uuid4().hex)
        return (await self._call("POST", "/rollouts/dequeue", body, DequeueResponse)).claim

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record a sign of life; raises `ConflictError` if the attempt is no longer running."""
        body = AttemptRef(rollout_id=rollout_id, attempt_id=attempt_id)
        return await self._call("POST", "/attempts/heartbeat", body, Attempt)

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None = None
    ) -> Rollout:
        """End an attempt and move its rollout on according to the retry policy."""
        body = FinishRequest(
            rollout_id=check_id("rollout_id", rollout_id),
            attempt_id=check_id("attempt_id", attempt_id),
            status=check_finish_status(status),
            error=error,
        )
        return await self._call("POST", "/attempts/finish", body, Rollout)

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""
        body = AttemptRef(rollout_id=check_id("rollout_id", rollout_id), attempt_id=check_id("attempt_id", attempt_id))
        return await self._call("POST", "/attempts/release", body, Rollout)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished."""
        body = RolloutRef(rollout_id=rollout_id)
        try:
            return await self._call("POST", "/rollouts/cancel", body, Rollout)
        except _RetriedConflict as exc:
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
        if not rollout_id:
            raise NotFoundError("rollout id is empty")
        return await self._call("GET", "/rollouts/" + urllib.parse.quote(rollout_id, safe=""), None, Rollout)

    async def query_rollouts(
        self, status: Sequence[RolloutStatus] | None = None, rollout_ids: Sequence[str] | None = None
    ) -> list[Rollout]:
        """Rollouts filtered by status and/or ids, in enqueue order."""
        body = QueryRolloutsRequest(
            status=check_statuses(status),  # pyright: ignore[reportArgumentType]
            rollout_ids=None if rollout_ids is None else validate_ids(rollout_ids, "rollout_ids"),
        )
        return (await self._call("POST", "/rollouts/query", body, RolloutsResponse)).rollouts

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout in order."""
        body = RolloutRef(rollout_id=rollout_id)
        return (await self._call("POST", "/attempts/query", body, AttemptsResponse)).attempts

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until the rollouts finish or ``timeout`` seconds pass (long-polls in slices of up to 20 s)."""
        ids = validate_ids(rollout_ids, "rollout_ids")
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
        # NaN / Infinity are sent as such and refused by the server's validation, naming the field
        checked = validate_spans(spans, check_finite=False)
        if not checked:
            return 0
        body = SpansRequest.model_construct(spans=checked, request_id=request_id or uuid.uuid4().hex)
        return (await self._call("POST", "/spans", body, AddedResponse)).added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (or one attempt), ordered by attempt then sequence_id."""
        body = RecordQuery(rollout_id=rollout_id, attempt_id=attempt_id)
        return (await self._call("POST", "/spans/query", body, SpansResponse)).spans

    async def add_llm_calls(self, calls: Sequence[LLMCall], *, request_id: str | None = None) -> int:
        """Store proxy records (idempotent on call_id); returns how many were new (request ids as in `add_spans`)."""
        checked = validate_calls(calls)
        if not checked:
            return 0
        body = LLMCallsRequest.model_construct(calls=checked, request_id=request_id or uuid.uuid4().hex)
        return (await self._call("POST", "/llm_calls", body, AddedResponse)).added

    async def query_llm_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
        """LLM calls of a rollout (or one attempt) in start order."""
        body = RecordQuery(rollout_id=rollout_id, attempt_id=attempt_id)
        return (await self._call("POST", "/llm_calls/query", body, LLMCallsResponse)).calls

    async def add_resources(self, resources: Resources) -> Resources:
        """Store a new resources version; returns it with its assigned version."""
        return await self._call("POST", "/resources", validate_resources(resources), Resources)

    async def get_resources(self, resources_id: str | None = None) -> Resources | None:
        """Resources by id, or the latest version when ``resources_id`` is ``None``."""
        body = ResourcesQuery(resources_id=resources_id)
        return (await self._call("POST", "/resources/get", body, ResourcesResponse)).resources

    async def query_resources(self) -> list[Resources]:
        """Every stored resources version, oldest first (the last one is the current one)."""
        return (await self._call("GET", "/resources/all", None, ResourcesListResponse)).resources

    async def list_rollouts(self, query: RolloutQuery | None = None) -> RolloutPage:
        """A page of rollout summaries matching ``query``, newest first, with the total number of matches."""
        body = RolloutQuery.model_validate(query if query is not None else {})
        return await self._call("POST", "/rollouts/list", body, RolloutPage)

    async def run_stats(self, query: RunStatsQuery | None = None) -> RunStats:
        """Counts per status, reward and success rate per (model version, mode), and recent throughput."""
        body = RunStatsQuery.model_validate(query if query is not None else {})
        return await self._call("POST", "/runs/stats", body, RunStats)

    async def stats(self) -> StoreStats:
        """Counts of what is stored."""
        return await self._call("GET", "/stats", None, StoreStats)

    async def close(self) -> None:
        """Close the running loop's connection pool (and forget pools of loops that have ended).

        Pools of other loops that are still running are left alone (they may be mid-request); each loop that
        used the client closes its own. The client stays usable: a later call opens a new pool.
        """
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        with self._lock:
            mine = self._sessions.pop(current, None) if current is not None else None
            for stale in [lp for lp in self._sessions if lp.is_closed()]:
                self._sessions.pop(stale).detach()  # its loop is gone: nothing left to await on
        if mine is not None:
            await mine.close()

    # --- transport ----------------------------------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        import aiohttp  # imported on first use: the server side and most importers never need it

        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is not None and not session.closed:
            return session
        with self._lock:
            for stale in [lp for lp in self._sessions if lp.is_closed()]:
                self._sessions.pop(stale).detach()
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=30.0),
                headers=self._headers,
                skip_auto_headers=("User-Agent",),
            )
            self._sessions[loop] = session
        return session

    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | None,
        model: type[_M],
        extra_timeout: float = 0.0,
    ) -> _M:
        import aiohttp

        data = body.__pydantic_serializer__.to_json(body) if body is not None else None
        url = self._urls.get(path)
        if url is None:
            url = _url(self._api + path)
            if method == "POST":  # POST paths are fixed; GET paths may carry an id and are not kept
                self._urls[path] = url
        timeout = self._timeout
        if extra_timeout or timeout is None or timeout.total != self.timeout:
            timeout = aiohttp.ClientTimeout(total=self.timeout + extra_timeout)
            if not extra_timeout:
                self._timeout = timeout
        delay = self.backoff
        last: str = ""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.retry_for
        max_tries = None if self.retries is None else self.retries + 1
        attempt = 0
        while True:
            if attempt:
                if (max_tries is not None and attempt >= max_tries) or loop.time() >= give_up:
                    break
                if attempt == 1:
                    logger.warning(
                        "store at %s: %s %s failed (%s); retrying for up to %.0f s",
                        self.url,
                        method,
                        path,
                        last,
                        self.retry_for,
                    )
                await asyncio.sleep(min(delay * (0.5 + random.random()), max(0.0, give_up - loop.time())))
                delay = min(delay * 2, self.backoff_max)
            attempt += 1
            try:
                async with self._session().request(method, url, data=data, timeout=timeout) as resp:
                    payload = await resp.read()
                    status = resp.status
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                logger.debug("store %s %s failed (%s); try %d", method, path, last, attempt)
                continue
            if status < 300:
                if attempt > 1:
                    logger.warning("store at %s answered %s %s again after %d tries", self.url, method, path, attempt)
                return model.model_validate_json(payload)
            if status >= 500 and status != 507:
                last = f"HTTP {status}: {_message(payload)}"
                logger.debug("store %s %s answered %s; try %d", method, path, last, attempt)
                continue
            if status == 409 and attempt > 1:
                raise _RetriedConflict(_message(payload))
            _raise_for(status, payload)
        raise StoreUnavailableError(
            f"store at {self.url} did not answer {method} {path} after {attempt} tries in "
            f"{self.retry_for:.0f} s: {last}"
        )


class _RetriedConflict(ConflictError):
    """A conflict seen on a retry: an earlier try may have succeeded before its answer was lost."""


def _url(text: str) -> yarl.URL:
    import yarl  # comes with aiohttp, imported with it on first use

    return yarl.URL(text)


def _rebuild(kwargs: dict[str, Any]) -> StoreClient:
    return StoreClient(**kwargs)


def _message(payload: bytes) -> str:
    try:
        data = json.loads(payload)
    except ValueError:
        return payload[:500].decode(errors="replace")
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])  # pyright: ignore[reportUnknownArgumentType]
    return str(data)[:500]


def _raise_for(status: int, payload: bytes) -> None:
    message = _message(payload)
    if status == 404:
        raise NotFoundError(message)
    if status == 409:
        raise ConflictError(message)
    if status == 401:
        raise UnauthorizedError(message)
    if status in (400, 413, 422):
        raise InvalidRequestError(message)
    if status == 507:
        raise StorageError(message)
    raise StoreError(f"store rejected the request (HTTP {status}): {message}")
