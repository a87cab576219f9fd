"""The proxy's plain-ASGI fast path for its two hot routes (chat completions and completions).

FastAPI's middleware stack, route matching and `Request` object cost more CPU per call than the proxy's own
work. `ProxyApp` is the FastAPI app (admin routes, ``/v1/models``, OpenAPI and lifespan stay there) with one
change: a POST to ``[/rollout/{rollout_id}/attempt/{attempt_id}]/v1/chat/completions`` or ``.../v1/completions``
is matched by string splitting and handed to the proxy directly with the raw body bytes. The FastAPI routes for
those paths stay registered and behave the same (they serve requests under a ``root_path``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi import FastAPI
from starlette.responses import JSONResponse, Response

from agentlightning._urls import parse_rollout_prefix
from agentlightning.proxy._assemble import Kind

__all__ = [
    "Authorizer",
    "CompletionHandler",
    "ProxyApp",
    "RawResponse",
    "match_completion",
    "raw_headers",
    "raw_path",
    "too_large",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
CompletionHandler = Callable[[Kind, str | None, str | None, bytes, str | None], Awaitable[Response]]
"""(kind, rollout id, attempt id, request body, Authorization header) -> the answer."""
Authorizer = Callable[[str, str | None], Response | None]
"""(path, Authorization header) -> a refusal, or ``None`` to let the request through."""

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"


def match_completion(path: str) -> tuple[Kind, str | None, str | None] | None:
    """``(kind, rollout_id, attempt_id)`` for a completion path (ids ``None`` on plain ``/v1``), else ``None``.

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
        return kind, None, None
    ids = parse_rollout_prefix(prefix)
    if ids is None:
        return None
    return kind, ids[0], ids[1]


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
        if handler is not None and scope["method"] == "POST" and not scope.get("root_path"):
            hit = match_completion(raw_path(scope))
            if hit is not None:
                limit = self.max_body_bytes
                for name, value in scope["headers"]:
                    if name == b"content-length" and value.isdigit() and int(value) > limit:
                        await too_large(int(value), limit)(scope, receive, send)
                        return
                body = await _read_body(receive, limit)
                if body is None:
                    return  # the agent went away before sending its request
                if isinstance(body, int):
                    await too_large(body, limit)(scope, receive, send)
                    return
                response = await handler(hit[0], hit[1], hit[2], body, authorization)
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
