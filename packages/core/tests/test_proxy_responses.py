"""The LLM proxy's Responses route and its 404 for what it does not serve, against a scripted backend.

A path the proxy does not serve is answered 404 naming the path and the APIs it serves, under every URL shape and
whatever the token (it used to be 401: an agent on an API the proxy did not serve was told its token was wrong).
What a Responses call cannot honour, or malformed input, is a 400 naming it: nothing reaches the backend, nothing
is recorded, the proxy keeps serving. The Responses route keeps the chat route's rules: auth, slots, late calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from agentlightning.proxy import LLMProxy
from agentlightning.proxy._routes import AGENT_APIS
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, ScriptedReply, start_attempts

TOKEN = "agents-token-0123456789"
RUNNER = "runner-token-0123456789"
SLOT = "slot0123456789abcdefghij"


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
async def proxy(backend: ScriptedModelServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(MemoryStore(), [backend.url], token=TOKEN, runner_token=RUNNER) as running:
        yield running


async def _shapes(proxy: LLMProxy) -> dict[str, str]:
    """The three URL shapes' base URLs (the rollout's and the slot's run a started attempt)."""
    attempts = await start_attempts(proxy.store, ["ro-1"])
    async with httpx.AsyncClient() as http:
        body = {"rollout_id": "ro-1", "attempt_id": attempts["ro-1"]}
        resp = await http.put(f"{proxy.url}/slot/{SLOT}", json=body, headers={"Authorization": f"Bearer {RUNNER}"})
        assert resp.status_code == 200, resp.text
    return {
        "plain": f"{proxy.url}/v1",
        "rollout": proxy.base_url("ro-1", attempts["ro-1"]),
        "slot": proxy.slot_url(SLOT),
    }


@pytest.mark.parametrize("path", ["/nothing", "/audio/speech", "/messages/batches", "/responses/resp_1/cancel"])
async def test_an_unserved_path_is_404_naming_it_and_the_served_apis_under_every_shape(
    proxy: LLMProxy, backend: ScriptedModelServer, path: str
) -> None:
    shapes = await _shapes(proxy)
    async with httpx.AsyncClient() as http:
        for shape, base in shapes.items():
            for key in (None, "none", TOKEN):  # no token, a literal key, the right token: the same answer
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                resp = await http.post(f"{base}{path}", json={"model": "toy"}, headers=headers)
                assert resp.status_code == 404, (shape, key, resp.text)
                message = resp.json()["error"]["message"]
                assert f"POST {base.removeprefix(proxy.url)}{path}" in message
                for api in AGENT_APIS:
                    assert f"{api.method} {api.path}" in message and api.api in message
    assert backend.served == []


GOOD: dict[str, Any] = {"model": "toy", "input": "hi"}
REFUSED = [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"tools": [{"type": "web_search"}]}, "'web_search'"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs"]}]}, "'file_search'"),
    ({"tools": [{"type": "computer_use_preview", "display_width": 1, "display_height": 1}]}, "'computer_use_preview'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]}, "input_image"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input_file"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "5"}]}, "'call_9'"),
    ({"input": [{"type": "telepathy"}]}, "unknown input item type 'telepathy'"),
    ({"input": [{"type": "function_call", "name": "add", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": ["hi"]}, "input[0] must be an object"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
    ({"input": []}, "input is empty"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": 5}, "input"),
    ({"stream": "yes"}, "stream"),
]


async def test_what_cannot_be_honoured_is_a_400_naming_it_and_nothing_is_recorded(
    proxy: LLMProxy, backend: ScriptedModelServer
) -> None:
    shapes = await _shapes(proxy)
    async with httpx.AsyncClient() as http:
        for change, named in REFUSED:
            resp = await http.post(f"{shapes['slot']}/responses", json={**GOOD, **change})
            assert resp.status_code == 400, (change, resp.text)
            assert named in resp.json()["error"]["message"], (change, resp.text)
        big = {**GOOD, "input": "x" * (proxy.max_body_bytes + 1)}
        resp = await http.post(f"{shapes['slot']}/responses", json=big)
        assert resp.status_code == 413
        assert backend.served == []
        assert await proxy.store.query_llm_calls("ro-1") == []
        resp = await http.post(f"{shapes['slot']}/responses", json=GOOD)  # still healthy
        assert resp.status_code == 200 and resp.json()["output"][0]["content"][0]["text"]
    await proxy.flush()
    assert len(await proxy.store.query_llm_calls("ro-1")) == 1


async def test_responses_keep_the_chat_rules_auth_slots_and_late_calls(
    proxy: LLMProxy, backend: ScriptedModelServer
) -> None:
    shapes = await _shapes(proxy)
    backend.set_script([ScriptedReply(content="ok")] * 4)
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{shapes['rollout']}/responses", json=GOOD)
        assert resp.status_code == 401  # the per-rollout URL needs the agents' token
        resp = await http.post(f"{shapes['plain']}/responses", json=GOOD, headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status_code == 400 and "records calls per rollout" in resp.text
        resp = await http.post(f"{proxy.url}/slot/unregistered0123456789ab/v1/responses", json=GOOD)
        assert resp.status_code == 401
        resp = await http.post(f"{shapes['slot']}/responses", json=GOOD)
        assert resp.status_code == 200 and resp.json()["output"][0]["content"][0]["text"] == "ok"
        ended = {"ended": [{"rollout_id": "ro-1", "attempt_id": (await _attempt(proxy)), "slot": SLOT}]}
        resp = await http.put(f"{proxy.url}/slots", json=ended, headers={"Authorization": f"Bearer {RUNNER}"})
        assert resp.status_code == 200
        resp = await http.post(f"{shapes['slot']}/responses", json=GOOD)
        assert resp.status_code == 409 and resp.json()["error"]["type"] == "attempt_finished"
    await proxy.flush()
    assert len(await proxy.store.query_llm_calls("ro-1")) == 1


async def _attempt(proxy: LLMProxy) -> str:
    [attempt] = await proxy.store.query_attempts("ro-1")
    return attempt.attempt_id


async def test_a_failed_record_ends_the_stream_with_an_error_event(proxy: LLMProxy) -> None:
    """A streamed Responses call whose attempt the store does not know: the agent gets an error, not success."""
    import openai

    agent = openai.AsyncOpenAI(base_url=proxy.base_url("ro-unknown", "at-unknown"), api_key=TOKEN, max_retries=0)
    stream = await agent.responses.create(model="toy", input="hi", stream=True)
    with pytest.raises(openai.APIError, match="could not record"):
        async for _ in stream:
            pass
    await agent.close()
