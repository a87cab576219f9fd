"""The proxy's ``/admin/*`` routes: pause, resume, backends, model version, status (admin-token protected)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentlightning._netauth import bearer_matches
from agentlightning.proxy._assemble import loads

if TYPE_CHECKING:
    from agentlightning.proxy._proxy import LLMProxy

__all__ = ["add_admin_routes"]


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


def add_admin_routes(app: FastAPI, proxy: LLMProxy) -> None:
    """Register the ``/admin/*`` routes of ``proxy`` on ``app``."""
    routes = {
        "/admin/pause": (_admin_pause, "POST"),
        "/admin/resume": (_admin_resume, "POST"),
        "/admin/backends": (_admin_backends, "POST"),
        "/admin/model_version": (_admin_model_version, "POST"),
        "/admin/status": (_admin_status, "GET"),
    }
    for path, (handler, method) in routes.items():

        async def endpoint(request: Request, handler: Any = handler) -> Response:
            return await handler(proxy, request)

        app.add_route(path, endpoint, methods=[method])


def _refusal(proxy: LLMProxy, request: Request) -> Response | None:
    """Admin routes always need the admin token: without one configured they are closed, even on loopback."""
    if not proxy.admin_token:
        return _error(
            403,
            "the proxy's admin routes are disabled: start it with an admin token (agl proxy serve --admin-token)",
            "forbidden",
        )
    if not bearer_matches(request.headers.get("authorization"), proxy.admin_token):
        return _error(401, "admin routes need 'Authorization: Bearer <admin token>'", "unauthorized")
    return None


async def _admin_json(proxy: LLMProxy, request: Request) -> dict[str, Any] | Response:
    refusal = _refusal(proxy, request)
    if refusal is not None:
        return refusal
    raw = await request.body()
    try:
        data = loads(raw) if raw.strip() else {}
    except ValueError:
        return _error(400, "admin request body is not valid JSON", "invalid_request_error")
    if not isinstance(data, dict):
        return _error(400, "admin request body must be a JSON object", "invalid_request_error")
    return cast(dict[str, Any], data)


def _status(proxy: LLMProxy) -> dict[str, Any]:
    return {
        "paused": proxy.paused,
        "in_flight": proxy.in_flight,
        "backends": proxy.backends,
        "model_version": proxy.model_version,
    }


async def _admin_pause(proxy: LLMProxy, request: Request) -> Response:
    data = await _admin_json(proxy, request)
    if isinstance(data, Response):
        return data
    timeout = data.get("timeout")
    if timeout is not None and not isinstance(timeout, int | float):
        return _error(400, f"'timeout' must be a number of seconds, got {timeout!r}", "invalid_request_error")
    try:
        await proxy.pause(timeout)
    except TimeoutError as exc:
        return _error(504, str(exc), "proxy_drain_timeout")
    return JSONResponse(_status(proxy))


async def _admin_resume(proxy: LLMProxy, request: Request) -> Response:
    data = await _admin_json(proxy, request)
    if isinstance(data, Response):
        return data
    version = data.get("model_version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
        return _error(400, f"'model_version' must be a non-negative integer, got {version!r}", "invalid_request_error")
    proxy.resume(version)
    return JSONResponse(_status(proxy))


async def _admin_backends(proxy: LLMProxy, request: Request) -> Response:
    data = await _admin_json(proxy, request)
    if isinstance(data, Response):
        return data
    backends = data.get("backends")
    if not isinstance(backends, list) or not all(isinstance(b, str) for b in cast(list[Any], backends)):
        return _error(400, "'backends' must be a list of URLs", "invalid_request_error")
    try:
        proxy.set_backends(cast(list[str], backends))
    except ValueError as exc:
        return _error(400, str(exc), "invalid_request_error")
    return JSONResponse(_status(proxy))


async def _admin_model_version(proxy: LLMProxy, request: Request) -> Response:
    data = await _admin_json(proxy, request)
    if isinstance(data, Response):
        return data
    version = data.get("model_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        return _error(400, f"'model_version' must be a non-negative integer, got {version!r}", "invalid_request_error")
    proxy.model_version = version
    return JSONResponse(_status(proxy))


async def _admin_status(proxy: LLMProxy, request: Request) -> Response:
    refusal = _refusal(proxy, request)
    if refusal is not None:
        return refusal
    return JSONResponse(_status(proxy))
