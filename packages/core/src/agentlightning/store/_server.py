"""The store served over HTTP: a FastAPI app wrapping any `LightningStore` (what ``agl store serve`` runs).

Endpoints (JSON bodies, see ``/openapi.json``):

==========================================  ==========================================
``GET  /healthz``                           liveness (503 while writes fail); open without a token
``GET  /v1/retry_policy``                   the store's `RetryPolicy`
``POST /v1/rollouts/enqueue``               `EnqueueRequest` -> `RolloutsResponse`
``POST /v1/rollouts/dequeue``               `DequeueRequest` -> `DequeueResponse`
``POST /v1/rollouts/query``                 `QueryRolloutsRequest` -> `RolloutsResponse`
``POST /v1/rollouts/cancel``                `RolloutRef` -> `Rollout`
``POST /v1/rollouts/wait``                  `WaitRequest` -> `RolloutsResponse` (long-poll)
``GET  /v1/rollouts/{rollout_id}``          `Rollout`
``POST /v1/attempts/heartbeat``             `AttemptRef` -> `Attempt`
``POST /v1/attempts/finish``                `FinishRequest` -> `Rollout`
``POST /v1/attempts/release``               `AttemptRef` -> `Rollout` (a worker gives its claim back)
``POST /v1/attempts/query``                 `RolloutRef` -> `AttemptsResponse`
``POST /v1/attempts/check_timeouts``        -> `AttemptsResponse`
``POST /v1/spans`` / ``/v1/spans/query``    `SpansRequest` -> `AddedResponse` / `RecordQuery` -> `SpansResponse`
``POST /v1/llm_calls`` / ``.../query``      `LLMCallsRequest` -> `AddedResponse` / `RecordQuery` -> ...
``POST /v1/resources`` / ``.../get``        `Resources` -> `Resources` / `ResourcesQuery` -> `ResourcesResponse`
``GET  /v1/stats``                          `StoreStats`
==========================================  ==========================================

Errors are JSON `ErrorResponse` bodies: 401 (missing/wrong bearer token), 404 (unknown id or route),
409 (conflict with the stored state), 413 (body over ``max_body_bytes``), 422 (malformed JSON, wrong types,
a record that fails validation, NaN or Infinity anywhere), 507 (the disk is full or the database read-only; also
reported by ``/healthz`` as 503) and 400 (any other `StoreError`). Bad input never reaches the store half-way:
a body is validated as a whole before the store is called.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from agentlightning._models import Attempt, Claim, Resources, Rollout
from agentlightning.store._asgi import (
    ASGIApp,
    FastRoute,
    GuardMiddleware,
    Receive,
    Scope,
    Send,
    classify_error,
    describe_validation,
    is_open,
)
from agentlightning.store._base import LightningStore, RetryPolicy, StoreError, StoreStats
from agentlightning.store._server_dashboard import add_dashboard_routes
from agentlightning.store._wire import (
    API_PREFIX,
    AddedResponse,
    AttemptRef,
    AttemptsResponse,
    DequeueRequest,
    DequeueResponse,
    EnqueueRequest,
    ErrorResponse,
    FinishRequest,
    HealthResponse,
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
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_store_app"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body accepted by default (32 MiB); larger ones get 413."""

_DEQUEUE_MEMORY_SECONDS = 300.0
_DEQUEUE_MEMORY_SIZE = 10_000


class _Json(Response):
    media_type = "application/json"


def _json(model: BaseModel, status_code: int = 200) -> Response:
    return _Json(model.model_dump_json(), status_code=status_code)


def _error(status_code: int, error: str, message: str) -> Response:
    return _json(ErrorResponse(error=error, message=message), status_code)


