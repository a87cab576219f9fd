"""The store served over HTTP: a FastAPI app wrapping any `LightningStore` (what ``agl store serve`` runs).

Endpoints (JSON bodies, see ``/openapi.json``):

==========================================  ==========================================
``GET  /healthz``                           liveness; the only endpoint open without a token
``GET  /v1/retry_policy``                   the store's `RetryPolicy`
``POST /v1/rollouts/enqueue``               `EnqueueRequest` -> `RolloutsResponse`
``POST /v1/rollouts/dequeue``               `DequeueRequest` -> `DequeueResponse`
``POST /v1/rollouts/query``                 `QueryRolloutsRequest` -> `RolloutsResponse`
``POST /v1/rollouts/cancel``                `RolloutRef` -> `Rollout`
``POST /v1/rollouts/wait``                  `WaitRequest` -> `RolloutsResponse` (long-poll)
``GET  /v1/rollouts/{rollout_id}``          `Rollout`
``POST /v1/attempts/heartbeat``             `AttemptRef` -> `Attempt`
``POST /v1/attempts/finish``                `FinishRequest` -> `Rollout`
``POST /v1/attempts/query``                 `RolloutRef` -> `AttemptsResponse`
``POST /v1/attempts/check_timeouts``        -> `AttemptsResponse`
``POST /v1/spans`` / ``/v1/spans/query``    `SpansRequest` -> `AddedResponse` / `RecordQuery` -> `SpansResponse`
``POST /v1/llm_calls`` / ``.../query``      `LLMCallsRequest` -> `AddedResponse` / `RecordQuery` -> ...
``POST /v1/resources`` / ``.../get``        `Resources` -> `Resources` / `ResourcesQuery` -> `ResourcesResponse`
``GET  /v1/stats``                          `StoreStats`
==========================================  ==========================================

Errors are JSON `ErrorResponse` bodies: 401 (missing/wrong bearer token), 404 (unknown id or route),
409 (conflict with the stored state), 413 (body over ``max_body_bytes``), 422 (malformed JSON, wrong types,
a record that fails validation) and 400 (any other `StoreError`). Bad input never reaches the store half-way:
a body is validated as a whole before the store is called.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from agentlightning._models import Attempt, Resources, Rollout
from agentlightning.store._base import (
    ConflictError,
    LightningStore,
    NotFoundError,
    RetryPolicy,
    StoreError,
    StoreStats,
)
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

_OPEN_PATHS = frozenset({"/healthz"})
_DEQUEUE_MEMORY_SECONDS = 300.0
_DEQUEUE_MEMORY_SIZE = 10_000

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Json(Response):
    media_type = "application/json"


def _json(model: BaseModel, status_code: int = 200) -> Response:
    return _Json(model.model_dump_json(), status_code=status_code)


def _error(status_code: int, error: str, message: str) -> Response:
    return _json(ErrorResponse(error=error, message=message), status_code)


def _error_bytes(error: str, message: str) -> bytes:
    return ErrorResponse(error=error, message=message).model_dump_json().encode()


class _GuardMiddleware:
    """Bearer-token check and body-size limit, as plain ASGI so they cost almost nothing per request."""

    def __init__(self, app: ASGIApp, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.expected = f"bearer {token}".encode() if token else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        authorization = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _send_error(send, 400, "invalid", "Content-Length is not a number")
                    return
        if self.expected is not None and scope["path"] not in _OPEN_PATHS:
            # Scheme is case-insensitive (RFC 7235); the token is compared in constant time.
            given = authorization[:7].lower() + authorization[7:]
            if not hmac.compare_digest(given, self.expected):
                reason = "missing" if not authorization else "wrong"
                await _send_error(
                    send, 401, "unauthorized", f"{reason} bearer token: send 'Authorization: Bearer <token>'"
                )
                return
        if length is not None:
            if length > self.max_body_bytes:
                await _send_error(send, 413, "too_large", self._too_large(length))
                return
            await self.app(scope, receive, send)
            return
        # No Content-Length (chunked): count while buffering, then replay the body to the app.
        chunks: list[bytes] = []
        total = 0
        more = scope["method"] not in ("GET", "HEAD")
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # client went away
            chunk: bytes = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                await _send_error(send, 413, "too_large", self._too_large(total))
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay if chunks else receive, send)

    def _too_large(self, size: int) -> str:
        return f"request body of {size} bytes is over the limit of {self.max_body_bytes} bytes; send smaller batches"


async def _send_error(send: Send, status: int, error: str, message: str) -> None:
    body = _error_bytes(error, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _describe_validation(errors: Any) -> str:
    parts: list[str] = []
    for err in list(errors)[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            parts.append(f"malformed JSON: {ctx.get('error', err.get('msg', ''))}")
        else:
            parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


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


def create_store_app(
    store: LightningStore,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """Build the ASGI app that serves ``store`` over HTTP.

    Args:
        store: Any backend (SQLite for a durable served store, memory for tests).
        token: When set, every request except ``GET /healthz`` must carry ``Authorization: Bearer <token>``
            or gets 401. ``/healthz`` stays open so load balancers and process supervisors can probe it;
            it reveals nothing but liveness.
        max_body_bytes: Request bodies larger than this get 413 before they are read into memory.

    Returns:
        A FastAPI app; run it with uvicorn (``agl store serve`` does).
    """
    if max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
    app = FastAPI(
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

    @app.exception_handler(RequestValidationError)
    async def _on_invalid_request(request: Request, exc: RequestValidationError) -> Response:  # pyright: ignore[reportUnusedFunction]
        message = _describe_validation(exc.errors())
        content_type = request.headers.get("content-type", "")
        if content_type and "json" not in content_type:
            message = f"expected a JSON body (Content-Type: application/json), got {content_type!r}; {message}"
        return _error(422, "invalid", message)

    @app.exception_handler(NotFoundError)
    async def _on_not_found(request: Request, exc: NotFoundError) -> Response:  # pyright: ignore[reportUnusedFunction]
        return _error(404, "not_found", str(exc))

    @app.exception_handler(ConflictError)
    async def _on_conflict(request: Request, exc: ConflictError) -> Response:  # pyright: ignore[reportUnusedFunction]
        return _error(409, "conflict", str(exc))

    @app.exception_handler(StoreError)
    async def _on_store_error(request: Request, exc: StoreError) -> Response:  # pyright: ignore[reportUnusedFunction]
        return _error(400, "invalid", str(exc))

    @app.exception_handler(ValidationError)
    async def _on_model_error(request: Request, exc: ValidationError) -> Response:  # pyright: ignore[reportUnusedFunction]
        return _error(422, "invalid", _describe_validation(exc.errors()))

    @app.exception_handler(OverflowError)
    async def _on_overflow(request: Request, exc: OverflowError) -> Response:  # pyright: ignore[reportUnusedFunction]
        return _error(422, "invalid", f"a number is too large to store (integers are limited to 64 bits): {exc}")

    @app.exception_handler(KeyError)
    async def _on_key_error(request: Request, exc: KeyError) -> Response:  # pyright: ignore[reportUnusedFunction]
        # A backend lookup that missed without raising NotFoundError: still an unknown id, not a server failure.
        logger.warning("store raised a bare KeyError for %s: %r", request.url.path, exc)
        return _error(404, "not_found", f"unknown id: {exc}")

    @app.exception_handler(ValueError)
    async def _on_value_error(request: Request, exc: ValueError) -> Response:  # pyright: ignore[reportUnusedFunction]
        return _error(400, "invalid", str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_error(request: Request, exc: StarletteHTTPException) -> Response:  # pyright: ignore[reportUnusedFunction]
        kinds = {404: "not_found", 405: "not_allowed", 413: "too_large"}
        message = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            message = f"malformed JSON body (not decodable as UTF-8 JSON): {message}"
        return _error(exc.status_code, kinds.get(exc.status_code, "invalid"), message)

    @app.exception_handler(Exception)
    async def _on_bug(request: Request, exc: Exception) -> Response:  # pyright: ignore[reportUnusedFunction]
        logger.exception("store request %s %s failed", request.method, request.url.path)
        return _error(500, "internal", f"internal error: {type(exc).__name__}")

    @app.get("/healthz", response_model=HealthResponse, tags=["health"])
    async def healthz() -> Response:  # pyright: ignore[reportUnusedFunction]
        """Liveness probe (open without a token)."""
        return _json(HealthResponse())

    p = API_PREFIX

    @app.get(f"{p}/retry_policy", response_model=RetryPolicy, tags=["store"])
    async def retry_policy() -> Response:  # pyright: ignore[reportUnusedFunction]
        """The retry policy the store applies."""
        return _json(store.retry_policy)

    @app.post(f"{p}/rollouts/enqueue", response_model=RolloutsResponse, tags=["rollouts"])
    async def enqueue(body: EnqueueRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Queue rollouts; an already known ``rollout_id`` returns the stored rollout unchanged."""
        rollouts = await store.enqueue_rollouts(body.requests)
        return _json(RolloutsResponse.model_construct(rollouts=rollouts))

    @app.post(f"{p}/rollouts/dequeue", response_model=DequeueResponse, tags=["rollouts"])
    async def dequeue(body: DequeueRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Claim the oldest queuing rollout; a repeated ``request_id`` gets the same answer back."""
        if body.request_id is None:
            claim = await store.dequeue_rollout(body.worker_id)
            return _json(DequeueResponse.model_construct(claim=claim))
        fut, first = dequeues.get_or_start(body.request_id)
        if first:
            try:
                claim = await store.dequeue_rollout(body.worker_id)
            except BaseException as exc:
                dequeues.forget(body.request_id)
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: waiters (if any) re-raise it themselves
                raise
            fut.set_result(DequeueResponse.model_construct(claim=claim).model_dump_json().encode())
        return _Json(await asyncio.shield(fut))

    @app.post(f"{p}/rollouts/query", response_model=RolloutsResponse, tags=["rollouts"])
    async def query_rollouts(body: QueryRolloutsRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Rollouts filtered by status and/or ids, in enqueue order."""
        rollouts = await store.query_rollouts(status=body.status, rollout_ids=body.rollout_ids)
        return _json(RolloutsResponse.model_construct(rollouts=rollouts))

    @app.post(f"{p}/rollouts/cancel", response_model=Rollout, responses={**not_found, **conflict}, tags=["rollouts"])
    async def cancel(body: RolloutRef) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Cancel a rollout that has not finished."""
        return _json(await store.cancel_rollout(body.rollout_id))

    @app.post(f"{p}/rollouts/wait", response_model=RolloutsResponse, tags=["rollouts"])
    async def wait(body: WaitRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Long-poll until the rollouts finish or ``timeout`` passes; returns the finished ones."""
        rollouts = await store.wait_for_rollouts(body.rollout_ids, timeout=body.timeout)
        return _json(RolloutsResponse.model_construct(rollouts=rollouts))

    @app.get(f"{p}/rollouts/{{rollout_id:path}}", response_model=Rollout, responses=not_found, tags=["rollouts"])
    async def get_rollout(rollout_id: str) -> Response:  # pyright: ignore[reportUnusedFunction]
        """One rollout by id."""
        return _json(await store.get_rollout(rollout_id))

    @app.post(f"{p}/attempts/heartbeat", response_model=Attempt, responses={**not_found, **conflict}, tags=["attempts"])
    async def heartbeat(body: AttemptRef) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Record a sign of life of a running attempt."""
        return _json(await store.heartbeat(body.rollout_id, body.attempt_id))

    @app.post(f"{p}/attempts/finish", response_model=Rollout, responses={**not_found, **conflict}, tags=["attempts"])
    async def finish(body: FinishRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """End an attempt; the rollout moves on according to the retry policy."""
        return _json(await store.finish_attempt(body.rollout_id, body.attempt_id, body.status, body.error))

    @app.post(f"{p}/attempts/query", response_model=AttemptsResponse, responses=not_found, tags=["attempts"])
    async def query_attempts(body: RolloutRef) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Attempts of a rollout in order."""
        attempts = await store.query_attempts(body.rollout_id)
        return _json(AttemptsResponse.model_construct(attempts=attempts))

    @app.post(f"{p}/attempts/check_timeouts", response_model=AttemptsResponse, tags=["attempts"])
    async def check_timeouts() -> Response:  # pyright: ignore[reportUnusedFunction]
        """Apply heartbeat and rollout timeouts now; returns the attempts that were ended."""
        return _json(AttemptsResponse.model_construct(attempts=await store.check_timeouts()))

    @app.post(f"{p}/spans", response_model=AddedResponse, responses=not_found, tags=["records"])
    async def add_spans(body: SpansRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Store a batch of spans (idempotent on rollout, attempt and span id)."""
        return _json(AddedResponse(added=await store.add_spans(body.spans)))

    @app.post(f"{p}/spans/query", response_model=SpansResponse, tags=["records"])
    async def query_spans(body: RecordQuery) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Spans of a rollout (or one attempt)."""
        spans = await store.query_spans(body.rollout_id, body.attempt_id)
        return _json(SpansResponse.model_construct(spans=spans))

    @app.post(f"{p}/llm_calls", response_model=AddedResponse, responses=not_found, tags=["records"])
    async def add_llm_calls(body: LLMCallsRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Store a batch of LLM-proxy records (idempotent on call id)."""
        return _json(AddedResponse(added=await store.add_llm_calls(body.calls)))

    @app.post(f"{p}/llm_calls/query", response_model=LLMCallsResponse, tags=["records"])
    async def query_llm_calls(body: RecordQuery) -> Response:  # pyright: ignore[reportUnusedFunction]
        """LLM calls of a rollout (or one attempt)."""
        calls = await store.query_llm_calls(body.rollout_id, body.attempt_id)
        return _json(LLMCallsResponse.model_construct(calls=calls))

    @app.post(f"{p}/resources", response_model=Resources, tags=["resources"])
    async def add_resources(body: Resources) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Store a new resources version (a known ``resources_id`` returns the stored one)."""
        if "\x00" in body.resources_id:
            raise ValueError(f"resources_id must not contain NUL characters, got {body.resources_id!r}")
        return _json(await store.add_resources(body))

    @app.post(f"{p}/resources/get", response_model=ResourcesResponse, responses=not_found, tags=["resources"])
    async def get_resources(body: ResourcesQuery) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Resources by id, or the latest version."""
        resources = await store.get_resources(body.resources_id)
        return _json(ResourcesResponse.model_construct(resources=resources))

    @app.get(f"{p}/stats", response_model=StoreStats, tags=["store"])
    async def stats() -> Response:  # pyright: ignore[reportUnusedFunction]
        """Counts of what is stored."""
        return _json(await store.stats())

    _add_bearer_scheme(app, token is not None)
    app.add_middleware(_GuardMiddleware, token=token, max_body_bytes=max_body_bytes)  # pyright: ignore[reportArgumentType]
    return app


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
                if path in _OPEN_PATHS:
                    continue
                for op in ops.values():
                    op["security"] = [{"bearer": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
