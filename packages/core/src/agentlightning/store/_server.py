"""The store served over HTTP: an ASGI app wrapping any `LightningStore` (what ``agl store serve`` runs).

Every route is declared once, in `store_routes` (the store protocol), `dashboard_routes` and the caller's
``extra_routes`` (``agl store serve`` adds the browser dashboard's, `agentlightning.ui.ui_routes`: the store never
imports the dashboard, which imports the store); the same table is dispatched by `StoreASGI` and written out as
the OpenAPI 3.1 document at ``/openapi.json`` (no Swagger UI or ReDoc page: they load their scripts from a CDN;
open the document in any OpenAPI viewer). Bodies are JSON `_wire` models.

A served store always has a bearer token (a browser can reach a server on this machine: see
`agentlightning._netauth.cross_site_refusal` for what else keeps web pages out).

Errors are JSON `ErrorResponse` bodies: 401 (missing/wrong bearer token), 403 (a foreign ``Origin``, or ``Host``
over loopback), 415 (a write whose body is not ``application/json``), 404 (unknown id or route),
409 (conflict with the stored state), 413 (body over ``max_body_bytes``), 422 (malformed JSON, wrong types,
a record that fails validation, NaN or Infinity anywhere), 507 (the disk is full or the database read-only; also
reported by ``/healthz`` as 503), 503 (the database cannot be reached: a PostgreSQL outage, logged once and reported
by ``/healthz`` too; clients retry) and 400 (any other `StoreError`). Bad input never reaches the store half-way:
a body is validated as a whole before the store is called.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, TypeAdapter

import agentlightning._serve_required  # noqa: F401  # pyright: ignore[reportUnusedImport]  # the install line first
from agentlightning._models import Attempt, Claim, Resources, Rollout
from agentlightning._routing import OPEN, Route, RouteTable, openapi_document
from agentlightning._server_base import STORE_MAX_BODY_BYTES
from agentlightning.store._asgi import Answer, StoreASGI
from agentlightning.store._base import LightningStore, RetryPolicy, StoreStats
from agentlightning.store._otlp_in import otlp_routes
from agentlightning.store._server_dashboard import dashboard_routes
from agentlightning.store._wire import (
    API_PREFIX,
    AddedResponse,
    AttemptRef,
    AttemptsResponse,
    DequeueManyRequest,
    DequeueManyResponse,
    DequeueRequest,
    DequeueResponse,
    EnqueueRequest,
    ErrorResponse,
    FinishRequest,
    HealthResponse,
    HeartbeatManyRequest,
    LLMCallsRequest,
    LLMCallsResponse,
    QueryRolloutsRequest,
    RecordQuery,
    ResourcesQuery,
    ResourcesResponse,
    RolloutRef,
    RolloutsResponse,
    SpansRequest,
    SpansResponse,
    WaitRequest,
    read_spans_request,
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_store_app"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = STORE_MAX_BODY_BYTES
"""Largest request body accepted by default (32 MiB); larger ones get 413."""

_DEQUEUE_MEMORY_SECONDS = 300.0
_DEQUEUE_MEMORY_SIZE = 10_000


_TITLE = "Agent Lightning store"
_DESCRIPTION = "The LightningStore protocol over HTTP. Authenticate with 'Authorization: Bearer <token>'."
_COMMON_ERRORS = {
    401: "missing or wrong bearer token",
    403: "a request a foreign web page could have sent (its Origin, or a Host that is not this machine on loopback)",
    415: "a body that is not Content-Type: application/json",
    413: "body too large",
    422: "malformed or invalid body",
}
_NOT_FOUND = {404: "unknown id"}
_CONFLICT = {409: "conflicting state"}
_LATE = {409: "an attempt of the batch no longer runs (error attempt_ended): nothing of the batch is stored"}
_BEARER = {"bearer": {"type": "http", "scheme": "bearer"}}


class _DequeueMemory:
    """Recent dequeue answers by client request id, so a retried dequeue gets the same claim back."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[float, asyncio.Future[bytes]]] = OrderedDict()

    def get_or_start(self, request_id: str) -> tuple[asyncio.Future[bytes], bool]:
        now = time.monotonic()
        while self._entries:
            oldest_id, (expiry, fut) = next(iter(self._entries.items()))
            if (expiry < now and fut.done()) or len(self._entries) > _DEQUEUE_MEMORY_SIZE:
                del self._entries[oldest_id]
            else:
                break
        entry = self._entries.get(request_id)
        if entry is not None:
            return entry[1], False
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._entries[request_id] = (now + _DEQUEUE_MEMORY_SECONDS, fut)
        return fut, True

    def fail(self, request_id: str, fut: asyncio.Future[bytes], exc: BaseException) -> None:
        """Forget ``request_id`` (a retry tries again) and hand ``exc`` to the tries waiting on ``fut``."""
        self._entries.pop(request_id, None)
        if isinstance(exc, asyncio.CancelledError):
            fut.cancel()
        else:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: concurrent waiters re-raise it themselves


