"""What the served store and the LLM proxy share as HTTP servers: one admission path, one body rule, one lifespan.

`ServerBase` is the plain-ASGI base of `agentlightning.store._asgi.StoreASGI` and
`agentlightning.proxy._asgi.ProxyASGI`. For every HTTP request it: refuses what a foreign web page could send
(`cross_site_refusal`), matches the route table, admits the caller by the route's auth rule (an unknown path by the
``bearer`` rule: an unauthenticated caller learns nothing about the API), answers 413 for a declared body over the
limit, 404 / 405 for a path or method the table does not serve (behind the ``bearer`` rule), and reads the body
within the limit. The server
then answers (`ServerBase.answer`); each renders refusals in its own error shape (`ServerBase.refuse`).

A route's body model is validated by `validate_body`, the one rule for both servers: an empty body counts as
``{}``; a model that forbids unknown fields is the parsed body; a pass-through model (OpenAI's requests, which allow
any other field) checks the fields the server reads and the body is handed on as the dict it was sent as.

`STORE_MAX_BODY_BYTES` is the store server's default request limit; the proxy sizes its own from it, so that the
record of any call it accepts fits in the store.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from agentlightning._netauth import cross_site_refusal
from agentlightning._routing import OPEN, Match, RouteTable

if TYPE_CHECKING:
    # Type-only: the store client imports this module's validation helpers, and an agent's process installs no
    # ASGI stack (the `serve` extra).
    from starlette.types import Receive, Scope, Send

__all__ = [
    "STORE_MAX_BODY_BYTES",
    "Admitted",
    "Authorizer",
    "Refusal",
    "ServerBase",
    "describe_validation",
    "validate_body",
]

logger = logging.getLogger(__name__)

STORE_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body a served store accepts by default (32 MiB); larger ones get 413."""


class Refusal(NamedTuple):
    """An error answer, before a server renders it in its own shape."""

    status: int
    message: str
    kind: str
    headers: Mapping[str, str] = {}


Authorizer = Callable[[str | None, Mapping[str, str]], Refusal | None]
"""(the ``Authorization`` header, the matched route's path parameters) -> a refusal, or ``None`` to let the caller in.

The path parameters let a rule admit by what the path itself carries (the proxy's runner slot keys); they are empty
for a path the table does not serve."""


_NO_PARAMS: Mapping[str, str] = {}


class Admitted(NamedTuple):
    """A request that passed admission: its route and path parameters, body and the headers servers read."""

    match: Match
    method: str
    body: bytes
    authorization: str | None
    agent: str | None
    """The ``x-agentlightning-agent`` header (the proxy routes calls by it)."""


def describe_validation(errors: Any, prefix: str = "") -> str:
    """One line naming each (of the first five) invalid fields, e.g. ``spans.2.span_id: String should match...``.

    Args:
        errors: pydantic's ``ValidationError.errors()``.
        prefix: The argument the locations are inside (``spans``), written before each.
    """
    parts: list[str] = []
    for err in list(errors)[:5]:
        loc = ".".join(str(p) for p in (prefix, *err.get("loc", ())) if p not in ("", "body"))
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            parts.append(f"malformed JSON: {ctx.get('error', err.get('msg', ''))}")
        else:
            parts.append(f"{loc or 'body'}: {str(err.get('msg', 'invalid')).removeprefix('Value error, ')}")
    return "; ".join(parts) or "invalid request"


def validate_body(model: type[BaseModel], body: bytes, status: int) -> Any:
    """``body`` checked against ``model`` (see the module docstring), or the `Refusal` (``status``) saying why."""
    raw = body if body.strip() else b"{}"
    try:
        if model.model_config.get("extra") != "allow":
            return model.model_validate_json(raw)
        data = from_json(raw, allow_inf_nan=False)
        if not isinstance(data, dict):
            return Refusal(status, "the request body must be a JSON object", "invalid_request_error")
        model.model_validate(data)  # the fields the server reads; every other field is passed on as sent
        return data  # pyright: ignore[reportUnknownVariableType]
    except ValidationError as exc:
        return Refusal(status, describe_validation(exc.errors()), "invalid")
    except ValueError as exc:
        return Refusal(status, f"malformed JSON: {exc}", "invalid")


