"""What a web page in the user's browser can do to a store or proxy on this machine: nothing.

A page on another origin can send simple requests (a form post, ``fetch`` with ``mode: "no-cors"``: any ``Host``
via DNS rebinding, ``text/plain`` bodies, no custom headers). Every served store has a token (generated when none is
given), a request from a foreign ``Origin`` or naming a foreign ``Host`` on loopback is refused (403), and a write
must be ``application/json`` (415). The proxy applies the same rules, and both read the bearer scheme in any case.

Real servers on 127.0.0.1, real HTTP; the requests are what a browser sends (``Origin``, ``Host``, content type).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvicorn

from agentlightning._netauth import bearer_matches, cross_site_refusal
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore, SqliteStore
from agentlightning.store._server import create_store_app
from agentlightning.testing import ScriptedModelServer, free_port, start_attempts
from agentlightning.ui import ui_routes

TOKEN = "cross-site-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "Content-Type": "application/json"}
AGL = [sys.executable, "-c", "import sys; from agentlightning.cli import main; sys.exit(main())"]
EVIL_RESOURCES = {"resources_id": "evil", "items": {"llm": {"kind": "llm", "endpoint": "http://evil.example/v1",
                                                              "model": "m"}}}  # fmt: skip


class _Served:
    """The store app served by uvicorn on 127.0.0.1 from a thread."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _Served:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("server thread died")
            self.thread.join(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def store_server() -> Iterator[tuple[_Served, MemoryStore]]:
    store = MemoryStore()
    with _Served(create_store_app(store, token=TOKEN, extra_routes=ui_routes(store))) as served:
        yield served, store


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _status(http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> tuple[int, str]:
    async with http.request(method, url, **kwargs) as resp:
        return resp.status, await resp.text()


# ----- the store ---------------------------------------------------------------------------------------------


async def test_store_refuses_a_foreign_origin_and_keeps_its_resources(
    store_server: tuple[_Served, MemoryStore], http: aiohttp.ClientSession
) -> None:
    served, store = store_server
    url = served.url + "/v1/resources"
    body = json.dumps(EVIL_RESOURCES)
    for origin in ("http://evil.example", "null", f"http://evil.example:{served.port}"):
        status, text = await _status(http, "POST", url, data=body, headers={**JSON, "Origin": origin})
        assert status == 403 and "origin" in json.loads(text)["message"], (origin, text)
    assert await store.get_resources() is None
    # the server's own origin (the dashboard) and non-browser clients (no Origin) are let through
    for extra in ({"Origin": served.url}, {"Origin": f"http://localhost:{served.port}"}, {}):
        host = {"Host": f"localhost:{served.port}"} if "localhost" in extra.get("Origin", "") else {}
        status, text = await _status(http, "GET", served.url + "/v1/stats", headers={**AUTH, **extra, **host})
        assert status == 200, (extra, text)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}"])
async def test_store_on_loopback_refuses_a_foreign_host(
    store_server: tuple[_Served, MemoryStore], http: aiohttp.ClientSession, host: str
) -> None:
    """DNS rebinding: the browser connects to 127.0.0.1 but names the attacker's host."""
    served, _ = store_server
    headers = {**AUTH, "Host": host.format(port=served.port)}
    status, text = await _status(http, "GET", served.url + "/v1/stats", headers=headers)
    assert status == 403 and "Host" in json.loads(text)["message"]
    assert "\n" not in json.loads(text)["message"]


@pytest.mark.parametrize("host", ["localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "LOCALHOST:{port}"])
async def test_store_on_loopback_accepts_its_own_names(
    store_server: tuple[_Served, MemoryStore], http: aiohttp.ClientSession, host: str
) -> None:
    served, _ = store_server
    headers = {**AUTH, "Host": host.format(port=served.port)}
    status, _ = await _status(http, "GET", served.url + "/v1/stats", headers=headers)
    assert status == 200


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])  # fmt: skip
async def test_store_writes_must_be_json(
    store_server: tuple[_Served, MemoryStore], http: aiohttp.ClientSession, content_type: str | None
) -> None:
    served, store = store_server
    headers = dict(AUTH) if content_type is None else {**AUTH, "Content-Type": content_type}
    rollout_id = f"sneaked-{content_type}"
    body = json.dumps({"requests": [{"input": 1, "rollout_id": rollout_id}]}).encode()
    async with http.post(served.url + "/v1/rollouts/enqueue", data=body, headers=headers,
                         skip_auto_headers=["Content-Type"]) as resp:  # fmt: skip
        assert resp.status == 415, await resp.text()
        assert "application/json" in (await resp.json())["message"]
    assert await store.query_rollouts(rollout_ids=[rollout_id]) == []
    status, _ = await _status(http, "POST", served.url + "/v1/rollouts/enqueue", data=body,
                              headers={**AUTH, "Content-Type": "application/json; charset=utf-8"})  # fmt: skip
    assert status == 200 and len(await store.query_rollouts(rollout_ids=[rollout_id])) == 1


async def test_store_serves_no_page_that_loads_scripts_from_elsewhere(
    store_server: tuple[_Served, MemoryStore], http: aiohttp.ClientSession
) -> None:
    """``/docs`` and ``/redoc`` loaded Swagger UI and ReDoc from a CDN without a Content-Security-Policy."""
    served, _ = store_server
    for path in ("/docs", "/redoc"):
        status, _ = await _status(http, "GET", served.url + path, headers=AUTH)
        assert status == 404, path
    status, text = await _status(http, "GET", served.url + "/ui")
    assert status == 200 and not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    status, _ = await _status(http, "GET", served.url + "/openapi.json", headers=AUTH)
    assert status == 200


def test_a_store_app_always_has_a_token() -> None:
    with pytest.raises(ValueError, match="token"):
        create_store_app(MemoryStore(), token="")
    with pytest.raises(TypeError):
        create_store_app(MemoryStore())  # type: ignore[call-arg]


def _serve_without_a_token(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """``agl store serve`` with no token given; returns the process and the dashboard URL it prints."""
    port = free_port()
    env = {**os.environ, "AGL_STORE_TOKEN": "", "COLUMNS": "400"}
    cmd = [*AGL, "store", "serve", "--db", str(tmp_path / "s.db"), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # blocks until the server prints its address (or exits: the loop ends)
        if "/ui" in line:
            return proc, line.split("dashboard:", 1)[1].split()[0]
    proc.wait()
    raise AssertionError(f"agl store serve exited with {proc.returncode} before printing its dashboard URL")


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    for _ in range(600):  # the address is printed just before the socket listens
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as error:
            return error.code
        except urllib.error.URLError:
            threading.Event().wait(0.05)
    raise AssertionError(f"nothing answers at {url}")


def test_agl_store_serve_without_a_token_makes_one_and_puts_it_in_the_dashboard_url(tmp_path: Path) -> None:
    proc, dashboard = _serve_without_a_token(tmp_path)
    try:
        match = re.fullmatch(r"(http://127\.0\.0\.1:\d+)/ui#token=([A-Za-z0-9_-]{32,})", dashboard)
        assert match is not None, dashboard
        base, token = match.groups()
        assert token not in " ".join(proc.args)  # type: ignore[arg-type]  # never on the command line (`ps`)
        assert _get(base + "/v1/stats") == 401
        assert _get(base + "/v1/stats", "not-" + token) == 401
        assert _get(base + "/v1/stats", token) == 200
    finally:
        proc.terminate()
        proc.wait(30)


async def test_dashboard_server_without_a_token_makes_one(tmp_path: Path) -> None:
    from agentlightning.ui import DashboardServer

    SqliteStore(tmp_path / "run.db")
    with DashboardServer(tmp_path / "run.db") as dashboard:
        assert dashboard.token is not None and len(dashboard.token) >= 32
        assert dashboard.url == f"http://127.0.0.1:{dashboard.port}/ui#token={dashboard.token}"
        base = f"http://127.0.0.1:{dashboard.port}"
        assert _get(base + "/v1/stats") == 401
        assert _get(base + "/v1/stats", dashboard.token) == 200


def test_store_server_without_a_token_makes_one_and_passes_it_by_environment(tmp_path: Path) -> None:
    from agentlightning.store import StoreServerProcess

    with StoreServerProcess(tmp_path / "s.db", "127.0.0.1", free_port()) as server:
        assert server.token is not None and len(server.token) >= 32
        assert server.token not in " ".join(server.command())
        assert _get(server.url + "/v1/stats") == 401
        assert _get(server.url + "/v1/stats", server.token) == 200


# ----- the bearer rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_bearer_scheme_is_case_insensitive(scheme: str) -> None:
    assert bearer_matches(f"{scheme} {TOKEN}", TOKEN)
    assert bearer_matches(f"{scheme} {TOKEN}".encode(), TOKEN)
    assert not bearer_matches(f"{scheme} {TOKEN.upper()}", TOKEN)  # the token itself is exact
    assert not bearer_matches(f"{scheme}{TOKEN}", TOKEN) and not bearer_matches(f"Basic {TOKEN}", TOKEN)
    assert not bearer_matches(None, TOKEN) and not bearer_matches(f"{scheme} ", TOKEN)


def test_cross_site_rule_in_one_function() -> None:
    ok = cross_site_refusal("POST", b"127.0.0.1:9", b"", b"application/json", True, ("127.0.0.1", 9))
    assert ok is None
    # off loopback any Host is fine (a token is required there); a foreign origin still is not
    assert cross_site_refusal("GET", b"trainer:9", b"", b"", False, ("10.0.0.5", 9)) is None
    refused = cross_site_refusal("GET", b"trainer:9", b"http://evil.example", b"", False, ("10.0.0.5", 9))
    assert refused is not None and refused[0] == 403
    # a write without a body needs no content type; one with a body needs JSON
    assert cross_site_refusal("POST", b"localhost:9", b"", b"", False, ("127.0.0.1", 9)) is None
    refused = cross_site_refusal("DELETE", b"localhost:9", b"", b"text/plain", True, ("::1", 9))
    assert refused is not None and refused[0] == 415


# ----- the proxy ---------------------------------------------------------------------------------------------


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


async def test_proxy_applies_the_same_rules(backend: ScriptedModelServer, http: aiohttp.ClientSession) -> None:
    store = MemoryStore()
    attempt = (await start_attempts(store, ["ro-1"]))["ro-1"]
    body = json.dumps({"model": "toy", "messages": [{"role": "user", "content": "hi"}]})
    async with LLMProxy(store, [backend.url]) as proxy:
        url = proxy.base_url("ro-1", attempt) + "/chat/completions"
        port = proxy.bound_port
        refusals = [
            ({"Content-Type": "text/plain"}, 415, "application/json"),
            ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403, "origin"),
            ({"Content-Type": "application/json", "Host": f"evil.example:{port}"}, 403, "Host"),
        ]
        for headers, status, needle in refusals:
            got, text = await _status(http, "POST", url, data=body, headers=headers)
            assert got == status and needle in json.loads(text)["error"]["message"], (headers, text)
        assert backend.requests == [] and await store.query_llm_calls("ro-1") == []
        got, text = await _status(http, "POST", url, data=body, headers={"Content-Type": "application/json"})
        assert got == 200, text
    assert len(await store.query_llm_calls("ro-1")) == 1


@pytest.mark.parametrize("scheme", ["bearer", "BEARER"])
async def test_proxy_reads_the_bearer_scheme_in_any_case_as_the_store_does(
    backend: ScriptedModelServer, http: aiohttp.ClientSession, scheme: str
) -> None:
    async with LLMProxy(MemoryStore(), [backend.url], token=TOKEN) as proxy:
        status, _ = await _status(http, "GET", proxy.url + "/v1/models", headers={"Authorization": f"{scheme} {TOKEN}"})
        assert status == 200
    with _Served(create_store_app(MemoryStore(), token=TOKEN)) as served:
        status, _ = await _status(http, "GET", served.url + "/v1/stats", headers={"Authorization": f"{scheme} {TOKEN}"})
        assert status == 200