# The hot answers are written straight from the serializers: the same bytes as dumping the `_wire` response
# model, without building that model first (``model_construct`` alone costs more than serialising a claim).
_ROLLOUTS_JSON = TypeAdapter(list[Rollout]).serializer.to_json
_CLAIM_JSON = Claim.__pydantic_serializer__.to_json


def _dump(model: BaseModel) -> bytes:
    """JSON bytes of ``model`` (as ``model_dump_json().encode()``, without the str round trip)."""
    return model.__pydantic_serializer__.to_json(model)


def _claim_answer(claim: Claim | None) -> bytes:
    return b'{"claim":null}' if claim is None else b'{"claim":' + _CLAIM_JSON(claim) + b"}"


def _claims_answer(claims: list[Claim]) -> bytes:
    return b'{"claims":[' + b",".join(_CLAIM_JSON(claim) for claim in claims) + b"]}"


def _added_answer(added: int) -> bytes:
    if type(added) is not int:  # exactly int (not bool or a subclass): anything else is validated as before
        return _dump(AddedResponse(added=added))
    return b'{"added":%d}' % added


def create_store_app(
    store: LightningStore,
    token: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    extra_routes: Sequence[Route] = (),
) -> StoreASGI:
    """Build the ASGI app that serves ``store`` over HTTP.

    Args:
        store: Any backend (SQLite for a durable served store, memory for tests).
        token: Every request except ``GET /healthz`` and the dashboard's files must carry
            ``Authorization: Bearer <token>`` or gets 401 (required: a web page could otherwise write to a store on
            this machine; ``secrets.token_urlsafe(32)`` makes one). ``/healthz`` stays open so load balancers
            and process supervisors can probe it; it reveals nothing but liveness.
        max_body_bytes: Request bodies larger than this get 413 before they are read into memory.
        extra_routes: More routes served from the same table and document, e.g. the browser dashboard's
            (`agentlightning.ui.ui_routes`: its page loads without a token and takes it from the URL's ``#token=``
            fragment or asks for it).

    Returns:
        The ASGI app; run it with uvicorn (``agl store serve`` does).

    Raises:
        ValueError: ``token`` is empty, or ``max_body_bytes`` is not positive.
    """
    if not token:
        raise ValueError("a served store needs a bearer token: pass token=... (secrets.token_urlsafe(32) makes one)")
    if max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
    routes = [*store_routes(store), *otlp_routes(store, token), *dashboard_routes(store), *extra_routes]
    document = openapi_document(
        routes,
        title=_TITLE,
        version="1",
        description=_DESCRIPTION,
        error_model=ErrorResponse,
        common_errors=_COMMON_ERRORS,
        security=_BEARER,
    )
    return StoreASGI(RouteTable(routes + _document_routes(document)), token, max_body_bytes)


