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
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from starlette.datastructures import State
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from agentlightning._routing import RouteTable
from agentlightning._server_base import Admitted, Authorizer, Refusal, ServerBase, validate_body

__all__ = [
    "ADMIN",
    "COMPLETIONS_TAG",
    "RUNNER",
    "SLOT",
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
    parsed: Any = None
    """The body validated by the route's model (`agentlightning._server_base.validate_body`): the model, or for a
    pass-through model (OpenAI's requests) the JSON object as sent; ``None`` for a route without a body model."""


Handler = Callable[[ProxyRequest], Awaitable[Response]]
_OWN_KINDS = frozenset({"unauthorized", "forbidden"})

ADMIN = "admin"
"""The auth rule of the ``/admin/*`` routes: not the agents' token, the admin token."""

RUNNER = "runner"
"""The auth rule of the slot routes: not the agents' token, the runner token."""

SLOT = "slot"
"""The auth rule of the agent routes under a runner slot's URL: the slot's registered key, or the agents' token."""


def error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answer in OpenAI's shape (``{"error": {"message", "type", "code"}}``)."""
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


async def _until_disconnect(receive: Receive) -> None:
    """Returns once the client has hung up (the request body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _Watch:
    """The state `_unless_disconnected` shares with its watcher's done-callback."""

    __slots__ = ("finished", "gone")

    def __init__(self) -> None:
        self.finished = False
        self.gone = False


async def _unless_disconnected(work: Awaitable[Any], receive: Receive) -> Response | None:
    """``work``'s answer, or ``None`` (``work`` cancelled) if the client hangs up first.

    ``work`` runs in this task, and a watcher task cancels this task when the client hangs up: one task and one
    ``asyncio.wait`` fewer per call than running ``work`` in a task of its own (this runs for every LLM call).
    """
    task = asyncio.current_task()
    assert task is not None, "called outside a task"
    state = _Watch()

    def hung_up(watcher: asyncio.Future[None]) -> None:
        if state.finished or watcher.cancelled():
            return  # ``work`` is over (this callback may be scheduled before it ends and run after)
        watcher.exception()  # retrieved: a receive that failed means the client is gone too
        state.gone = True
        task.cancel()  # the client is gone: stop waiting for the backend

    watch = asyncio.ensure_future(_until_disconnect(receive))
    watch.add_done_callback(hung_up)
    try:
        return await work
    except asyncio.CancelledError:
        if not state.gone:
            raise  # the server stops (or a rollout's abort that ``work`` did not take)
        task.uncancel()
        return None
    finally:
        state.finished = True
        watch.cancel()


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


def too_large(size: int, limit: int) -> Response:
    """The 413 answer for a request body of ``size`` bytes over ``limit`` (OpenAI's error shape)."""
    message = (
        f"request body of {size} bytes is over the LLM proxy's limit of {limit} bytes (max_body_bytes; half the "
        "store's request limit, so that the call's record always fits in the store); send a shorter prompt"
    )
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": 413}}, 413)


class ProxyASGI(ServerBase):
    """The proxy's ASGI app: admission by `ServerBase` (its auth rules: the agents' token, `SLOT`, `ADMIN`,
    `RUNNER`), then the route's handler with the validated body.

    Refusals are answered in OpenAI's error shape. A route's body model is validated by the shared `validate_body`
    (400 with a one-line reason when invalid); the completion routes' models check the fields the proxy reads and
    the body is forwarded as it was sent. Exceptions propagate to the server (uvicorn answers 500 and logs them).

    Args:
        table: The proxy's routes (``decode=True``: matched against the raw path).
        authorizers: The check of each auth rule (``bearer``: the agents' token; `SLOT`; `ADMIN`; `RUNNER`).
        max_body_bytes: Larger request bodies get 413.
        startup: Awaited on the server's lifespan startup; ``shutdown`` on its shutdown.
        state: Attributes for the app's users (``state.llm_proxy``).
        served: The APIs the proxy serves, as the 404 of a path no route serves names them.
    """

    name = "LLM proxy"
    api_key_header = b"x-api-key"  # Anthropic's SDKs send the agent's key so

    def __init__(
        self,
        table: RouteTable,
        authorizers: Mapping[str, Authorizer],
        max_body_bytes: int,
        startup: Callable[[], Awaitable[None]],
        shutdown: Callable[[], Awaitable[None]],
        state: State,
        served: str = "",
    ) -> None:
        super().__init__(table, max_body_bytes, authorizers, startup, shutdown)
        self.state = state
        self.served = served

    def unserved(self, method: str, path: str) -> Refusal | None:
        """404 naming the path and the APIs the proxy serves, whatever the token (the API is OpenAI's, no secret):
        an agent on an API the proxy does not serve learns that, not that its token is wrong."""
        return Refusal(404, f"no route {method} {path} on the {self.name}; it serves {self.served}", "not_found")

    def path_of(self, scope: Scope) -> str:
        """The raw path (ids may hold an encoded ``/``), without the app's root path."""
        path = raw_path(scope)
        root = scope.get("root_path") or ""
        return path[len(root) :] if root and path.startswith(root) else path

    async def refuse(self, scope: Scope, receive: Receive, send: Send, refusal: Refusal) -> None:
        """Send ``refusal`` in OpenAI's error shape."""
        if refusal.status == 413:
            await too_large(int(refusal.message), self.max_body_bytes)(scope, receive, send)
            return
        kind = refusal.kind if refusal.kind in _OWN_KINDS else "invalid_request_error"
        await error(refusal.status, refusal.message, kind, headers=dict(refusal.headers))(scope, receive, send)

    def too_large(self, size: int) -> Refusal:
        """The 413 refusal (its message is written by `too_large` when sent)."""
        return Refusal(413, str(size), "too_large")

    async def answer(self, scope: Scope, receive: Receive, send: Send, request: Admitted) -> None:
        """Validate the body by the route's model, run the handler (a completion's is cancelled if the agent hangs
        up), and send its answer."""
        route = request.match.route
        parsed: Any = None
        if route.body is not None:
            parsed = validate_body(route.body, request.body, 400)
            if isinstance(parsed, Refusal):
                await self.refuse(scope, receive, send, parsed)
                return
        call = ProxyRequest(
            request.method, request.match.params, request.body, request.authorization, request.agent, parsed
        )
        if COMPLETIONS_TAG in route.tags:
            answer = await _unless_disconnected(route.handler(call), receive)
            if answer is None:
                return  # the agent hung up: nobody to answer
        else:
            answer = await route.handler(call)
        await answer(scope, receive, send)
