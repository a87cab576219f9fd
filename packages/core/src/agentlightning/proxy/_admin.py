"""The proxy's ``/admin/*`` routes: pause, resume, backends, model version, status (admin-token protected).

Every route answers `ProxyStatus`, which counts the late calls refused (calls for attempts that had already ended).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.responses import JSONResponse, Response

from agentlightning._netauth import bearer_matches
from agentlightning._routing import Route
from agentlightning._server_base import Refusal
from agentlightning.proxy._asgi import ADMIN, ProxyRequest, error

if TYPE_CHECKING:
    from agentlightning.proxy._proxy import LLMProxy

__all__ = ["admin_refusal", "admin_routes"]


class PauseBody(BaseModel):
    """``POST /admin/pause``: how long to wait for requests in flight (``null``: as long as it takes)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    timeout: float | None = Field(default=None, ge=0)


class ResumeBody(BaseModel):
    """``POST /admin/resume``: the model version recorded from now on (``null``: unchanged)."""

    model_config = ConfigDict(extra="forbid")
    model_version: StrictInt | None = Field(default=None, ge=0)


class BackendsBody(BaseModel):
    """``POST /admin/backends``: the new backend base URLs."""

    model_config = ConfigDict(extra="forbid")
    backends: list[str]


class ModelVersionBody(BaseModel):
    """``POST /admin/model_version``: the version recorded on calls whose backend reports none."""

    model_config = ConfigDict(extra="forbid")
    model_version: StrictInt = Field(ge=0)


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
    """The ``/admin/*`` routes of ``proxy`` (auth rule `ADMIN`: `admin_refusal`; bodies validated by their models)."""

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


def admin_refusal(proxy: LLMProxy, authorization: str | None) -> Refusal | None:
    """The `ADMIN` rule: always the admin token; without one configured the routes are closed, even on loopback."""
    if not proxy.admin_token:
        return Refusal(
            403,
            "the proxy's admin routes are disabled: start it with an admin token (agl proxy serve --admin-token)",
            "forbidden",
        )
    if not bearer_matches(authorization, proxy.admin_token):
        return Refusal(401, "admin routes need 'Authorization: Bearer <admin token>'", "unauthorized")
    return None


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
    body: PauseBody = request.parsed
    try:
        await proxy.pause(body.timeout)
    except TimeoutError as exc:
        return error(504, str(exc), "proxy_drain_timeout")
    return JSONResponse(_status(proxy))


async def _admin_resume(proxy: LLMProxy, request: ProxyRequest) -> Response:
    body: ResumeBody = request.parsed
    proxy.resume(body.model_version)
    return JSONResponse(_status(proxy))


async def _admin_backends(proxy: LLMProxy, request: ProxyRequest) -> Response:
    body: BackendsBody = request.parsed
    try:
        proxy.set_backends(body.backends)
    except ValueError as exc:
        return error(400, str(exc), "invalid_request_error")
    return JSONResponse(_status(proxy))


async def _admin_model_version(proxy: LLMProxy, request: ProxyRequest) -> Response:
    body: ModelVersionBody = request.parsed
    proxy.model_version = body.model_version
    return JSONResponse(_status(proxy))


async def _admin_status(proxy: LLMProxy, request: ProxyRequest) -> Response:
    return JSONResponse(_status(proxy))