def _document_routes(document: dict[str, Any]) -> list[Route]:
    """``/openapi.json`` (behind the token like the API it describes).

    No Swagger UI or ReDoc page: both load their scripts and styles from a CDN, which a page served with the
    store's authority must not do.
    """
    body = json.dumps(document, separators=(",", ":")).encode()

    async def openapi(_: None) -> bytes:
        return body

    return [Route("GET", "/openapi.json", openapi, "openapi", "This document.", documented=False)]


def store_routes(store: LightningStore) -> list[Route]:
    """The store protocol's routes over ``store``: the one declaration both served and documented."""
    return [
        *_health_routes(store),
        *_rollout_routes(store),
        *_attempt_routes(store),
        *_record_routes(store),
        *_resource_routes(store),
    ]


def _health_routes(store: LightningStore) -> list[Route]:
    """``/healthz``, the retry policy and the counts."""

    async def healthz(_: None) -> Answer:
        # A store over a database server asks it now (a load balancer must not route to a store whose database is
        # down); the others know from their last write.
        check = getattr(store, "check_health", None)
        error: str | None = await check() if check is not None else getattr(store, "storage_error", None)
        if error is None:
            return b'{"status":"ok"}'
        return 503, _dump(HealthResponse(status="failing", message=error))

    async def retry_policy(_: None) -> bytes:
        return _dump(store.retry_policy)

    async def stats(_: None) -> bytes:
        return _dump(await store.stats())

    p = API_PREFIX
    return [
        Route("GET", "/healthz", healthz, "healthz",
              "Liveness probe (open without a token); 503 with the reason while the store cannot serve.",
              response=HealthResponse,
              errors={503: "the store cannot serve (its database unreachable, a full disk, a read-only database)"},
              tags=("health",), auth=OPEN),
        Route("GET", f"{p}/retry_policy", retry_policy, "retry_policy", "The retry policy the store applies.",
              response=RetryPolicy, tags=("store",)),
        Route("GET", f"{p}/stats", stats, "stats", "Counts of what is stored.", response=StoreStats, tags=("store",)),
    ]  # fmt: skip