class _StoreApp(FastAPI):
    """The FastAPI app with `GuardMiddleware` in front of FastAPI's own middleware stack, not inside it.

    The guard answers the hot POST endpoints itself; placed outermost, those requests skip the layers FastAPI
    wraps around every request (error and telemetry middleware, body limit, the ``send`` wrapper), which cost as
    much server time as the store call itself. Everything else reaches the FastAPI stack unchanged.
    """

    _guard: ASGIApp | None = None

    def install_guard(self, guard: Callable[[ASGIApp], ASGIApp]) -> None:
        """Put ``guard(framework)`` in front of the app, ``framework`` being the plain FastAPI app."""
        self._guard = guard(self._framework)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guard = self._guard
        if guard is None:
            await super().__call__(scope, receive, send)
        else:
            await guard(scope, receive, send)

    async def _framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


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

    def forget(self, request_id: str) -> None:
        self._entries.pop(request_id, None)


# The hot answers are written straight from the serializers: the same bytes as dumping the `_wire` response
# model, without building that model first (``model_construct`` alone costs more than serialising a claim).
_ROLLOUTS_JSON = TypeAdapter(list[Rollout]).serializer.to_json
_CLAIM_JSON = Claim.__pydantic_serializer__.to_json


def _dump(model: BaseModel) -> bytes:
    """JSON bytes of ``model`` (as ``model_dump_json().encode()``, without the str round trip)."""
    return model.__pydantic_serializer__.to_json(model)


def _claim_answer(claim: Claim | None) -> bytes:
    return b'{"claim":null}' if claim is None else b'{"claim":' + _CLAIM_JSON(claim) + b"}"


def _added_answer(added: int) -> bytes:
    if type(added) is not int:  # exactly int (not bool or a subclass): anything else is validated as before
        return _dump(AddedResponse(added=added))
    return b'{"added":%d}' % added


