"""The dashboard's routes on the served store: its static files at ``/ui`` and one derived read endpoint.

==========================================  ==========================================
``GET  /ui``, ``GET /ui/<asset>``           the page and its scripts/styles (no token: they hold no data)
``POST /v1/ui/explain``                     `ExplainRequest` -> `ExplainResponse` (behind the token)
``POST /v1/ui/health``                      `RunHealthRequest` -> `RunHealthResponse`: ``agl doctor``'s checks (token)
==========================================  ==========================================

The page keeps the token in ``sessionStorage`` and sends it as a bearer header on every API call (never a cookie:
a request another site makes the browser send carries no token). It takes the token from the address it was
opened with (``/ui#token=...``, as ``agl store serve`` and ``agl train`` print it: a fragment, never sent to the
server, removed from the address bar at once) or from its login form. Everything else it shows comes from the store
API itself.
"""

from __future__ import annotations

from importlib import resources

from starlette.responses import RedirectResponse, Response

from agentlightning._routing import OPEN, Route
from agentlightning.store import LightningStore
from agentlightning.ui._explain import ExplainRequest, ExplainResponse, explain_attempt
from agentlightning.ui._health import RunHealthRequest, RunHealthResponse, run_health

__all__ = ["UI_PATH", "load_assets", "ui_routes"]

UI_PATH = "/ui"
"""Where the dashboard is served."""

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Only this origin's own files run; nothing is fetched from elsewhere (the page works offline).
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def load_assets() -> dict[str, tuple[bytes, str]]:
    """The dashboard's files shipped in the package: name -> (bytes, content type)."""
    folder = resources.files("agentlightning.ui") / "static"
    assets: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in _TYPES:
            assets[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    if "index.html" not in assets:
        raise RuntimeError(f"the dashboard's files are missing from {folder}; reinstall agentlightning-core")
    return assets


def ui_routes(store: LightningStore) -> list[Route]:
    """The dashboard's routes over ``store``, for the store server's route table (`create_store_app` adds them)."""
    assets = load_assets()

    def answer(name: str) -> Response:
        found = assets.get(name)
        if found is None:
            return Response(b'{"error":"not_found","message":"no such dashboard file"}', 404,
                            media_type="application/json")  # fmt: skip
        body, media_type = found
        return Response(body, media_type=media_type, headers=_HEADERS)

    async def index(_: None) -> Response:
        return answer("index.html")

    async def index_slash(_: None) -> Response:
        return RedirectResponse(UI_PATH)

    async def asset(params: dict[str, str]) -> Response:
        return answer(params["name"])

    async def explain(body: ExplainRequest) -> bytes:
        result = await explain_attempt(store, body)
        return result.__pydantic_serializer__.to_json(result)

    async def health(body: RunHealthRequest) -> bytes:
        result = await run_health(store, body)
        return result.__pydantic_serializer__.to_json(result)

    return [
        Route("GET", UI_PATH, index, "ui", "The dashboard page.", auth=OPEN, documented=False),
        Route("GET", UI_PATH + "/", index_slash, "ui_slash", "Redirects to the page.", auth=OPEN, documented=False),
        Route("GET", UI_PATH + "/{name}", asset, "ui_asset", "A file of the page.", auth=OPEN, documented=False),
        Route("POST", "/v1/ui/explain", explain, "explain",
              "An attempt's transitions with the credit and advantage LightningRL gives them within their group.",
              body=ExplainRequest, response=ExplainResponse, tags=("dashboard",)),
        Route("POST", "/v1/ui/health", health, "health",
              "agl doctor's checks over the newest finished rollouts: per agent and call site, each problem's fix.",
              body=RunHealthRequest, response=RunHealthResponse, tags=("dashboard",)),
    ]  # fmt: skip