def _rollout_routes(store: LightningStore) -> list[Route]:
    """Rollouts: get, enqueue, dequeue (one or many), query, cancel, wait."""
    dequeues = _DequeueMemory()

    async def get_rollout(params: dict[str, str]) -> bytes:
        return _dump(await store.get_rollout(params["rollout_id"]))

    async def enqueue(body: EnqueueRequest) -> bytes:
        return b'{"rollouts":' + _ROLLOUTS_JSON(await store.enqueue_rollouts(body.requests)) + b"}"

    async def dequeue(body: DequeueRequest) -> bytes:
        if body.request_id is None:
            return _claim_answer(await store.dequeue_rollout(body.worker_id))
        # In flight: concurrent tries share one answer here; done: the store answers from its durable memory.
        fut, first = dequeues.get_or_start(body.request_id)
        if first:
            try:
                claim = await store.dequeue_rollout(body.worker_id, request_id=body.request_id)
            except BaseException as exc:
                dequeues.fail(body.request_id, fut, exc)
                raise
            fut.set_result(_claim_answer(claim))
        return await asyncio.shield(fut)

    async def dequeue_many(body: DequeueManyRequest) -> bytes:
        if body.request_id is None:
            claims = await store.dequeue_many(body.worker_ids)
        else:  # concurrent tries share one answer, as for `dequeue`
            key = "many:" + body.request_id
            fut, first = dequeues.get_or_start(key)
            if not first:
                return await asyncio.shield(fut)
            try:
                claims = await store.dequeue_many(body.worker_ids, request_id=body.request_id)
            except BaseException as exc:
                dequeues.fail(key, fut, exc)
                raise
            fut.set_result(_claims_answer(claims))
            return await asyncio.shield(fut)
        return _claims_answer(claims)

    async def query_rollouts(body: QueryRolloutsRequest) -> bytes:
        rollouts = await store.query_rollouts(status=body.status, rollout_ids=body.rollout_ids)
        return b'{"rollouts":' + _ROLLOUTS_JSON(rollouts) + b"}"

    async def cancel(body: RolloutRef) -> bytes:
        return _dump(await store.cancel_rollout(body.rollout_id))

    async def wait(body: WaitRequest) -> bytes:
        rollouts = await store.wait_for_rollouts(body.rollout_ids, timeout=body.timeout)
        return _dump(RolloutsResponse.model_construct(rollouts=rollouts))

    p = API_PREFIX
    return [
        Route("GET", f"{p}/rollouts/{{rollout_id:path}}", get_rollout, "get_rollout", "One rollout by id.",
              response=Rollout, errors=_NOT_FOUND, tags=("rollouts",)),
        Route("POST", f"{p}/rollouts/enqueue", enqueue, "enqueue",
              "Queue rollouts; an already known ``rollout_id`` returns the stored rollout unchanged.",
              body=EnqueueRequest, response=RolloutsResponse, tags=("rollouts",)),
        Route("POST", f"{p}/rollouts/dequeue", dequeue, "dequeue",
              "Claim the oldest queuing rollout; a repeated ``request_id`` gets the same answer back.",
              body=DequeueRequest, response=DequeueResponse, tags=("rollouts",)),
        Route("POST", f"{p}/rollouts/dequeue_many", dequeue_many, "dequeue_many",
              "Claim up to one queuing rollout per worker in ``worker_ids`` (oldest first); a repeated "
              "``request_id`` gets the same answer back.",
              body=DequeueManyRequest, response=DequeueManyResponse, tags=("rollouts",)),
        Route("POST", f"{p}/rollouts/query", query_rollouts, "query_rollouts",
              "Rollouts filtered by status and/or ids, in enqueue order.",
              body=QueryRolloutsRequest, response=RolloutsResponse, tags=("rollouts",)),
        Route("POST", f"{p}/rollouts/cancel", cancel, "cancel", "Cancel a rollout that has not finished.",
              body=RolloutRef, response=Rollout, errors={**_NOT_FOUND, **_CONFLICT}, tags=("rollouts",)),
        Route("POST", f"{p}/rollouts/wait", wait, "wait",
              "Long-poll until the rollouts finish or ``timeout`` passes; returns the finished ones.",
              body=WaitRequest, response=RolloutsResponse, errors=_NOT_FOUND, tags=("rollouts",)),
    ]  # fmt: skip


def _attempt_routes(store: LightningStore) -> list[Route]:
    """Attempts: heartbeat, finish, release, query, timeouts."""

    async def heartbeat(body: AttemptRef) -> bytes:
        return _dump(await store.heartbeat(body.rollout_id, body.attempt_id))

    async def heartbeat_many(body: HeartbeatManyRequest) -> bytes:
        attempts = await store.heartbeat_many([(ref.rollout_id, ref.attempt_id) for ref in body.attempts])
        return _dump(AttemptsResponse.model_construct(attempts=attempts))

    async def finish(body: FinishRequest) -> bytes:
        return _dump(await store.finish_attempt(body.rollout_id, body.attempt_id, body.status, body.error))

    async def release(body: AttemptRef) -> bytes:
        return _dump(await store.release_claim(body.rollout_id, body.attempt_id))

    async def query_attempts(body: RolloutRef) -> bytes:
        return _dump(AttemptsResponse.model_construct(attempts=await store.query_attempts(body.rollout_id)))

    async def check_timeouts(_: None) -> bytes:
        return _dump(AttemptsResponse.model_construct(attempts=await store.check_timeouts()))

    p = API_PREFIX
    return [
        Route("POST", f"{p}/attempts/heartbeat", heartbeat, "heartbeat", "Record a sign of life of a running attempt.",
              body=AttemptRef, response=Attempt, errors={**_NOT_FOUND, **_CONFLICT}, tags=("attempts",)),
        Route("POST", f"{p}/attempts/heartbeat_many", heartbeat_many, "heartbeat_many",
              "Record a sign of life of several attempts; those no longer running come back unchanged.",
              body=HeartbeatManyRequest, response=AttemptsResponse, errors=_NOT_FOUND, tags=("attempts",)),
        Route("POST", f"{p}/attempts/finish", finish, "finish",
              "End an attempt; the rollout moves on according to the retry policy.",
              body=FinishRequest, response=Rollout, errors={**_NOT_FOUND, **_CONFLICT}, tags=("attempts",)),
        Route("POST", f"{p}/attempts/release", release, "release",
              "Give a running attempt back (a runner shutting down): its rollout is queued again at once.",
              body=AttemptRef, response=Rollout, errors=_NOT_FOUND, tags=("attempts",)),
        Route("POST", f"{p}/attempts/query", query_attempts, "query_attempts", "Attempts of a rollout in order.",
              body=RolloutRef, response=AttemptsResponse, errors=_NOT_FOUND, tags=("attempts",)),
        Route("POST", f"{p}/attempts/check_timeouts", check_timeouts, "check_timeouts",
              "Apply heartbeat and rollout timeouts now; returns the attempts that were ended.",
              response=AttemptsResponse, tags=("attempts",)),
    ]  # fmt: skip


