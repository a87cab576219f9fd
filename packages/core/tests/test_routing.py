"""One route table per server: matching rules, and what is documented is exactly what is dispatched."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentlightning._routing import Route, RouteTable
from agentlightning.proxy import create_proxy_app
from agentlightning.store import MemoryStore
from agentlightning.store._server import create_store_app
from agentlightning.ui import ui_routes

TOKEN = "routes-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _echo(given: Any) -> Any:
    return given


def _route(method: str, path: str, name: str) -> Route:
    return Route(method, path, _echo, name, "A route.")  # type: ignore[arg-type]


def test_table_matches_fixed_templated_and_rest_paths() -> None:
    table = RouteTable(
        [
            _route("GET", "/v1/items/{item_id:path}", "get_item"),
            _route("POST", "/v1/items/query", "query"),
            _route("GET", "/v1/users/{user}/posts/{post}", "post"),
        ]
    )
    fixed = table.match("POST", "/v1/items/query")
    assert fixed is not None and fixed.route.name == "query" and fixed.params == {}
    rest = table.match("GET", "/v1/items/a/b c")
    assert rest is not None and rest.params == {"item_id": "a/b c"}
    two = table.match("GET", "/v1/users/ann/posts/7")
    assert two is not None and two.params == {"user": "ann", "post": "7"}
    assert table.match("GET", "/v1/users//posts/7") is None  # a one-segment parameter is never empty
    assert table.match("DELETE", "/v1/items/query") is None
    assert table.allowed("/v1/items/query") is not None and table.allowed("/v1/nothing") is None
    assert table.methods("/v1/items/query") == ["GET", "HEAD", "POST"]  # GET: the templated route matches too


def test_table_decodes_after_splitting_when_given_raw_paths() -> None:
    table = RouteTable([_route("GET", "/r/{rid}/a/{aid}", "one")], decode=True)
    found = table.match("GET", "/r/x%2Fy/a/%23z")
    assert found is not None and found.params == {"rid": "x/y", "aid": "#z"}


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ([_route("GET", "/a", "one"), _route("GET", "/a", "two")], "declared twice"),
        ([_route("GET", "/a", "one"), _route("POST", "/a", "one")], "used twice"),
    ],
)
def test_table_refuses_a_route_declared_twice(routes: list[Route], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouteTable(routes)


@pytest.mark.parametrize(
    ("path", "message"),
    [("a", "must start with"), ("/a/x{id}", "whole segment"), ("/a/{rest:path}/b", "only the last")],
)
def test_route_refuses_bad_templates(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _route("GET", path, "bad")


def _dispatched(http: TestClient, method: str, path: str) -> bool:
    """Whether ``method path`` reaches a route: neither 405 nor a missing route."""
    body = method in ("POST", "PUT")
    headers = {**AUTH, "Content-Type": "application/json"} if body else AUTH
    resp = http.request(method, path, headers=headers, content=b"{}" if body else None)
    return resp.status_code != 405 and not (resp.status_code == 404 and "no route" in resp.text)


def _concrete(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "some-id", template)


def _store() -> Any:
    store = MemoryStore()
    return create_store_app(store, token=TOKEN, extra_routes=ui_routes(store))


def _proxy() -> Any:
    return create_proxy_app(MemoryStore(), ["http://127.0.0.1:9/v1"], token=TOKEN, admin_token="admin-" + TOKEN)


@pytest.mark.parametrize(("make", "undocumented"), [(_store, 4), (_proxy, 1)], ids=["store", "proxy"])
def test_server_documents_exactly_the_routes_it_dispatches(make: Callable[[], Any], undocumented: int) -> None:
    """Store: the page's 3 routes and the document are served undocumented; proxy: the document."""
    app = make()
    with TestClient(app) as http:
        document = http.get("/openapi.json", headers=AUTH).json()
        operations = [
            (method.upper(), re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$"))
            for path, ops in document["paths"].items()
            for method in ops
        ]
        assert len(operations) == len(app.table.routes) - undocumented
        # Every documented path, and paths one step off them, under each method: served iff documented.
        paths = {_concrete(path) for path in document["paths"]} | {"/v1/nothing", "/v1/rollouts", "/slot", "/ui/a/b"}
        for method in ("GET", "POST", "PUT", "DELETE"):
            for path in sorted(paths):
                documented = any(m == method and pattern.match(path) for m, pattern in operations)
                assert _dispatched(http, method, path) == documented, (method, path)


def test_store_serves_its_page_undocumented_and_head_as_get() -> None:
    with TestClient(_store()) as http:
        paths = http.get("/openapi.json", headers=AUTH).json()["paths"]
        for path in ("/ui", "/ui/app.js"):
            assert _dispatched(http, "GET", path) and path not in paths
        for path in ("/docs", "/redoc"):  # Swagger UI and ReDoc load scripts from a CDN: not served
            assert not _dispatched(http, "GET", path)
        head = http.head("/healthz")
        assert head.status_code == 200 and head.content == b""
        wrong = http.get("/v1/spans", headers=AUTH)
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert "GET is not allowed on /v1/spans" in wrong.json()["message"]


def test_proxy_documents_its_auth_rules() -> None:
    with TestClient(_proxy()) as http:
        document = http.get("/openapi.json", headers=AUTH).json()
    paths = document["paths"]
    assert paths["/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"]["post"]["security"] == [
        {"bearer": []}
    ]
    assert paths["/admin/pause"]["post"]["security"] == [{"admin": []}]
    assert paths["/slot/{slot}"]["put"]["security"] == paths["/slots"]["put"]["security"] == [{"runner": []}]
    assert set(document["components"]["securitySchemes"]) == {"bearer", "admin", "runner"}
