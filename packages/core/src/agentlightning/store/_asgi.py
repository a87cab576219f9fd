"""The served store's plain-ASGI layer: bearer token, body limit, error mapping and the fast path for POSTs.

FastAPI's routing, dependency solving and middleware stack cost about two thirds of a small request's server
time. The POST endpoints that runners call in a loop are therefore answered here directly: the body is parsed
and validated in one step with pydantic's ``model_validate_json`` and the answer is pre-serialised bytes. The
FastAPI routes for the same paths stay in place; they describe the API in ``/openapi.json`` and behave the same.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import hmac
import logging
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Any

from pydantic import BaseModel, ValidationError

from agentlightning.store._base import ConflictError, NotFoundError, StorageError, StoreError
from agentlightning.store._wire import ErrorResponse

__all__ = [
    "OPEN_PATHS",
    "OPEN_PREFIX",
    "FastRoute",
    "GuardMiddleware",
    "classify_error",
    "describe_validation",
    "error_bytes",
    "is_open",
]

logger = logging.getLogger(__name__)

OFFLOAD_BYTES = 1024 * 1024
"""Request bodies from this size on are parsed and stored in a worker thread, off the event loop."""
BIG_REQUESTS_AT_ONCE = 2
"""How many such big requests are worked on at once (each holds its body and its parsed records in memory)."""

OPEN_PATHS = frozenset({"/healthz"})
"""Paths served without a bearer token."""
OPEN_PREFIX = "/ui"
"""The dashboard's static page and assets (``/ui``, ``/ui/...``) load without a token: they hold no data, and the
page asks for the token in a login form before it calls the API."""


def is_open(path: str) -> bool:
    """Whether ``path`` is served without a bearer token."""
    return path in OPEN_PATHS or path == OPEN_PREFIX or path.startswith(OPEN_PREFIX + "/")


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
FastRoute = tuple[type[BaseModel] | None, Callable[[Any], Awaitable[bytes]]]
"""(body model or ``None`` for no body, handler returning the JSON answer) for one POST path."""


def error_bytes(error: str, message: str) -> bytes:
    """The JSON body of an error answer."""
    return ErrorResponse(error=error, message=message).model_dump_json().encode()


def describe_validation(errors: Any) -> str:
    """One line naming each (of the first five) invalid fields, e.g. ``spans.2.span_id: String should match...``."""
    parts: list[str] = []
    for err in list(errors)[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            parts.append(f"malformed JSON: {ctx.get('error', err.get('msg', ''))}")
        else:
            parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def classify_error(exc: BaseException) -> tuple[int, str, str] | None:
    """(HTTP status, error kind, message) for an exception caused by the request; ``None`` for a server bug."""
    if isinstance(exc, NotFoundError):
        return 404, "not_found", str(exc)
    if isinstance(exc, ConflictError):
        return 409, "conflict", str(exc)
    if isinstance(exc, StorageError):  # disk full / read-only: not the request's fault, and not transient
        return 507, "storage", str(exc)
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


async def send_json(send: Send, status: int, body: bytes) -> None:
    """Send a complete JSON answer."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """Bearer-token check, body-size limit and the fast path, as plain ASGI in front of the FastAPI app.

    Args:
        app: The FastAPI app (serves everything the fast path does not).
        token: Required bearer token, or ``None``.
        max_body_bytes: Larger bodies get 413 (checked on Content-Length and while reading chunked bodies).
        fast: POST path -> `FastRoute` answered here.
    """

    def __init__(self, app: ASGIApp, token: str | None, max_body_bytes: int, fast: dict[str, FastRoute]) -> None:
        self.app = app
        self.expected = f"bearer {token}".encode() if token else None
        self.max_body_bytes = max_body_bytes
        self.fast = fast
        self._big_requests = asyncio.Semaphore(BIG_REQUESTS_AT_ONCE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        authorization = b""
        content_type = b""
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
        if self.expected is not None and not is_open(scope["path"]):
            # The scheme is case-insensitive (RFC 7235); the token is compared in constant time.
            given = authorization[:7].lower() + authorization[7:]
            if not hmac.compare_digest(given, self.expected):
                reason = "missing" if not authorization else "wrong"
                message = f"{reason} bearer token: send 'Authorization: Bearer <token>'"
                await send_json(send, 401, error_bytes("unauthorized", message))
                return
        if length is not None and length > self.max_body_bytes:
            await send_json(send, 413, error_bytes("too_large", self._too_large(length)))
            return
        route = self.fast.get(scope["path"]) if scope["method"] == "POST" else None
        if route is None and (length is not None or scope["method"] in ("GET", "HEAD")):
            await self.app(scope, receive, send)
            return
        # Read the whole body, counting (a chunked body has no Content-Length to check up front).
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk: bytes = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                await send_json(send, 413, error_bytes("too_large", self._too_large(total)))
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        if route is None:
            await self.app(scope, _replay(body, receive), send)
            return
        if len(body) < OFFLOAD_BYTES:
            status, answer = await self._answer(route, body, content_type)
        else:
            # Parsing, validating and storing a batch of megabytes takes seconds of CPU: do it in a worker thread
            # so /healthz and other clients are answered meanwhile, and few at a time so memory stays bounded.
            async with self._big_requests:
                status, answer = await asyncio.to_thread(_answer_in_thread, self._answer, route, body, content_type)
            del body
        await send_json(send, status, answer)

    async def _answer(self, route: FastRoute, body: bytes, content_type: bytes) -> tuple[int, bytes]:
        model, handler = route
        try:
            if model is None:
                return 200, await handler(None)
            try:
                parsed = model.model_validate_json(body)
            except ValidationError as exc:
                message = describe_validation(exc.errors())
                if content_type and b"json" not in content_type:
                    message = f"expected a JSON body (Content-Type: application/json), got {content_type.decode(errors='replace')!r}; {message}"  # noqa: E501
                return 422, error_bytes("invalid", message)
            return 200, await handler(parsed)
        except Exception as exc:
            kind = classify_error(exc)
            if kind is None:
                logger.exception("store request failed")
                return 500, error_bytes("internal", f"internal error: {type(exc).__name__}")
            return kind[0], error_bytes(kind[1], kind[2])

    def _too_large(self, size: int) -> str:
        return f"request body of {size} bytes is over the limit of {self.max_body_bytes} bytes; send smaller batches"


def _answer_in_thread(
    answer: Callable[[FastRoute, bytes, bytes], Coroutine[Any, Any, tuple[int, bytes]]],
    route: FastRoute,
    body: bytes,
    content_type: bytes,
) -> tuple[int, bytes]:
    try:
        return asyncio.run(answer(route, body, content_type))
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


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