def _record_routes(store: LightningStore) -> list[Route]:
    """Spans and LLM calls: add (a batch) and query."""

    async def add_spans(body: SpansRequest) -> bytes:
        if body.request_id is None:
            return _added_answer(await store.add_spans(body.spans))
        return _added_answer(await store.add_spans(body.spans, request_id=body.request_id))

    async def query_spans(body: RecordQuery) -> bytes:
        return _dump(SpansResponse.model_construct(spans=await store.query_spans(body.rollout_id, body.attempt_id)))

    async def add_llm_calls(body: LLMCallsRequest) -> bytes:
        if body.request_id is None:
            return _added_answer(await store.add_llm_calls(body.calls))
        return _added_answer(await store.add_llm_calls(body.calls, request_id=body.request_id))

    async def query_llm_calls(body: RecordQuery) -> bytes:
        calls = await store.query_llm_calls(body.rollout_id, body.attempt_id)
        return _dump(LLMCallsResponse.model_construct(calls=calls))

    p = API_PREFIX
    return [
        Route("POST", f"{p}/spans", add_spans, "add_spans",
              "Store a batch of spans (idempotent on rollout, attempt and span id).",
              body=SpansRequest, read=read_spans_request, response=AddedResponse, errors={**_NOT_FOUND, **_LATE},
              tags=("records",)),
        Route("POST", f"{p}/spans/query", query_spans, "query_spans", "Spans of a rollout (or one attempt).",
              body=RecordQuery, response=SpansResponse, tags=("records",)),
        Route("POST", f"{p}/llm_calls", add_llm_calls, "add_llm_calls",
              "Store a batch of LLM-proxy records (idempotent on call id).",
              body=LLMCallsRequest, response=AddedResponse, errors={**_NOT_FOUND, **_LATE}, tags=("records",)),
        Route("POST", f"{p}/llm_calls/query", query_llm_calls, "query_llm_calls",
              "LLM calls of a rollout (or one attempt).",
              body=RecordQuery, response=LLMCallsResponse, tags=("records",)),
    ]  # fmt: skip


def _resource_routes(store: LightningStore) -> list[Route]:
    """Resources versions: add and get."""

    async def add_resources(body: Resources) -> bytes:
        return _dump(await store.add_resources(body))

    async def get_resources(body: ResourcesQuery) -> bytes:
        return _dump(ResourcesResponse.model_construct(resources=await store.get_resources(body.resources_id)))

    p = API_PREFIX
    return [
        Route("POST", f"{p}/resources", add_resources, "add_resources",
              "Store a new resources version (a known ``resources_id`` returns the stored one).",
              body=Resources, response=Resources, tags=("resources",)),
        Route("POST", f"{p}/resources/get", get_resources, "get_resources", "Resources by id, or the latest version.",
              body=ResourcesQuery, response=ResourcesResponse, errors=_NOT_FOUND, tags=("resources",)),
    ]  # fmt: skip