def create_store_app(
    store: LightningStore,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ui: bool = True,
) -> FastAPI:
    """Build the ASGI app that serves ``store`` over HTTP.

    Args:
        store: Any backend (SQLite for a durable served store, memory for tests).
        token: When set, every request except ``GET /healthz`` must carry ``Authorization: Bearer <token>``
            or gets 401. ``/healthz`` stays open so load balancers and process supervisors can probe it;
            it reveals nothing but liveness.
        max_body_bytes: Request bodies larger than this get 413 before they are read into memory.
        ui: Serve the browser dashboard at ``/ui`` (its page loads without a token and asks for it).

    Returns:
        A FastAPI app; run it with uvicorn (``agl store serve`` does).
    """
    if max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
    app = _StoreApp(
        title="Agent Lightning store",
        version="1",
        description="The LightningStore protocol over HTTP. Authenticate with 'Authorization: Bearer <token>'.",
        responses={
            401: {"model": ErrorResponse, "description": "missing or wrong bearer token"},
            413: {"model": ErrorResponse, "description": "body too large"},
            422: {"model": ErrorResponse, "description": "malformed or invalid body"},
        },
    )
    dequeues = _DequeueMemory()
    not_found: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "unknown id"}}
    conflict: dict[int | str, dict[str, Any]] = {409: {"model": ErrorResponse, "description": "conflicting state"}}
    _install_error_handlers(app)

    # --- the work of each POST endpoint, answering pre-serialised JSON bytes ---------------------------------

    async def do_enqueue(body: EnqueueRequest) -> bytes:
        return b'{"rollouts":' + _ROLLOUTS_JSON(await store.enqueue_rollouts(body.requests)) + b"}"

    async def do_dequeue(body: DequeueRequest) -> bytes:
        if body.request_id is None:
            return _claim_answer(await store.dequeue_rollout(body.worker_id))
        # In flight: concurrent tries share one answer here; done: the store answers from its durable memory.
        fut, first = dequeues.get_or_start(body.request_id)
        if first:
            try:
                claim = await store.dequeue_rollout(body.worker_id, request_id=body.request_id)
            except BaseException as exc:
                dequeues.forget(body.request_id)
                if isinstance(exc, asyncio.CancelledError):
                    fut.cancel()
                else:
                    fut.set_exception(exc)
                    fut.exception()  # mark retrieved: concurrent waiters re-raise it themselves
                raise
            fut.set_result(_claim_answer(claim))
        return await asyncio.shield(fut)

    async def do_query_rollouts(body: QueryRolloutsRequest) -> bytes:
        rollouts = await store.query_rollouts(status=body.status, rollout_ids=body.rollout_ids)
        return b'{"rollouts":' + _ROLLOUTS_JSON(rollouts) + b"}"

    async def do_cancel(body: RolloutRef) -> bytes:
        return _dump(await store.cancel_rollout(body.rollout_id))

    async def do_wait(body: WaitRequest) -> bytes:
        rollouts = await store.wait_for_rollouts(body.rollout_ids, timeout=body.timeout)
        return _dump(RolloutsResponse.model_construct(rollouts=rollouts))

    async def do_heartbeat(body: AttemptRef) -> bytes:
        return _dump(await store.heartbeat(body.rollout_id, body.attempt_id))

    async def do_finish(body: FinishRequest) -> bytes:
        return _dump(await store.finish_attempt(body.rollout_id, body.attempt_id, body.status, body.error))

    async def do_release(body: AttemptRef) -> bytes:
        return _dump(await store.release_claim(body.rollout_id, body.attempt_id))

    async def do_query_attempts(body: RolloutRef) -> bytes:
        return _dump(AttemptsResponse.model_construct(attempts=await store.query_attempts(body.rollout_id)))

    async def do_check_timeouts(body: None) -> bytes:
        return _dump(AttemptsResponse.model_construct(attempts=await store.check_timeouts()))

    async def do_add_spans(body: SpansRequest) -> bytes:
        if body.request_id is None:
            return _added_answer(await store.add_spans(body.spans))
        return _added_answer(await store.add_spans(body.spans, request_id=body.request_id))

    async def do_query_spans(body: RecordQuery) -> bytes:
        return _dump(SpansResponse.model_construct(spans=await store.query_spans(body.rollout_id, body.attempt_id)))

    async def do_add_calls(body: LLMCallsRequest) -> bytes:
        if body.request_id is None:
            return _added_answer(await store.add_llm_calls(body.calls))
        return _added_answer(await store.add_llm_calls(body.calls, request_id=body.request_id))

    async def do_query_calls(body: RecordQuery) -> bytes:
        calls = await store.query_llm_calls(body.rollout_id, body.attempt_id)
        return _dump(LLMCallsResponse.model_construct(calls=calls))

    async def do_add_resources(body: Resources) -> bytes:
        if "\x00" in body.resources_id:
            raise ValueError(f"resources_id must not contain NUL characters, got {body.resources_id!r}")
        return _dump(await store.add_resources(body))

    async def do_get_resources(body: ResourcesQuery) -> bytes:
        return _dump(ResourcesResponse.model_construct(resources=await store.get_resources(body.resources_id)))

    p = API_PREFIX
    fast: dict[str, FastRoute] = {
        f"{p}/rollouts/enqueue": (EnqueueRequest, do_enqueue),
        f"{p}/rollouts/dequeue": (DequeueRequest, do_dequeue),
        f"{p}/rollouts/query": (QueryRolloutsRequest, do_query_rollouts),
        f"{p}/rollouts/cancel": (RolloutRef, do_cancel),
        f"{p}/rollouts/wait": (WaitRequest, do_wait),
        f"{p}/attempts/heartbeat": (AttemptRef, do_heartbeat),
        f"{p}/attempts/finish": (FinishRequest, do_finish),
        f"{p}/attempts/release": (AttemptRef, do_release),
        f"{p}/attempts/query": (RolloutRef, do_query_attempts),
        f"{p}/attempts/check_timeouts": (None, do_check_timeouts),
        f"{p}/spans": (SpansRequest, do_add_spans),
        f"{p}/spans/query": (RecordQuery, do_query_spans),
        f"{p}/llm_calls": (LLMCallsRequest, do_add_calls),
        f"{p}/llm_calls/query": (RecordQuery, do_query_calls),
        f"{p}/resources": (Resources, do_add_resources),
        f"{p}/resources/get": (ResourcesQuery, do_get_resources),
    }
    fast.update(add_dashboard_routes(app, store))
    if ui:
        from agentlightning.ui import add_ui_routes  # the dashboard imports transitions and credit: only when served

        add_ui_routes(app, store)

    # --- FastAPI routes: they document the API (and serve it if the fast path is bypassed) --------------------

    @app.get("/healthz", response_model=HealthResponse, tags=["health"])
    async def healthz() -> Response:  # pyright: ignore[reportUnusedFunction]
        """Liveness probe (open without a token); 503 with the reason while the store cannot write."""
        error: str | None = getattr(store, "storage_error", None)
        if error is None:
            return _Json(b'{"status":"ok"}')
        return _json(HealthResponse(status="failing", message=error), 503)

    @app.get(f"{p}/retry_policy", response_model=RetryPolicy, tags=["store"])
    async def retry_policy() -> Response:  # pyright: ignore[reportUnusedFunction]
        """The retry policy the store applies."""
        return _json(store.retry_policy)

    @app.get(f"{p}/stats", response_model=StoreStats, tags=["store"])
    async def stats() -> Response:  # pyright: ignore[reportUnusedFunction]
        """Counts of what is stored."""
        return _json(await store.stats())

    @app.get(f"{p}/rollouts/{{rollout_id:path}}", response_model=Rollout, responses=not_found, tags=["rollouts"])
    async def get_rollout(rollout_id: str) -> Response:  # pyright: ignore[reportUnusedFunction]
        """One rollout by id."""
        return _json(await store.get_rollout(rollout_id))

    @app.post(f"{p}/rollouts/enqueue", response_model=RolloutsResponse, tags=["rollouts"])
    async def enqueue(body: EnqueueRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Queue rollouts; an already known ``rollout_id`` returns the stored rollout unchanged."""
        return _Json(await do_enqueue(body))

    @app.post(f"{p}/rollouts/dequeue", response_model=DequeueResponse, tags=["rollouts"])
    async def dequeue(body: DequeueRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Claim the oldest queuing rollout; a repeated ``request_id`` gets the same answer back."""
        return _Json(await do_dequeue(body))

    @app.post(f"{p}/rollouts/query", response_model=RolloutsResponse, tags=["rollouts"])
    async def query_rollouts(body: QueryRolloutsRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Rollouts filtered by status and/or ids, in enqueue order."""
        return _Json(await do_query_rollouts(body))

    @app.post(f"{p}/rollouts/cancel", response_model=Rollout, responses={**not_found, **conflict}, tags=["rollouts"])
    async def cancel(body: RolloutRef) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Cancel a rollout that has not finished."""
        return _Json(await do_cancel(body))

    @app.post(f"{p}/rollouts/wait", response_model=RolloutsResponse, responses=not_found, tags=["rollouts"])
    async def wait(body: WaitRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Long-poll until the rollouts finish or ``timeout`` passes; returns the finished ones."""
        return _Json(await do_wait(body))

    @app.post(f"{p}/attempts/heartbeat", response_model=Attempt, responses={**not_found, **conflict}, tags=["attempts"])
    async def heartbeat(body: AttemptRef) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Record a sign of life of a running attempt."""
        return _Json(await do_heartbeat(body))

    @app.post(f"{p}/attempts/finish", response_model=Rollout, responses={**not_found, **conflict}, tags=["attempts"])
    async def finish(body: FinishRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """End an attempt; the rollout moves on according to the retry policy."""
        return _Json(await do_finish(body))

    @app.post(f"{p}/attempts/release", response_model=Rollout, responses=not_found, tags=["attempts"])
    async def release(body: AttemptRef) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Give a running attempt back (a runner shutting down): its rollout is queued again at once."""
        return _Json(await do_release(body))

    @app.post(f"{p}/attempts/query", response_model=AttemptsResponse, responses=not_found, tags=["attempts"])
    async def query_attempts(body: RolloutRef) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Attempts of a rollout in order."""
        return _Json(await do_query_attempts(body))

    @app.post(f"{p}/attempts/check_timeouts", response_model=AttemptsResponse, tags=["attempts"])
    async def check_timeouts() -> Response:  # pyright: ignore[reportUnusedFunction]
        """Apply heartbeat and rollout timeouts now; returns the attempts that were ended."""
        return _Json(await do_check_timeouts(None))

    @app.post(f"{p}/spans", response_model=AddedResponse, responses=not_found, tags=["records"])
    async def add_spans(body: SpansRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Store a batch of spans (idempotent on rollout, attempt and span id)."""
        return _Json(await do_add_spans(body))

    @app.post(f"{p}/spans/query", response_model=SpansResponse, tags=["records"])
    async def query_spans(body: RecordQuery) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Spans of a rollout (or one attempt)."""
        return _Json(await do_query_spans(body))

    @app.post(f"{p}/llm_calls", response_model=AddedResponse, responses=not_found, tags=["records"])
    async def add_llm_calls(body: LLMCallsRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Store a batch of LLM-proxy records (idempotent on call id)."""
        return _Json(await do_add_calls(body))

    @app.post(f"{p}/llm_calls/query", response_model=LLMCallsResponse, tags=["records"])
    async def query_llm_calls(body: RecordQuery) -> Response:  # pyright: ignore[reportUnusedFunction]
        """LLM calls of a rollout (or one attempt)."""
        return _Json(await do_query_calls(body))

    @app.post(f"{p}/resources", response_model=Resources, tags=["resources"])
    async def add_resources(body: Resources) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Store a new resources version (a known ``resources_id`` returns the stored one)."""
        return _Json(await do_add_resources(body))

    @app.post(f"{p}/resources/get", response_model=ResourcesResponse, responses=not_found, tags=["resources"])
    async def get_resources(body: ResourcesQuery) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Resources by id, or the latest version."""
        return _Json(await do_get_resources(body))

    _add_bearer_scheme(app, token is not None)
    app.install_guard(lambda framework: GuardMiddleware(framework, token, max_body_bytes, fast))
    return app


def _install_error_handlers(app: FastAPI) -> None:
    """Map errors on the FastAPI routes to the same JSON answers as the fast path."""

    @app.exception_handler(RequestValidationError)
    async def _on_invalid_request(request: Request, exc: RequestValidationError) -> Response:  # pyright: ignore[reportUnusedFunction]
        message = describe_validation(exc.errors())
        content_type = request.headers.get("content-type", "")
        if content_type and "json" not in content_type:
            message = f"expected a JSON body (Content-Type: application/json), got {content_type!r}; {message}"
        return _error(422, "invalid", message)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_error(request: Request, exc: StarletteHTTPException) -> Response:  # pyright: ignore[reportUnusedFunction]
        kinds = {404: "not_found", 405: "not_allowed", 413: "too_large"}
        message = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            message = f"malformed JSON body (not decodable as UTF-8 JSON): {message}"
        return _error(exc.status_code, kinds.get(exc.status_code, "invalid"), message)

    async def on_error(request: Request, exc: Exception) -> Response:
        kind = classify_error(exc)
        if kind is None:
            logger.exception("store request %s %s failed", request.method, request.url.path)
            return _error(500, "internal", f"internal error: {type(exc).__name__}")
        return _error(*kind)

    for exc_type in (StoreError, ValidationError, OverflowError, KeyError, ValueError, TypeError, Exception):
        app.add_exception_handler(exc_type, on_error)  # pyright: ignore[reportArgumentType]


def _add_bearer_scheme(app: FastAPI, required: bool) -> None:
    """Declare the bearer scheme in ``/openapi.json`` (checked by the middleware, not by a per-route dependency)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        if required:
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for path, ops in schema.get("paths", {}).items():
                if is_open(path):
                    continue
                for op in ops.values():
                    op["security"] = [{"bearer": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
