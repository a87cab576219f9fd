"""The proxy validates every body by its route's model, in one place (the server base), as the store does.

A bad body gets 400 with a one-line reason naming the field, and nothing happens: no backend call, no record, no
admin or slot change. The OpenAI routes stay pass-through: their models check only the fields the proxy reads and
the backend gets every other field as the agent sent it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, start_attempts

ADMIN = "admin-token-0123456789abcdef"


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
async def proxy(backend: ScriptedModelServer) -> AsyncIterator[tuple[LLMProxy, MemoryStore, str]]:
    store = MemoryStore()
    attempt = (await start_attempts(store, ["ro-1"]))["ro-1"]
    async with LLMProxy(store, [backend.url], admin_token=ADMIN) as running:
        yield running, store, attempt


async def _post(url: str, body: Any, token: str | None = None, method: str = "POST") -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as http, http.request(method, url, data=data, headers=headers) as resp:
        return resp.status, await resp.json()


def _one_line_naming(answer: dict[str, Any], field: str) -> bool:
    message = answer["error"]["message"]
    return field in message and "\n" not in message and answer["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": "hi"}, "messages"),
        ({"model": "m"}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "hi"}], "model": 3}, "model"),
        ([{"role": "user", "content": "hi"}], "JSON object"),
        (b'{"messages": [', "malformed JSON"),
    ],
    ids=["messages-a-string", "no-messages", "stream-not-bool", "model-not-text", "not-an-object", "not-json"],
)
async def test_a_bad_chat_body_is_400_and_reaches_no_backend(
    proxy: tuple[LLMProxy, MemoryStore, str], backend: ScriptedModelServer, body: Any, field: str
) -> None:
    running, store, attempt = proxy
    status, answer = await _post(running.base_url("ro-1", attempt) + "/chat/completions", body)
    assert status == 400 and _one_line_naming(answer, field), answer
    assert backend.requests == [] and await store.query_llm_calls("ro-1") == []


async def test_a_chat_body_is_forwarded_as_sent(
    proxy: tuple[LLMProxy, MemoryStore, str], backend: ScriptedModelServer
) -> None:
    running, store, attempt = proxy
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.25, "vendor_extension": {"a": [1]}}
    status, _ = await _post(running.base_url("ro-1", attempt) + "/chat/completions", body)
    assert status == 200
    (sent,) = backend.requests
    assert {k: v for k, v in sent.items() if k in body} == body  # every field the agent sent, unchanged
    assert "model" not in sent and "stream" not in sent  # no default of the model was added
    assert len(await store.query_llm_calls("ro-1")) == 1


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/admin/resume", {"model_version": -1}, "model_version"),
        ("/admin/resume", {"model_version": True}, "model_version"),
        ("/admin/model_version", {"model_version": "7"}, "model_version"),
        ("/admin/backends", {"backends": "http://x"}, "backends"),
        ("/admin/pause", {"timeout": 1, "surprise": 1}, "surprise"),
    ],
)
async def test_a_bad_admin_body_is_400_and_changes_nothing(
    proxy: tuple[LLMProxy, MemoryStore, str], path: str, body: dict[str, Any], field: str
) -> None:
    running, _, _ = proxy
    before = (running.paused, running.model_version, running.backends)
    status, answer = await _post(running.url + path, body, ADMIN)
    assert status == 400 and _one_line_naming(answer, field), answer
    assert (running.paused, running.model_version, running.backends) == before


async def test_admin_auth_comes_before_the_body(proxy: tuple[LLMProxy, MemoryStore, str]) -> None:
    running, _, _ = proxy
    status, answer = await _post(running.url + "/admin/resume", {"model_version": -1})
    assert status == 401 and answer["error"]["type"] == "unauthorized"


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("PUT", "/slot/k0123456789abcdef", {"rollout_id": "", "attempt_id": "a"}, "rollout_id"),
        ("PUT", "/slot/k0123456789abcdef", {"rollout_id": "r", "attempt_id": "a", "x": 1}, "x"),
        ("DELETE", "/slot/k0123456789abcdef", {"rollout_id": 3, "attempt_id": "a"}, "rollout_id"),
        ("PUT", "/slots", {"slots": {"k0123456789abcdef": {"rollout_id": "r"}}}, "attempt_id"),
        ("PUT", "/slots", {"ended": [{"rollout_id": "r", "attempt_id": "a", "slot": 5}]}, "ended.0.slot"),
    ],
)
async def test_a_bad_slot_body_is_400_and_changes_nothing(
    proxy: tuple[LLMProxy, MemoryStore, str], method: str, path: str, body: dict[str, Any], field: str
) -> None:
    running, _, _ = proxy
    status, answer = await _post(running.url + path, body, running.runner_token, method)
    assert status == 400 and _one_line_naming(answer, field), answer
    assert len(running.slots) == 0 and not running.slots.has_ended("r", "a")
