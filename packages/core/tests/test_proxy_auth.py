"""Who may use the LLM proxy: the agents' token on agent routes, the admin token on admin routes, off-loopback rules.

The runner token of the slot routes: `test_proxy_slot_security.py`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, start_attempts

TOKEN = "agents-token-0123456789"
ADMIN = "admin-token-0123456789ab"
AGL = [sys.executable, "-c", "import sys; from agentlightning.cli import main; sys.exit(main())"]


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


def _agent(proxy: LLMProxy, api_key: str, attempt_id: str = "at-1") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proxy.base_url("ro-1", attempt_id), api_key=api_key, max_retries=0)


async def test_with_a_token_every_completion_route_needs_it(backend: ScriptedModelServer) -> None:
    store = MemoryStore()
    await store.enqueue_rollout({"q": 1}, rollout_id="ro-1")
    claim = await store.dequeue_rollout()
    assert claim is not None
    attempt_id = claim.attempt.attempt_id
    async with LLMProxy(store, [backend.url], token=TOKEN) as proxy, aiohttp.ClientSession() as http:
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError, match="Bearer <token>"):
            await _agent(proxy, "wrong").chat.completions.create(model="toy", messages=messages)  # type: ignore[arg-type]
        with pytest.raises(openai.AuthenticationError):
            await _agent(proxy, "wrong").completions.create(model="toy", prompt="p")
        for path in ("/v1/models", f"/rollout/ro-1/attempt/{attempt_id}/v1/models"):
            async with http.get(f"{proxy.url}{path}") as resp:
                assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
        # plain /v1 and the FastAPI routes under a root path are behind the same check
        async with http.post(f"{proxy.url}/v1/chat/completions", json={"messages": messages}) as resp:
            assert resp.status == 401
        assert backend.requests == [] and await store.query_llm_calls("ro-1") == []  # nothing reached or recorded

        out = await _agent(proxy, TOKEN, attempt_id).chat.completions.create(model="toy", messages=messages)  # type: ignore[arg-type]
        async with http.get(f"{proxy.url}/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200
    [call] = await store.query_llm_calls("ro-1")
    assert call.response_id == out.id and call.response_token_ids == backend.served[0].token_ids
    assert TOKEN not in str(backend.authorizations)  # the proxy's token is never handed on to the backend


async def test_admin_routes_are_closed_without_an_admin_token_even_on_loopback(backend: ScriptedModelServer) -> None:
    async with LLMProxy(MemoryStore(), [backend.url], token=TOKEN) as proxy, aiohttp.ClientSession() as http:
        for method, path in (("POST", "/admin/pause"), ("POST", "/admin/backends"), ("GET", "/admin/status")):
            async with http.request(method, f"{proxy.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 403 and "admin token" in (await r.json())["error"]["message"]
        assert not proxy.paused and proxy.backends == [backend.url]
    proxy = LLMProxy(MemoryStore(), [backend.url], token=TOKEN, admin_token=ADMIN)
    async with proxy, aiohttp.ClientSession() as http:
        # the agents' token does not open the admin routes; the admin token does
        async with http.post(f"{proxy.url}/admin/pause", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 401
        async with http.post(f"{proxy.url}/admin/pause", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert r.status == 200 and proxy.paused


@pytest.mark.parametrize(
    ("host", "token", "message"),
    [
        ("10.213.0.1", None, "without a token"),
        ("0.0.0.0", None, "without a token"),
        ("10.213.0.1", "short", "5-character token: use at least 16"),
        ("0.0.0.0", TOKEN, "advertise_url"),
    ],
)
async def test_off_loopback_needs_a_long_token_and_an_advertised_address(
    backend: ScriptedModelServer, host: str, token: str | None, message: str
) -> None:
    proxy = LLMProxy(MemoryStore(), [backend.url], token=token, host=host)
    with pytest.raises(ValueError, match=message):
        await proxy.start()


def test_the_runner_token_must_differ_from_the_agents_token(backend: ScriptedModelServer) -> None:
    with pytest.raises(ValueError, match="runner_token must differ from token"):
        LLMProxy(MemoryStore(), [backend.url], token=TOKEN, runner_token=TOKEN)


async def test_bound_to_every_interface_it_publishes_the_advertised_url(backend: ScriptedModelServer) -> None:
    store = MemoryStore()
    attempt = (await start_attempts(store, ["r"]))["r"]
    proxy = LLMProxy(store, [backend.url], token=TOKEN, host="0.0.0.0", advertise_url="http://trainer.example:9/")
    async with proxy:
        assert proxy.url == "http://trainer.example:9"
        assert proxy.base_url("r", "a") == "http://trainer.example:9/rollout/r/attempt/a/v1"
        local = AsyncOpenAI(
            base_url=f"http://127.0.0.1:{proxy.bound_port}/rollout/r/attempt/{attempt}/v1", api_key=TOKEN
        )
        await local.completions.create(model="toy", prompt="p")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "without a token"),
        (["--host", "0.0.0.0", "--token", "abc"], "at least 16"),
        (["--host", "0.0.0.0", "--token", TOKEN, "--admin-token", "abc"], "at least 16"),
        (["--host", "0.0.0.0", "--token", TOKEN, "--runner-token", "abc"], "at least 16"),
    ],
)
def test_agl_proxy_serve_refuses_weak_tokens_off_loopback(args: list[str], message: str) -> None:
    cmd = [*AGL, "proxy", "serve", "--db", ":memory:", "--backend", "http://127.0.0.1:9", "--port", "0", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={"PATH": "", "COLUMNS": "400"})
    assert proc.returncode == 2
    assert message in proc.stderr and "secrets.token_urlsafe" in proc.stderr
