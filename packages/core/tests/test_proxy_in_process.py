"""A backend served in the proxy's own process (`register_backend`, ``inproc://``): the proxy's rules hold there too.

The backend here is a small `InProcessBackend` written for the test (the torch trainer's real one is compared with
its HTTP server in ``packages/trainer-torch/tests/test_in_process_backend.py``): a stream that breaks off is
recorded as broken and never ends with ``[DONE]``, a body it does not hand over parsed is parsed, a body handed over
only parsed is rendered when read, a backend that raises is unreachable (502), and names are unique.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentlightning.proxy import (
    BackendLost,
    BackendReply,
    InProcessReply,
    LLMProxy,
    register_backend,
    unregister_backend,
)
from agentlightning.store import MemoryStore
from agentlightning.testing import start_attempts

ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "toy",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop", "token_ids": [7]}
    ],
    "prompt_token_ids": [1, 2],
    "model_version": 3,
}


def _chunk(content: str, token: int) -> bytes:
    delta = {"index": 0, "delta": {"content": content}, "finish_reason": None, "token_ids": [token]}
    return b"data: " + json.dumps({"id": "c", "choices": [delta], "model_version": 3}).encode() + b"\n\n"


class Toy:
    """Answers chat completions whole, or streams two events and then fails as a dropped connection would."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, body: bytes) -> BackendReply:
        request = json.loads(body)
        self.bodies.append(request)
        if request["messages"][0]["content"] == "raise":
            raise BackendLost("the toy backend is gone")
        if request["messages"][0]["content"] == "parsed only":
            return InProcessReply(200, {"content-type": "application/json"}, None, ANSWER)
        if not request.get("stream"):
            return InProcessReply(200, {"content-type": "application/json"}, json.dumps(ANSWER).encode())
        return InProcessReply(200, {"content-type": "text/event-stream; charset=utf-8"}, self._breaking())

    async def _breaking(self) -> AsyncIterator[bytes]:
        yield _chunk("h", 7)
        yield _chunk("i", 8)
        raise RuntimeError("decode failed")


@pytest.fixture
async def proxied() -> AsyncIterator[tuple[httpx.AsyncClient, LLMProxy, Toy, MemoryStore]]:
    store = MemoryStore()
    attempt = (await start_attempts(store, ["ro-1"]))["ro-1"]
    toy = Toy()
    url = register_backend(toy)
    try:
        async with (
            LLMProxy(store, [url], model_version=0) as proxy,
            httpx.AsyncClient(base_url=proxy.base_url("ro-1", attempt), timeout=30) as client,
        ):
            yield client, proxy, toy, store
    finally:
        unregister_backend(url)


async def test_whole_and_broken_streams_and_failures(
    proxied: tuple[httpx.AsyncClient, LLMProxy, Toy, MemoryStore],
) -> None:
    client, proxy, toy, store = proxied
    whole = await client.post(
        "/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": "a"}]}
    )
    # the agent asked for no token ids: it gets the answer without the ones the proxy asked for (they are recorded)
    without_ids = {k: v for k, v in ANSWER.items() if k != "prompt_token_ids"}
    without_ids["choices"] = [{k: v for k, v in c.items() if k != "token_ids"} for c in ANSWER["choices"]]
    assert whole.status_code == 200 and whole.json() == without_ids
    assert toy.bodies[0]["return_token_ids"] is True and toy.bodies[0]["logprobs"] is True  # as sent over HTTP
    stream = {"model": "toy", "stream": True, "messages": [{"role": "user", "content": "b"}]}
    broken = await client.post("/chat/completions", json=stream)
    assert broken.status_code == 200 and broken.content.endswith(b"\n\n")
    events = [json.loads(event.removeprefix(b"data: ")) for event in broken.content.split(b"\n\n") if event]
    assert [e["choices"][0] for e in events] == [  # no [DONE], no token ids
        {"index": 0, "delta": {"content": text}, "finish_reason": None} for text in "hi"
    ]
    gone = await client.post(
        "/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": "raise"}]}
    )
    assert gone.status_code == 502 and "the toy backend is gone" in gone.json()["error"]["message"]
    await proxy.flush()
    calls = await store.query_llm_calls("ro-1")
    assert [(c.prompt_token_ids, c.response_token_ids, c.model_version) for c in calls[:1]] == [([1, 2], [7], 3)]
    assert calls[1].error is not None and "broke" in calls[1].error and calls[1].response_token_ids == [7, 8]
    assert calls[2].error is not None and "could not reach backend" in calls[2].error


def test_names_are_unique_and_unknown_urls_are_refused() -> None:
    url = register_backend(Toy(), name="toy-unique")
    try:
        assert url == "inproc://toy-unique"
        with pytest.raises(ValueError, match="already registered"):
            register_backend(Toy(), name="toy-unique")
    finally:
        unregister_backend(url)
    unregister_backend(url)  # idempotent
    with pytest.raises(ValueError, match="inproc://"):
        LLMProxy(MemoryStore(), ["ftp://elsewhere"])


async def test_an_answer_handed_over_parsed_only_reaches_the_agent_as_its_json(
    proxied: tuple[httpx.AsyncClient, LLMProxy, Toy, MemoryStore],
) -> None:
    client, proxy, _toy, store = proxied
    ask = {"model": "toy", "messages": [{"role": "user", "content": "parsed only"}]}
    # the agent asks for the token fields itself, so the proxy relays the body's bytes: the reply renders them
    whole = await client.post("/chat/completions", json={**ask, "return_token_ids": True, "logprobs": True})
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/json"
    assert whole.json() == ANSWER
    await proxy.flush()
    [call] = await store.query_llm_calls("ro-1")
    assert (call.prompt_token_ids, call.response_token_ids, call.model_version, call.error) == ([1, 2], [7], 3, None)


async def test_a_reply_given_parsed_only_renders_its_body_once() -> None:
    value = {"text": "héllo ✓", "ids": [1, 2], "nested": {"none": None, "float": -0.25}}
    reply = InProcessReply(200, {"content-type": "application/json"}, None, value)
    assert reply.parsed is value and reply.content_type == "application/json"
    body = await reply.read()
    assert json.loads(body) == value
    assert await reply.read() is body  # rendered once
    assert [chunk async for chunk in reply.chunks()] == [body]
    reply.release()
    assert await reply.read() is body  # nothing to give back: the body stays readable
    unserialisable = InProcessReply(200, {"content-type": "application/json"}, None, {"x": object()})
    with pytest.raises(BackendLost, match="not JSON"):
        await unserialisable.read()
    with pytest.raises(ValueError, match="needs its body"):
        InProcessReply(200, {}, None)
