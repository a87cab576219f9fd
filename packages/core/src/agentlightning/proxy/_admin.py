"""The proxy's ``/admin/*`` routes: pause, resume, backends, model version, status (admin-token protected).

Every route answers `ProxyStatus`, which counts the late calls refused (calls for attempts that had already ended).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from agentlightning._netauth import bearer_matches
from agentlightning._routing import Route
from agentlightning.proxy._asgi import ADMIN, ProxyRequest, error
from agentlightning.proxy._assemble import loads

if TYPE_CHECKING:
    from agentlightning.proxy._proxy import LLMProxy

__all__ = ["admin_routes"]


class PauseBody(BaseModel):
    """``POST /admin/pause``: how long to wait for requests in flight (``null``: as long as it takes)."""

    model_config = ConfigDict(extra="forbid")
    timeout: float | None = None


class ResumeBody(BaseModel):
    """``POST /admin/resume``: the model version recorded from now on (``null``: unchanged)."""

    model_config = ConfigDict(extra="forbid")
    model_version: int | None = None


class BackendsBody(BaseModel):
    """``POST /admin/backends``: the new backend base URLs."""

    model_config = ConfigDict(extra="forbid")
    backends: list[str]


class ModelVersionBody(BaseModel):
    """``POST /admin/model_version``: the version recorded on calls whose backend reports none."""

    model_config = ConfigDict(extra="forbid")
    model_version: int


class ProxyStatus(BaseModel):
    """What every admin route answers: the proxy's state after the change."""

    paused: bool
    in_flight: int
    backends: list[str]
    model_version: int | None
    resent: int = 0
    """Requests sent to a backend a second time because their kept-alive connection had been closed unanswered."""
    slots: int = 0
    """Runner slots registered."""
    late_calls: int = 0
    """Calls refused because their attempt had already ended (409 ``attempt_finished``) since the start."""
    policy_calls: dict[str, int] = {}
    """With policies: calls routed to each policy since the start."""
    unmapped_calls: int = 0
    """With policies: calls whose agent matched no entry (or was not named), served by the default policy."""
    unmapped_agents: dict[str, int] = {}
    """Those calls by agent name (``<no agent header>`` for calls that named none)."""
    policy_versions: dict[str, int] = {}
    """With policies: the version recorded per policy for backends that report none."""


def admin_routes(proxy: LLMProxy) -> list[Route]:
    """The ``/admin/*`` routes of ``proxy`` (auth rule `ADMIN`: they check the admin token themselves)."""

    def bind(handler: Any) -> Any:
        async def endpoint(request: ProxyRequest) -> Response:
            return await handler(proxy, request)

        return endpoint

    errors = {401: "missing or wrong admin token", 403: "the proxy has no admin token: admin routes are disabled"}
    bad = {**errors, 400: "invalid body"}
    return [
        Route("POST", "/admin/pause", bind(_admin_pause), "admin_pause",
              "Refuse new requests (503) and wait until those in flight are answered.", body=PauseBody,
              response=ProxyStatus, errors={**bad, 504: "requests still in flight after the timeout"},
              tags=("admin",), auth=ADMIN),
        Route("POST", "/admin/resume", bind(_admin_resume), "admin_resume",
              "Admit requests again, optionally recording a new model version from now on.", body=ResumeBody,
              response=ProxyStatus, errors=bad, tags=("admin",), auth=ADMIN),
        Route("POST", "/admin/backends", bind(_admin_backends), "admin_backends",
              "Replace the backends; rollouts on a removed backend move on their next call.", body=BackendsBody,
              response=ProxyStatus, errors=bad, tags=("admin",), auth=ADMIN),
        Route("POST", "/admin/model_version", bind(_admin_model_version), "admin_model_version",
              "Set the version recorded on calls whose backend reports none.", body=ModelVersionBody,
              response=ProxyStatus, errors=bad, tags=("admin",), auth=ADMIN),
        Route("GET", "/admin/status", bind(_admin_status), "admin_status", "The proxy's state.",
              response=ProxyStatus, errors=errors, tags=("admin",), auth=ADMIN),
    ]  # fmt: skip


def _refusal(proxy: LLMProxy, request: ProxyRequest) -> Response | None:
    """Admin routes always need the admin token: without one configured they are closed, even on loopback."""
    if not proxy.admin_token:
        return error(
            403,
            "the proxy's admin routes are disabled: start it with an admin token (agl proxy serve --admin-token)",
            "forbidden",
        )
    if not bearer_matches(request.authorization, proxy.admin_token):
        return error(401, "admin routes need 'Authorization: Bearer <admin token>'", "unauthorized")
    return None


async def _admin_json(proxy: LLMProxy, request: ProxyRequest) -> dict[str, Any] | Response:
    refusal = _refusal(proxy, request)
    if refusal is not None:
        return refusal
    raw = request.body
    try:
        data = loads(raw) if raw.strip() else {}
    except ValueError:
        return error(400, "admin request body is not valid JSON", "invalid_request_error")
    if not isinstance(data, dict):
        return error(400, "admin request body must be a JSON object", "invalid_request_error")
    return cast(dict[str, Any], data)


def _status(proxy: LLMProxy) -> dict[str, Any]:
    return {
        "paused": proxy.paused,
        "in_flight": proxy.in_flight,
        "backends": proxy.backends,
        "model_version": proxy.model_version,
        "resent": proxy.resent,
        "slots": len(proxy.slots),
        "late_calls": proxy.late_calls,
        **(proxy.policy_router.status() if proxy.policy_router is not None else {}),
    }


async def _admin_pause(proxy: LLMProxy, request: ProxyRequest) -> Response:
    data = await _admin_json(proxy, request)
    if isinstance(data, Response):
        return data
    timeout = data.get("timeout")
    if timeout is not None and not isinstance(timeout, int | float):
        return error(400, f"'timeout' must be a number of seconds, got {timeout!r}", "invalid_request_error")
    try:
        await proxy.pause(timeout)
    except TimeoutError as exc:
        return error(504, str(exc), "proxy_drain_timeout")
    return JSONResponse(_status(proxy))


async def _admin_resume(proxy: LLMProxy, request: ProxyRequest) -> Response:
    data = await _admin_json(proxy, request)
    if isinstance(data, Response):
        return data
    version = data.get("model_version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
        return error(400, f"'model_version' must be a non-negative integer, got {version!r}", "invalid_request_error")
    proxy.resume(version)
    return JSONResponse(_status(proxy))


async def _admin_backends(proxy: LLMProxy, request: ProxyRequest) -> Response:
    data = await _admin_json(proxy, request)
    if isinstance(data, Response):
        return data
    backends = data.get("backends")
    if not isinstance(backends, list) or not all(isinstance(b, str) for b in cast(list[Any], backends)):
        return error(400, "'backends' must be a list of URLs", "invalid_request_error")
    try:
        proxy.set_backends(cast(list[str], backends))
    except ValueError as exc:
        return error(400, str(exc), "invalid_request_error")
    return JSONResponse(_status(proxy))


async def _admin_model_version(proxy: LLMProxy, request: ProxyRequest) -> Response:
    data = await _admin_json(proxy, request)
    if isinstance(data, Response):
        return data
    version = data.get("model_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        return error(400, f"'model_version' must be a non-negative integer, got {version!r}", "invalid_request_error")
    proxy.model_version = version
    return JSONResponse(_status(proxy))


async def _admin_status(proxy: LLMProxy, request: ProxyRequest) -> Response:
    refusal = _refusal(proxy, request)
    if refusal is not None:
        return refusal
    return JSONResponse(_status(proxy))
