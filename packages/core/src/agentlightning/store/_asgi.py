"""The served store as plain ASGI: its bearer token, error mapping and the dispatch of its route table.

A web framework's routing, dependency solving and middleware stack cost about two thirds of a small request's
server time, so every store route is answered here, from the one `RouteTable` that ``_server.py`` declares (the same
table writes ``/openapi.json``): the body is parsed and validated in one step with pydantic's
``model_validate_json``, and the answer is pre-serialised bytes.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentlightning._netauth import bearer_matches
from agentlightning._routing import Match, Route, RouteTable
from agentlightning._server_base import Admitted, Refusal, ServerBase, describe_validation, validate_body
from agentlightning.store._base import (
    AttemptEndedError,
    ConflictError,
    DatabaseUnavailableError,
    InvalidRequestError,
    NotFoundError,
    StorageError,
    StoreError,
)
from agentlightning.store._otlp_in import OTLP_AUTH, OtlpRequest, credential_attempt
from agentlightning.store._wire import ATTEMPT_ENDED, ErrorResponse

__all__ = ["Answer", "StoreASGI", "classify_error", "describe_validation", "error_bytes"]

logger = logging.getLogger(__name__)

OFFLOAD_BYTES = 1024 * 1024
"""Request bodies from this size on are parsed and stored in a worker thread, off the event loop."""
BIG_REQUESTS_AT_ONCE = 2
"""How many such big requests are worked on at once (each holds its body and its parsed records in memory)."""

Answer = bytes | tuple[int, bytes] | Response
"""What a store route's handler returns: JSON bytes (200), ``(status, JSON bytes)``, or any Starlette response."""


def error_bytes(error: str, message: str) -> bytes:
    """The JSON body of an error answer."""
    return ErrorResponse(error=error, message=message).model_dump_json().encode()


def classify_error(exc: BaseException) -> tuple[int, str, str] | None:
    """(HTTP status, error kind, message) for an exception caused by the request; ``None`` for a server bug."""
    if isinstance(exc, NotFoundError):
        return 404, "not_found", str(exc)
    if isinstance(exc, AttemptEndedError):  # a late record: its client raises AttemptEndedError again
        return 409, ATTEMPT_ENDED, str(exc)
    if isinstance(exc, ConflictError):
        return 409, "conflict", str(exc)
    if isinstance(exc, DatabaseUnavailableError):  # an outage: logged once by the store; clients retry a 503
        return 503, "unavailable", str(exc)
    if isinstance(exc, StorageError):  # disk full / read-only: not the request's fault, and not transient
        return 507, "storage", str(exc)
    if isinstance(exc, InvalidRequestError):  # refused at the store boundary: as a body that failed validation
        return 422, "invalid", str(exc)
    if isinstance(exc, StoreError):
        return 400, "invalid", str(exc)
    if isinstance(exc, ValidationError):
        return 422, "invalid", describe_validation(exc.errors())
    if isinstance(exc, OverflowError):
        return 422, "invalid", f"a number is too large to store (integers are limited to 64 bits): {exc}"
    if isinstance(exc, KeyError):
        # A backend lookup that missed without raising NotFoundError: still an unknown id, not a server failure.
        logger.warning("store raised a bare KeyError: %r", exc)
        return 404, "not_found", f"unknown id: {exc}"
    if isinstance(exc, ValueError | TypeError):
        return 400, "invalid", str(exc)
    return None


