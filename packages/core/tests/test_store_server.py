"""The served store's HTTP surface: auth, error mapping, bad input never reaching the store, OpenAPI, CLI checks."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import uvicorn

from agentlightning import StoreClient
from agentlightning.cli import main as agl_main
from agentlightning.store import ConflictError, MemoryStore, NotFoundError, RetryPolicy, StoreError
from agentlightning.store._client import InvalidRequestError, UnauthorizedError
from agentlightning.store._server import create_store_app
from agentlightning.testing import free_port
from agentlightning.testing._store_kit import make_span

TOKEN = "s3cret-token"
MAX_BODY = 64 * 1024


class _Server:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.port = free_port()
        app = create_store_app(store, token=TOKEN, max_body_bytes=MAX_BODY)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _Server:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("server thread died")
            threading.Event().wait(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    with _Server(MemoryStore(RetryPolicy(max_attempts=1))) as srv:
        yield srv


@pytest.fixture
async def http(server: _Server) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(server.url) as session:
        yield session


@pytest.fixture
async def client(server: _Server) -> AsyncIterator[StoreClient]:
    c = StoreClient(server.url, token=TOKEN, retries=0)
    yield c
    await c.close()


AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "Content-Type": "application/json"}


async def _snapshot(client: StoreClient) -> tuple[Any, ...]:
    rollouts = await client.query_rollouts()
    spans = [await client.query_spans(r.rollout_id) for r in rollouts]
    return (await client.stats(), rollouts, spans)


async def test_healthz_is_open(http: aiohttp.ClientSession) -> None:
    async with http.get("/healthz") as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ok"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
async def test_requests_without_the_right_token_get_401(http: aiohttp.ClientSession, headers: dict[str, str]) -> None:
    for method, path in [("GET", "/v1/stats"), ("POST", "/v1/rollouts/dequeue"), ("GET", "/openapi.json")]:
        json_body = {**headers, "Content-Type": "application/json"}
        async with http.request(method, path, headers=json_body, data=b"{}") as resp:
            assert resp.status == 401, path
            body = await resp.json()
            assert body["error"] == "unauthorized" and "bearer token" in body["message"]
            assert resp.headers["WWW-Authenticate"] == "Bearer"


async def test_client_with_wrong_token_raises(server: _Server) -> None:
    bad = StoreClient(server.url, token="nope", retries=0)
    try:
        with pytest.raises(UnauthorizedError, match="wrong bearer token"):
            await bad.stats()
    finally:
        await bad.close()


async def test_token_scheme_is_case_insensitive(http: aiohttp.ClientSession) -> None:
    async with http.get("/v1/stats", headers={"Authorization": f"bearer {TOKEN}"}) as resp:
        assert resp.status == 200


BAD_BODIES: list[tuple[str, bytes, int, str]] = [
    ("/v1/rollouts/enqueue", b'{"requests": [{"input": 1', 422, "malformed JSON"),
    ("/v1/rollouts/enqueue", b'{"requests": [{"mode": "nonsense"}]}', 422, "requests.0.mode"),
    ("/v1/rollouts/enqueue", b'{"requests": "abc"}', 422, "requests"),
    ("/v1/rollouts/enqueue", b'{"requests": [], "extra": 1}', 422, "extra"),
    ("/v1/rollouts/enqueue", b"[1, 2]", 422, "body"),
    ("/v1/rollouts/dequeue", b'{"worker_id": 5}', 422, "worker_id"),
    ("/v1/attempts/finish", b'{"rollout_id": "r", "attempt_id": "a", "status": "great"}', 422, "status"),
    ("/v1/attempts/finish", b'{"rollout_id": "r", "attempt_id": "a", "status": "running"}', 422, "running"),
    ("/v1/attempts/heartbeat", b'{"rollout_id": "", "attempt_id": "a"}', 422, "rollout_id"),
    ("/v1/spans", b'{"spans": [{"span_id": "xyz"}]}', 422, "spans.0"),
    ("/v1/rollouts/wait", b'{"rollout_ids": ["a"], "timeout": -1}', 422, "timeout"),
    ("/v1/rollouts/wait", b'{"rollout_ids": ["a"], "timeout": 1e9}', 422, "timeout"),
    ("/v1/resources", b'{"resources_id": "x", "items": {"a": {"kind": "weird"}}}', 422, "items.a"),
    ("/v1/rollouts/query", b'{"status": ["sleeping"]}', 422, "status.0"),
    ("/v1/rollouts/query", b"\xff\xfe not utf8", 422, "malformed JSON"),
]


@pytest.mark.parametrize(("path", "body", "status", "needle"), BAD_BODIES)
async def test_bad_input_is_a_4xx_with_a_message_and_changes_nothing(
    http: aiohttp.ClientSession, client: StoreClient, path: str, body: bytes, status: int, needle: str
) -> None:
    await client.enqueue_rollout("keep", rollout_id=f"keep-{path}-{status}-{needle}")
    before = await _snapshot(client)
    async with http.post(path, data=body, headers=JSON) as resp:
        assert resp.status == status, await resp.text()
        payload = await resp.json()
    assert needle in payload["message"]
    assert payload["error"] == "invalid"
    assert await _snapshot(client) == before


async def test_span_batch_with_one_bad_span_stores_nothing(http: aiohttp.ClientSession, client: StoreClient) -> None:
    await client.enqueue_rollout("x", rollout_id="span-batch")
    spans = [json.loads(make_span("span-batch", "a1", i).model_dump_json()) for i in range(3)]
    spans[2]["end_time"] = spans[2]["start_time"] - 1
    before = await _snapshot(client)
    async with http.post("/v1/spans", data=json.dumps({"spans": spans}), headers=JSON) as resp:
        assert resp.status == 422
        assert "spans.2" in (await resp.json())["message"]
    assert await _snapshot(client) == before


async def test_a_body_that_is_not_declared_json_is_refused_with_415(http: aiohttp.ClientSession) -> None:
    # curl -d sends form-encoded bodies, as a web page's form post does: refused, saying what to send instead
    form = {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}
    for body in (b"{}", b"status=queuing"):
        async with http.post("/v1/rollouts/query", data=body, headers=form) as resp:
            assert resp.status == 415
            message = (await resp.json())["message"]
            assert "Content-Type: application/json" in message and "curl" in message


async def test_oversized_body_is_413(http: aiohttp.ClientSession, client: StoreClient) -> None:
    before = await _snapshot(client)
    big = json.dumps({"requests": [{"input": "x" * (MAX_BODY + 10)}]}).encode()
    async with http.post("/v1/rollouts/enqueue", data=big, headers=JSON) as resp:
        assert resp.status == 413
        assert "over the limit" in (await resp.json())["message"]

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted while streaming
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    async with http.post("/v1/rollouts/enqueue", data=chunked(), headers=JSON) as resp:
        assert resp.status == 413
    assert await _snapshot(client) == before
    # a chunked body under the limit still works
    small = b'{"requests": [{"rollout_id": "chunked-ok"}]}'

    async def small_chunks() -> AsyncIterator[bytes]:
        yield small[:10]
        yield small[10:]

    async with http.post("/v1/rollouts/enqueue", data=small_chunks(), headers=JSON) as resp:
        assert resp.status == 200
    assert (await client.get_rollout("chunked-ok")).status == "queuing"


async def test_unknown_ids_and_routes_are_404(http: aiohttp.ClientSession, client: StoreClient) -> None:
    for method, path, body in [
        ("GET", "/v1/rollouts/does-not-exist", None),
        ("POST", "/v1/attempts/heartbeat", {"rollout_id": "does-not-exist", "attempt_id": "a"}),
        ("POST", "/v1/rollouts/cancel", {"rollout_id": "does-not-exist"}),
        ("POST", "/v1/resources/get", {"resources_id": "does-not-exist"}),
        ("POST", "/v1/rollouts/wait", {"rollout_ids": ["does-not-exist"], "timeout": 0}),
        ("GET", "/v1/no-such-endpoint", None),
    ]:
        async with http.request(method, path, json=body, headers=AUTH) as resp:
            assert resp.status == 404, path
            payload = await resp.json()
            assert payload["error"] == "not_found"
    with pytest.raises(NotFoundError, match="does-not-exist"):
        await client.get_rollout("does-not-exist")
    async with http.put("/v1/stats", headers=AUTH) as resp:
        assert resp.status == 405


async def test_conflicts_are_409_and_map_back(client: StoreClient) -> None:
    rollout = await client.enqueue_rollout("c", rollout_id="conflict-1")
    claim = None
    while claim is None or claim.rollout.rollout_id != rollout.rollout_id:
        claim = await client.dequeue_rollout()
        assert claim is not None
        if claim.rollout.rollout_id != rollout.rollout_id:
            await client.finish_attempt(claim.rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
    await client.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
    with pytest.raises(ConflictError):
        await client.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "failed")
    with pytest.raises(ConflictError):
        await client.heartbeat(rollout.rollout_id, claim.attempt.attempt_id)


async def test_invalid_request_error_is_a_value_error(http: aiohttp.ClientSession) -> None:
    # The client validates locally, so send a finish with a non-terminal status through raw HTTP and map it.
    from agentlightning.store._client_transport import raise_for

    async with http.post(
        "/v1/attempts/finish", json={"rollout_id": "r", "attempt_id": "a", "status": "running"}, headers=AUTH
    ) as resp:
        status, payload = resp.status, await resp.read()
    with pytest.raises(InvalidRequestError, match="running") as info:
        raise_for(status, payload)
    assert isinstance(info.value, ValueError) and isinstance(info.value, StoreError)


async def test_dequeue_request_id_returns_the_same_claim(http: aiohttp.ClientSession, client: StoreClient) -> None:
    await client.enqueue_rollouts([])
    r1 = await client.enqueue_rollout("d1", rollout_id="dq-1")
    r2 = await client.enqueue_rollout("d2", rollout_id="dq-2")
    # drain anything older first
    claims: list[Any] = []
    while True:
        async with http.post("/v1/rollouts/dequeue", json={"request_id": f"req-{len(claims)}"}, headers=AUTH) as resp:
            claim = (await resp.json())["claim"]
        assert claim is not None
        claims.append(claim)
        if claim["rollout"]["rollout_id"] == r1.rollout_id:
            break
    # the same request id again (a retry): same claim, nothing new claimed
    same_id = f"req-{len(claims) - 1}"
    answers = await asyncio.gather(
        *[http.post("/v1/rollouts/dequeue", json={"request_id": same_id}, headers=AUTH) for _ in range(3)]
    )
    for resp in answers:
        assert (await resp.json())["claim"] == claims[-1]
        resp.release()
    assert (await client.get_rollout(r2.rollout_id)).status == "queuing"
    assert len(await client.query_attempts(r1.rollout_id)) == 1


async def test_client_round_trips_the_protocol(client: StoreClient) -> None:
    policy = await client.fetch_retry_policy()
    assert policy == RetryPolicy(max_attempts=1)
    assert client.retry_policy == policy
    with pytest.raises(StoreError, match="where it is served"):
        client.retry_policy = RetryPolicy()
    rollout = await client.enqueue_rollout({"odd id": True}, rollout_id="weird/id with spaces?&#")
    assert (await client.get_rollout("weird/id with spaces?&#")) == rollout
    assert (await client.cancel_rollout(rollout.rollout_id)).status == "cancelled"


def test_openapi_lists_every_endpoint_with_typed_bodies(server: _Server) -> None:
    import urllib.request

    req = urllib.request.Request(f"{server.url}/openapi.json", headers=AUTH)
    with urllib.request.urlopen(req) as resp:
        schema = json.load(resp)
    paths = schema["paths"]
    for path in [
        "/healthz",
        "/v1/rollouts/enqueue",
        "/v1/rollouts/dequeue",
        "/v1/rollouts/query",
        "/v1/rollouts/cancel",
        "/v1/rollouts/wait",
        "/v1/rollouts/{rollout_id}",
        "/v1/attempts/heartbeat",
        "/v1/attempts/finish",
        "/v1/attempts/query",
        "/v1/attempts/check_timeouts",
        "/v1/spans",
        "/v1/spans/query",
        "/v1/llm_calls",
        "/v1/llm_calls/query",
        "/v1/resources",
        "/v1/resources/get",
        "/v1/stats",
        "/v1/retry_policy",
    ]:
        assert path in paths, path
    post = paths["/v1/spans"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/SpansRequest"}
    assert "AddedResponse" in json.dumps(post["responses"]["200"])
    assert post["security"] == [{"bearer": []}]
    assert "security" not in paths["/healthz"]["get"]
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_serve_refuses_public_host_without_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AGL_STORE_TOKEN", raising=False)
    assert agl_main(["store", "serve", "--memory", "--host", "0.0.0.0", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "without a token" in err and "AGL_STORE_TOKEN" in err


def test_serve_rejects_bad_retry_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert agl_main(["store", "serve", "--memory", "--max-attempts", "0", "--port", str(free_port())]) == 2
    assert "max_attempts" in capsys.readouterr().err


def test_client_rejects_bad_url() -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        StoreClient("localhost:4747")


async def test_a_usual_span_batch_reaches_a_memory_store_whole() -> None:
    # The fast lane hands the backend the checked batch (CheckedSpans): a memory store reads it as models.
    with _Server(MemoryStore()) as srv:
        c = StoreClient(srv.url, token=TOKEN, retries=0)
        try:
            await c.enqueue_rollout("usual batch")
            claim = await c.dequeue_rollout()
            assert claim is not None
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            spans = [make_span(rid, aid, i) for i in range(100)]
            assert await c.add_spans(spans) == 100
            assert await c.add_spans(spans[50:]) == 0
            stored = await srv.store.query_spans(rid)
            assert [s.model_dump_json() for s in stored] == [s.model_dump_json() for s in spans]
        finally:
            await c.close()


async def test_a_usual_span_batch_passes_through_a_store_client_backend() -> None:
    # A served store whose backend is a StoreClient (a relay) sends the checked batch on as its models.
    with _Server(MemoryStore()) as inner:
        relay = StoreClient(inner.url, token=TOKEN, retries=0)
        with _Server(relay) as outer:  # pyright: ignore[reportArgumentType]
            c = StoreClient(outer.url, token=TOKEN, retries=0)
            try:
                await c.enqueue_rollout("relayed batch")
                claim = await c.dequeue_rollout()
                assert claim is not None
                rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
                spans = [make_span(rid, aid, i) for i in range(50)]
                assert await c.add_spans(spans) == 50
                stored = await inner.store.query_spans(rid)
                assert [s.model_dump_json() for s in stored] == [s.model_dump_json() for s in spans]
            finally:
                await c.close()
        await relay.close()  # (its connections were made on the relay server's loop, which has ended)
