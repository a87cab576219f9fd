"""The LLM proxy as plain ASGI: its token, body limit, lifespan and the dispatch of its route table.

A web framework's middleware stack, route matching and `Request` object cost more CPU per call than the proxy's
own work, so `ProxyASGI` answers every route itself from the one `RouteTable` that ``_routes.py`` declares (the
same table writes ``/openapi.json``). Paths are matched as sent (percent-encoded) and their parameters decoded
after splitting, so an id holding ``/`` or ``#`` (sent as ``%2F``, ``%23``) stays one id (see
`agentlightning.proxy.rollout_base_url`). A handler gets a `ProxyRequest` (the body read whole, within the limit).

While the proxy waits for a backend, the agent may hang up: for a completion route (tagged ``completions``) the
handler is then cancelled, which closes the backend connection, so the backend stops generating for a client that
is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from starlette.datastructures import State
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from agentlightning._netauth import cross_site_refusal
from agentlightning._routing import RouteTable

__all__ = [
    "ADMIN",
    "COMPLETIONS_TAG",
    "RUNNER",
    "ProxyASGI",
    "ProxyRequest",
    "RawResponse",
    "error",
    "raw_headers",
    "raw_path",
    "too_large",
]

logger = logging.getLogger(__name__)

COMPLETIONS_TAG = "completions"
"""Routes with this tag are cancelled when their client hangs up before the answer."""


class ProxyRequest(NamedTuple):
    """What a proxy route's handler gets."""

    method: str
    params: dict[str, str]
    """Path parameters, decoded."""
    body: bytes
    authorization: str | None
    """The ``Authorization`` header."""
    agent: str | None = None
    """The ``x-agentlightning-agent`` header, raw (`agentlightning.AGENT_HEADER`: the agent making the call)."""


Handler = Callable[[ProxyRequest], Awaitable[Response]]
Authorizer = Callable[[str | None], Response | None]
"""(Authorization header) -> a refusal, or ``None`` to let the request through."""

ADMIN = "admin"
"""The auth rule of the ``/admin/*`` routes: not the agents' token, the admin token (their handlers check it)."""

RUNNER = "runner"
"""The auth rule of the slot routes: not the agents' token, the runner token (their handlers check it)."""


def error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answer in OpenAI's shape (``{"error": {"message", "type", "code"}}``)."""
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


async def _until_disconnect(receive: Receive) -> None:
    """Returns once the client has hung up (the request body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(work: Awaitable[Any], receive: Receive) -> Response | None:
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


class ProxyASGI:
    """The proxy's ASGI app: a request is checked by ``authorize`` (not on `ADMIN`, `RUNNER` routes), then answered.

    Before that, `cross_site_refusal` turns away what a foreign web page could send (403 for a foreign ``Origin``
    or, over loopback, ``Host``; 415 for a write whose body is not ``application/json``).

    Exceptions propagate to the server (uvicorn answers 500 and logs them).

    Args:
        table: The proxy's routes (``decode=True``: matched against the raw path).
        authorize: The token check of every HTTP request.
        max_body_bytes: Larger request bodies get 413.
        startup: Awaited on the server's lifespan startup; ``shutdown`` on its shutdown.
        state: Attributes for the app's users (``state.llm_proxy``).
    """

    def __init__(
        self,
        table: RouteTable,
        authorize: Authorizer,
        max_body_bytes: int,
        startup: Callable[[], Awaitable[None]],
        shutdown: Callable[[], Awaitable[None]],
        state: State,
    ) -> None:
        self.table = table
        self.authorize = authorize
        self.max_body_bytes = max_body_bytes
        self.startup = startup
        self.shutdown = shutdown
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(receive, send)
            return  # a websocket is refused by the server when the app does not accept it
        authorization: str | None = None
        agent: str | None = None
        host = origin = content_type = b""
        has_body = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"x-agentlightning-agent":
                agent = value.decode("latin-1")
            elif name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"content-type":
                content_type = value
            elif name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0 ")):
                has_body = True
        method: str = scope["method"]
        # A web page in the user's browser reaches a proxy on this machine too: it must not spend its backends.
        refusal = cross_site_refusal(method, host, origin, content_type, has_body, scope.get("server"))
        if refusal is not None:
            kind = "forbidden" if refusal[0] == 403 else "invalid_request_error"
            await error(refusal[0], refusal[1], kind)(scope, receive, send)
            return
        path = raw_path(scope)
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :]
        found = self.table.match("GET" if method == "HEAD" else method, path)
        route = found.route if found is not None else self.table.allowed(path)
        if route is None or (route.auth != ADMIN and route.auth != RUNNER):
            refusal = self.authorize(authorization)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        if found is None:
            if route is None:
                response = error(404, f"no route {method} {path} on the LLM proxy", "invalid_request_error")
            else:
                allow = ", ".join(self.table.methods(path))
                message = f"{method} is not allowed on {path} (allowed: {allow})"
                response = error(405, message, "invalid_request_error", headers={"Allow": allow})
            await response(scope, receive, send)
            return
        body = b""
        if method not in ("GET", "HEAD"):
            read = await self._body(scope, receive, send)
            if read is None:
                return
            body = read
        request = ProxyRequest(method, found.params, body, authorization, agent)
        route = found.route
        if COMPLETIONS_TAG in route.tags:
            answer = await _unless_disconnected(route.handler(request), receive)
            if answer is None:
                return  # the agent hung up: nobody to answer
        else:
            answer = await route.handler(request)
        await answer(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    logger.exception("LLM proxy could not start")
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

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
