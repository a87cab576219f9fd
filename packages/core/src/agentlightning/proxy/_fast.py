"""The proxy's plain-ASGI fast path for its two hot routes (chat completions and completions).

FastAPI's middleware stack, route matching and `Request` object cost more CPU per call than the proxy's own
work. `ProxyApp` is the FastAPI app (admin routes, ``/v1/models``, OpenAPI and lifespan stay there) with one
change: a POST to ``[/rollout/{rollout_id}/attempt/{attempt_id}]/v1/chat/completions``,
``/slot/{key}/v1/chat/completions`` or the same with ``/v1/completions`` is matched by string splitting and handed
to the proxy directly with the raw body bytes, and so are a runner's ``PUT`` / ``DELETE /slot/{key}``. The FastAPI
routes for the completion paths stay registered and behave the same (they serve requests under a ``root_path``).

While the proxy waits for a backend, the agent may hang up: the fast path then cancels the handler, which closes
the backend connection, so the backend stops generating for a client that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, NamedTuple

from fastapi import FastAPI
from starlette.responses import JSONResponse, Response

from agentlightning._urls import parse_rollout_prefix, parse_slot_prefix
from agentlightning.proxy._assemble import Kind

__all__ = [
    "Authorizer",
    "CompletionHandler",
    "ProxyApp",
    "RawResponse",
    "SlotHandler",
    "Target",
    "match_completion",
    "raw_headers",
    "raw_path",
    "too_large",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Target(NamedTuple):
    """What a completion path names: its kind and either a rollout's attempt, a runner slot, or nothing (plain)."""

    kind: Kind
    rollout_id: str | None = None
    attempt_id: str | None = None
    slot: str | None = None


CompletionHandler = Callable[[Target, bytes, str | None], Awaitable[Response]]
"""(target, request body, Authorization header) -> the answer."""
SlotHandler = Callable[[str, str, bytes], Response]
"""(method, slot key, request body) -> the answer (the token was checked before)."""
Authorizer = Callable[[str, str | None], Response | None]
"""(path, Authorization header) -> a refusal, or ``None`` to let the request through."""

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"


def match_completion(path: str) -> Target | None:
    """The `Target` of a completion path (no ids on plain ``/v1``), else ``None``.

    ``path`` is the raw request path (percent-encoded, as sent): ids are decoded here, after splitting, so an id
    holding ``/`` or ``#`` (sent as ``%2F``, ``%23``) stays one id (see `agentlightning.proxy.rollout_base_url`).
    """
    kind: Kind
    if path.endswith(_CHAT):
        kind, prefix = "chat", path[: -len(_CHAT)]
    elif path.endswith(_COMPLETIONS):
        kind, prefix = "completion", path[: -len(_COMPLETIONS)]
    else:
        return None
    if not prefix:
        return Target(kind)
    ids = parse_rollout_prefix(prefix)
    if ids is not None:
        return Target(kind, ids[0], ids[1])
    slot = parse_slot_prefix(prefix)
    return None if slot is None else Target(kind, slot=slot)


async def _until_disconnect(receive: Receive) -> None:
    """Returns once the client has hung up (the request body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(work: Awaitable[Response], receive: Receive) -> Response | None:
    """``work``'s answer, or ``None`` (``work`` cancelled) if the client hangs up first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()  # the client is gone (or we are cancelled): stop waiting for the backend
            with contextlib.suppress(asyncio.CancelledError):
                await task
        watch.cancel()
    return task.result() if not task.cancelled() else None


def raw_path(scope: Scope) -> str:
    """The request path as sent (percent-encoded), falling back to the decoded path where the server gives none."""
    raw: bytes | None = scope.get("raw_path")
    if raw is None:
        return str(scope["path"])
    return raw.decode("latin-1").split("?", 1)[0]


def raw_headers(
    body: bytes, status: int, media_type: str | None, headers: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    """Encoded response headers, built by the same rules as Starlette's `Response` (content length and type)."""
    out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if not (status < 200 or status in (204, 304)):
        out.append((b"content-length", str(len(body)).encode("latin-1")))
    if media_type is not None:
        if media_type.startswith("text/") and "charset=" not in media_type.lower():
            media_type += "; charset=utf-8"
        out.append((b"content-type", media_type.encode("latin-1")))
    return out


class RawResponse(Response):
    """A complete response whose headers are already encoded (skips Starlette's per-response header building)."""

    def __init__(self, body: bytes, status_code: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.body = body
        self.status_code = status_code
        self.raw_headers = headers
        self.background = None


async def _read_body(receive: Receive, limit: int) -> bytes | int | None:
    """The whole request body, its size so far once it passes ``limit`` bytes, or ``None`` on a disconnect."""
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk: bytes = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            return total
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def too_large(size: int, limit: int) -> Response:
    """The 413 answer for a request body of ``size`` bytes over ``limit`` (OpenAI's error shape)."""
    message = (
        f"request body of {size} bytes is over the LLM proxy's limit of {limit} bytes (max_body_bytes; half the "
        "store's request limit, so that the call's record always fits in the store); send a shorter prompt"
    )
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": 413}}, 413)


class ProxyApp(FastAPI):
    """The proxy's FastAPI app with a plain-ASGI fast path for POSTs to the completion routes.

    Set `completion_handler` to enable the fast path, and `authorize` to check every HTTP request first (fast path
    or not). Exceptions propagate to the server (uvicorn answers 500 and logs them), as they would through FastAPI.
    """

    completion_handler: CompletionHandler | None = None
    slot_handler: SlotHandler | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    authorize: Authorizer | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        authorization: str | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        authorize = self.authorize
        if authorize is not None:
            refusal = authorize(scope["path"], authorization)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        handler = self.completion_handler
        method = scope["method"]
        if scope.get("root_path"):
            await super().__call__(scope, receive, send)
            return
        if handler is not None and method == "POST":
            hit = match_completion(raw_path(scope))
            if hit is not None:
                body = await self._body(scope, receive, send)
                if body is None:
                    return
                response = await _unless_disconnected(handler(hit, body, authorization), receive)
                if response is not None:  # else the agent hung up: nobody to answer
                    await response(scope, receive, send)
                return
        slots = self.slot_handler
        if slots is not None and method in ("PUT", "DELETE"):
            key = parse_slot_prefix(raw_path(scope))
            if key is not None:
                body = await self._body(scope, receive, send)
                if body is not None:
                    await slots(method, key, body)(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The request body, or ``None`` once answered (413) or when the client went away."""
        limit = self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await too_large(int(value), limit)(scope, receive, send)
                return None
        body = await _read_body(receive, limit)
        if isinstance(body, int):
            await too_large(body, limit)(scope, receive, send)
            return None
        return body  # None: the client went away before sending its request
