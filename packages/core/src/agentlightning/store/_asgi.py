"""The served store as plain ASGI: bearer token, body limit, error mapping and the dispatch of its route table.

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
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentlightning._netauth import bearer_matches, cross_site_refusal
from agentlightning._routing import OPEN, Match, Route, RouteTable
from agentlightning.store._base import ConflictError, InvalidRequestError, NotFoundError, StorageError, StoreError
from agentlightning.store._boundary import describe_validation
from agentlightning.store._wire import ErrorResponse

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
    if isinstance(exc, ConflictError):
        return 409, "conflict", str(exc)
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


class StoreASGI:
    """The served store as plain ASGI: browser rules, bearer token, body limit and the dispatch of its route table.

    Every request first passes `cross_site_refusal` (403 for a foreign ``Origin`` or, over loopback, ``Host``; 415
    for a write whose body is not ``application/json``). A route is then admitted by its own auth rule (`OPEN` or
    the bearer token); a path the table does not hold needs the token too (an unauthenticated caller learns
    nothing about the API), then gets 404. A handler gets the parsed body (a route with a body model), the path
    parameters (a route with some) or ``None``, and returns an `Answer`.

    Args:
        table: Every route served (the OpenAPI document included).
        token: The bearer token every route but the `OPEN` ones requires (not empty).
        max_body_bytes: Larger bodies get 413 (checked on Content-Length and while reading chunked bodies).

    Raises:
        ValueError: ``token`` is empty.
    """

    def __init__(self, table: RouteTable, token: str, max_body_bytes: int) -> None:
        if not token:
            raise ValueError("a served store needs a bearer token (secrets.token_urlsafe(32) makes one)")
        self.table = table
        self.token = token
        self.max_body_bytes = max_body_bytes
        self._big_requests = asyncio.Semaphore(BIG_REQUESTS_AT_ONCE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return  # a websocket is refused by the server when the app does not accept it
        length: int | None = None
        authorization = content_type = host = origin = b""
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await send_json(send, 400, error_bytes("invalid", "Content-Length is not a number"))
                    return
            elif name == b"content-type":
                content_type = value
            elif name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"transfer-encoding":
                chunked = True
        method: str = scope["method"]
        path: str = scope["path"]
        has_body = chunked or bool(length)
        refusal = cross_site_refusal(method, host, origin, content_type, has_body, scope.get("server"))
        if refusal is not None:
            kind = "forbidden" if refusal[0] == 403 else "unsupported_media_type"
            await send_json(send, refusal[0], error_bytes(kind, refusal[1]))
            return
        # HEAD is answered as GET (the server drops the body), as every HTTP framework does.
        found = self.table.match("GET" if method == "HEAD" else method, path)
        route = found.route if found is not None else self.table.allowed(path)
        if (route is None or route.auth != OPEN) and not bearer_matches(authorization, self.token):
            reason = "missing" if not authorization else "wrong"
            message = f"{reason} bearer token: send 'Authorization: Bearer <token>'"
            await send_json(send, 401, error_bytes("unauthorized", message))
            return
        if length is not None and length > self.max_body_bytes:
            await send_json(send, 413, error_bytes("too_large", self._too_large(length)))
            return
        if found is None:
            if route is None:
                await send_json(send, 404, error_bytes("not_found", f"no route {method} {path}"))
            else:
                allow = ", ".join(self.table.methods(path))
                message = f"{method} is not allowed on {path} (allowed: {allow})"
                await send_json(send, 405, error_bytes("not_allowed", message), [(b"allow", allow.encode())])
            return
        if method in ("GET", "HEAD"):
            answer = await self._answer(found, b"")
        else:
            body = await self._read(receive, send)
            if body is None:
                return
            if len(body) < OFFLOAD_BYTES:
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

    async def _read(self, receive: Receive, send: Send) -> bytes | None:
        """The whole request body, counted against the limit; ``None`` once answered (413) or the client left."""
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client went away
            chunk: bytes = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                await send_json(send, 413, error_bytes("too_large", self._too_large(total)))
                return None
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _answer(self, found: Match, body: bytes) -> tuple[int, bytes] | Response:
        route: Route = found.route
        try:
            model = route.body
            if model is not None:
                try:
                    given: Any = model.model_validate_json(body)
                except ValidationError as exc:
                    return 422, error_bytes("invalid", describe_validation(exc.errors()))
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

    def _too_large(self, size: int) -> str:
        return f"request body of {size} bytes is over the limit of {self.max_body_bytes} bytes; send smaller batches"


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


async def _lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge the server's startup and shutdown (the store is opened and closed by its owner)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