async def send_json(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send a complete JSON answer (``extra``: more headers)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class StoreASGI(ServerBase):
    """The served store as plain ASGI: admission by `ServerBase`, then the dispatch of its route table.

    Every request first passes the shared admission (`agentlightning._server_base`): browser rules, the bearer
    token (every route but the `OPEN` ones; a path the table does not hold needs it too, then gets 404), 413, 404,
    405 and the body within the limit. A handler gets the validated body (a route with a body model, validated by
    the shared `validate_body`; 422 when invalid), the path parameters (a route with some) or ``None``, and returns
    an `Answer`.

    Args:
        table: Every route served (the OpenAPI document included).
        token: The bearer token every route but the `OPEN` ones requires (not empty).
        max_body_bytes: Larger bodies get 413 (checked on Content-Length and while reading chunked bodies).

    Raises:
        ValueError: ``token`` is empty.
    """

    name = "store"

    def __init__(self, table: RouteTable, token: str, max_body_bytes: int) -> None:
        if not token:
            raise ValueError("a served store needs a bearer token (secrets.token_urlsafe(32) makes one)")
        super().__init__(table, max_body_bytes, {"bearer": self._check_token, OTLP_AUTH: self._check_otlp})
        self.token = token
        self._big_requests = asyncio.Semaphore(BIG_REQUESTS_AT_ONCE)

    def _check_token(self, authorization: str | None, params: Mapping[str, str]) -> Refusal | None:
        if bearer_matches(authorization, self.token):
            return None
        reason = "missing" if not authorization else "wrong"
        return Refusal(401, f"{reason} bearer token: send 'Authorization: Bearer <token>'", "unauthorized")

    def _check_otlp(self, authorization: str | None, params: Mapping[str, str]) -> Refusal | None:
        """The OTLP route: the store's token, or an attempt's OTLP credential (its body is checked against it)."""
        if self._check_token(authorization, params) is None or credential_attempt(self.token, authorization):
            return None
        reason = "missing" if not authorization else "wrong"
        return Refusal(
            401, f"{reason} credential: send the one the runner set in OTEL_EXPORTER_OTLP_HEADERS", "unauthorized"
        )

    async def refuse(self, scope: Scope, receive: Receive, send: Send, refusal: Refusal) -> None:
        """Send ``refusal`` as an `ErrorResponse`."""
        extra = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in refusal.headers.items()]
        await send_json(send, refusal.status, error_bytes(refusal.kind, refusal.message), extra)

    def too_large(self, size: int) -> Refusal:
        """The 413 refusal of a body of ``size`` bytes."""
        message = f"request body of {size} bytes is over the limit of {self.max_body_bytes} bytes; send smaller batches"
        return Refusal(413, message, "too_large")

    async def answer(self, scope: Scope, receive: Receive, send: Send, request: Admitted) -> None:
        """Run the route's handler (a big body's in a worker thread) and send its answer."""
        found, body = request.match, request.body
        if found.route.auth == OTLP_AUTH:  # the handler checks the body against the credential
            answer = await self._answer(found, OtlpRequest(request.authorization, body))
        elif request.method in ("GET", "HEAD") or len(body) < OFFLOAD_BYTES:
            answer = await self._answer(found, body)
        else:
            # Parsing, validating and storing a batch of megabytes takes seconds of CPU: do it in a worker
            # thread so /healthz and other clients are answered meanwhile, and few at a time so memory stays
            # bounded.
            async with self._big_requests:
                answer = await asyncio.to_thread(_answer_in_thread, self._answer, found, body)
            del body
        if isinstance(answer, Response):
            await answer(scope, receive, send)
        else:
            await send_json(send, answer[0], answer[1])

    async def _answer(self, found: Match, body: bytes | OtlpRequest) -> tuple[int, bytes] | Response:
        route: Route = found.route
        try:
            model = route.body
            if isinstance(body, OtlpRequest):
                given = body
            elif model is not None:
                given: Any = None if route.read is None else route.read(body)
                if given is None:
                    given = validate_body(model, body, 422)
                if isinstance(given, Refusal):
                    return given.status, error_bytes("invalid", given.message)
            else:
                given = found.params or None
            answer: Answer = await route.handler(given)
        except Exception as exc:
            kind = classify_error(exc)
            if kind is None:
                logger.exception("store request %s %s failed", route.method, route.path)
                return 500, error_bytes("internal", f"internal error: {type(exc).__name__}")
            return kind[0], error_bytes(kind[1], kind[2])
        if type(answer) is bytes:
            return 200, answer
        return answer  # pyright: ignore[reportReturnType]  # (status, bytes) or a Response


def _answer_in_thread(
    answer: Callable[[Match, bytes], Coroutine[Any, Any, tuple[int, bytes] | Response]],
    found: Match,
    body: bytes,
) -> tuple[int, bytes] | Response:
    try:
        return asyncio.run(answer(found, body))
    finally:
        _give_memory_back()


def _give_memory_back() -> None:
    """Return freed heap to the OS after a big request (glibc keeps it otherwise: RSS would only grow)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        gc.collect()
        _malloc_trim(0)


_malloc_trim: Any = None