class ServerBase:
    """The admission path both servers share (see the module docstring); subclasses answer and render refusals.

    Args:
        table: Every route served.
        max_body_bytes: Larger request bodies get 413.
        authorizers: Auth rule name -> its check (`OPEN` needs none); a route whose rule is missing is refused.
        startup: Awaited on the server's lifespan startup (a failure fails the startup); ``shutdown`` on shutdown.
    """

    name = "server"
    """How refusals name the server (``no route GET /x on the LLM proxy``)."""

    api_key_header: bytes | None = None
    """A header whose value counts as ``Authorization: Bearer <value>`` when no ``Authorization`` is sent (the LLM
    proxy's ``x-api-key``, which Anthropic's SDKs send instead)."""

    def __init__(
        self,
        table: RouteTable,
        max_body_bytes: int,
        authorizers: Mapping[str, Authorizer],
        startup: Callable[[], Awaitable[None]] | None = None,
        shutdown: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.table = table
        self.max_body_bytes = max_body_bytes
        self.authorizers = dict(authorizers)
        self.startup = startup
        self.shutdown = shutdown

    async def refuse(self, scope: Scope, receive: Receive, send: Send, refusal: Refusal) -> None:
        """Send ``refusal`` in the server's error shape."""
        raise NotImplementedError

    async def answer(self, scope: Scope, receive: Receive, send: Send, request: Admitted) -> None:
        """Answer an admitted request."""
        raise NotImplementedError

    def unserved(self, method: str, path: str) -> Refusal | None:
        """The refusal of a path no route serves, sent before any auth rule (``None``: refused behind ``bearer``).

        A server whose API is public (the LLM proxy speaks OpenAI's) says at once what it serves, so that an agent
        calling an API it does not serve learns that, not that its token is wrong.
        """
        return None

    def path_of(self, scope: Scope) -> str:
        """The path matched against the table (the decoded path; a server with raw paths overrides it)."""
        return str(scope["path"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(receive, send)
            return  # a websocket is refused by the server when the app does not accept it
        admitted = await self._admit(scope, receive)
        if isinstance(admitted, Refusal):
            await self.refuse(scope, receive, send, admitted)
        elif admitted is not None:
            await self.answer(scope, receive, send, admitted)

    async def _admit(self, scope: Scope, receive: Receive) -> Admitted | Refusal | None:
        """The admitted request, the refusal to send, or ``None`` when the client went away."""
        authorization = agent = api_key = None
        host = origin = content_type = b""
        length: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-length":
                if not value.strip().isdigit():
                    return Refusal(400, "Content-Length is not a number", "invalid")
                length = int(value)
            elif name == b"content-type":
                content_type = value
            elif name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"x-agentlightning-agent":
                agent = value.decode("latin-1")
            elif name == self.api_key_header:
                api_key = value.decode("latin-1")
        if authorization is None and api_key is not None:
            authorization = f"Bearer {api_key}"
        method: str = scope["method"]
        # A web page in the user's browser reaches a server on this machine too: it must not read or write it.
        refusal = cross_site_refusal(method, host, origin, content_type, chunked or bool(length), scope.get("server"))
        if refusal is not None:
            return Refusal(refusal[0], refusal[1], "forbidden" if refusal[0] == 403 else "unsupported_media_type")
        path = self.path_of(scope)
        found = self.table.match("GET" if method == "HEAD" else method, path)  # HEAD is answered as GET
        route = found.route if found is not None else self.table.allowed(path)
        if route is None:
            unserved = self.unserved(method, path)
            if unserved is not None:
                return unserved
        # A path the table does not serve (or not under this method) is behind the main rule: only a caller who may
        # use the API learns what it holds.
        rule = found.route.auth if found is not None else "bearer"
        if rule != OPEN:
            check = self.authorizers.get(rule)
            if check is None:
                return Refusal(401, f"no one may call {path}", "unauthorized")
            refusal = check(authorization, found.params if found is not None else _NO_PARAMS)
            if refusal is not None:
                return refusal
        if length is not None and length > self.max_body_bytes:
            return self.too_large(length)
        if found is None:
            if route is None:
                return Refusal(404, f"no route {method} {path} on the {self.name}", "not_found")
            allow = ", ".join(self.table.methods(path))
            message = f"{method} is not allowed on {path} (allowed: {allow})"
            return Refusal(405, message, "not_allowed", {"Allow": allow})
        body = b""
        if method not in ("GET", "HEAD"):
            read = await self._read(receive)
            if read is None or isinstance(read, Refusal):
                return read
            body = read
        return Admitted(found, method, body, authorization, agent)

    def too_large(self, size: int) -> Refusal:
        """The 413 refusal of a body of ``size`` bytes."""
        message = f"request body of {size} bytes is over the limit of {self.max_body_bytes} bytes; send less"
        return Refusal(413, message, "too_large")

    async def _read(self, receive: Receive) -> bytes | Refusal | None:
        """The whole request body within the limit, its 413, or ``None`` when the client went away."""
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk: bytes = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                return self.too_large(total)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.startup is not None:
                    try:
                        await self.startup()
                    except Exception as exc:
                        logger.exception("the %s could not start", self.name)
                        await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                        return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.shutdown is not None:
                    await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
