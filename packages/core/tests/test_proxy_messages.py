"""The LLM proxy's Anthropic Messages routes, driven by the real ``anthropic`` SDK against a scripted chat backend.

What is checked here (the real model's round trips are in ``tests/test_anthropic_messages.py``): the translation both
ways (system, text, parallel tool use and results, tool_choice, stop reasons, usage), Anthropic's event stream as the
SDK parses it, every URL shape with the chat routes' rules (plain refused, slot key, late calls 409, unregistered slot
404), a body over the limit, a stream cut mid-way, and count_tokens on a backend without ``/tokenize``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import AsyncAnthropic

from agentlightning.proxy import (
    BackendLost,
    InProcessReply,
    LLMProxy,
    register_backend,
    unregister_backend,
)
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, ScriptedReply, start_attempts

TOKEN = "agents-token-0123456789"
SLOT_KEY = "k" * 24
TOOLS: list[Any] = [
    {
        "name": "add",
        "description": "Add.",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
    {"name": "mul", "input_schema": {"type": "object", "properties": {}}},
]
PARALLEL = ScriptedReply(
    content="Let me compute.",
    tool_calls=[
        {"name": "add", "arguments": {"a": 1}, "id": "call_a"},
        {"name": "mul", "arguments": {}, "id": "call_b"},
    ],
)


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    def answer(request: dict[str, Any]) -> ScriptedReply | str:
        last = request["messages"][-1]
        if any(m["role"] == "tool" for m in request["messages"]):
            return "It is 3."
        if "parallel" in str(last.get("content")):
            return PARALLEL
        if "long" in str(last.get("content")):
            return ScriptedReply(content="cut short", finish_reason="length")
        return "Hello there."

    with ScriptedModelServer(answer) as server:
        yield server


@pytest.fixture
async def proxy(backend: ScriptedModelServer) -> AsyncIterator[tuple[LLMProxy, MemoryStore, str]]:
    store = MemoryStore()
    attempts = await start_attempts(store, ["ro-1"])
    async with LLMProxy(store, [backend.url], token=TOKEN, max_body_bytes=20_000) as running:
        yield running, store, attempts["ro-1"]


def _client(proxy: LLMProxy, aid: str, key: str = TOKEN) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=proxy.base_url("ro-1", aid).removesuffix("/v1"), api_key=key, max_retries=0)


async def _records(proxy: LLMProxy, store: MemoryStore, aid: str) -> list[Any]:
    await proxy.flush()
    return sorted(await store.query_llm_calls("ro-1", aid), key=lambda c: c.start_time)


async def test_parallel_tool_use_round_trip_is_translated_both_ways(
    proxy: tuple[LLMProxy, MemoryStore, str], backend: ScriptedModelServer
) -> None:
    running, store, aid = proxy
    async with _client(running, aid) as client:
        first = await client.messages.create(
            model="toy", max_tokens=64, system=[{"type": "text", "text": "Be brief."}], tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": False},
            messages=[{"role": "user", "content": [{"type": "text", "text": "parallel please"}]}],
            stop_sequences=["###"], extra_body={"temperature": 0.5, "top_p": 0.9},
        )  # fmt: skip
        assert [b.type for b in first.content] == ["text", "tool_use", "tool_use"]
        assert first.content[0].text == "Let me compute."  # type: ignore[union-attr]
        uses = [b for b in first.content if b.type == "tool_use"]
        assert [(u.id, u.name, u.input) for u in uses] == [("call_a", "add", {"a": 1}), ("call_b", "mul", {})]
        assert first.stop_reason == "tool_use" and first.usage.input_tokens > 0 and first.usage.output_tokens > 0
        second = await client.messages.create(
            model="toy", max_tokens=64, tools=TOOLS,
            messages=[
                {"role": "user", "content": "parallel please"},
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_a", "content": "1"},
                    {"type": "tool_result", "tool_use_id": "call_b", "content": [{"type": "text", "text": "0"}]},
                    {"type": "text", "text": "and?"},
                ]},
            ],
        )  # fmt: skip
    assert second.content[0].text == "It is 3." and second.stop_reason == "end_turn"  # type: ignore[union-attr]
    sent = list(backend.requests)
    assert sent[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "parallel please"},
    ]
    assert sent[0]["tool_choice"] == "required" and sent[0]["stop"] == ["###"]
    assert (sent[0]["temperature"], sent[0]["top_p"], sent[0]["max_tokens"]) == (0.5, 0.9, 64)
    assert sent[0]["tools"][0] == {
        "type": "function",
        "function": {"name": "add", "description": "Add.", "parameters": TOOLS[0]["input_schema"]},
    }
    history = sent[1]["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "tool", "user"]
    assert [c["id"] for c in history[1]["tool_calls"]] == ["call_a", "call_b"]
    assert json.loads(history[1]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
    assert [(m["tool_call_id"], m["content"]) for m in history[2:4]] == [("call_a", "1"), ("call_b", "0")]
    records = await _records(running, store, aid)
    assert [r.response_id for r in records] == [first.id, second.id]
    assert all(r.prompt_token_ids and r.response_token_ids for r in records)


async def test_the_stream_is_anthropics_event_sequence(
    proxy: tuple[LLMProxy, MemoryStore, str], backend: ScriptedModelServer
) -> None:
    running, store, aid = proxy
    body = {"model": "toy", "max_tokens": 64, "tools": TOOLS, "stream": True,
            "messages": [{"role": "user", "content": "parallel please"}]}  # fmt: skip
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{running.base_url('ro-1', aid)}/messages", json=body, headers={"x-api-key": TOKEN})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = [block for block in reply.text.split("\n\n") if block.strip()]
    names = [block.split("\n")[0].removeprefix("event: ") for block in events]
    datas = [json.loads(block.split("\n")[1].removeprefix("data: ")) for block in events]
    assert names == [d["type"] for d in datas]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    starts = [d["content_block"]["type"] for d in datas if d["type"] == "content_block_start"]
    assert starts == ["text", "tool_use", "tool_use"]
    stops = [d["index"] for d in datas if d["type"] == "content_block_stop"]
    assert stops == [0, 1, 2]
    assert datas[-2]["delta"]["stop_reason"] == "tool_use" and datas[-2]["usage"]["output_tokens"] > 0
    # the SDK's own accumulator reads the same stream into the same message as the non-streamed answer
    async with _client(running, aid) as client:
        async with client.messages.stream(
            model="toy", max_tokens=64, tools=TOOLS, messages=[{"role": "user", "content": "parallel please"}]
        ) as stream:
            streamed = await stream.get_final_message()
        whole = await client.messages.create(
            model="toy", max_tokens=64, tools=TOOLS, messages=[{"role": "user", "content": "parallel please"}]
        )
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert streamed.stop_reason == whole.stop_reason == "tool_use"
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    records = await _records(running, store, aid)
    assert len(records) == 3 and all(r.response_token_ids and r.error is None for r in records)
    streamed_record, whole_record = records[1].response, records[2].response
    assert streamed_record is not None and whole_record is not None
    assert streamed_record["choices"][0]["message"] == whole_record["choices"][0]["message"]  # recorded the same


async def test_max_tokens_stop_reason(proxy: tuple[LLMProxy, MemoryStore, str]) -> None:
    running, _, aid = proxy
    async with _client(running, aid) as client:
        answer = await client.messages.create(model="toy", max_tokens=3, messages=[{"role": "user", "content": "long"}])
    assert answer.stop_reason == "max_tokens" and answer.content[0].text == "cut short"  # type: ignore[union-attr]


async def test_url_shapes_follow_the_chat_routes_rules(backend: ScriptedModelServer) -> None:
    store = MemoryStore()
    aid = (await start_attempts(store, ["ro-1"]))["ro-1"]
    question: dict[str, Any] = {"model": "toy", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    async with LLMProxy(store, [backend.url], token=TOKEN) as running:
        # plain: refused (not recorded), the message says which base URL to use
        async with AsyncAnthropic(base_url=running.url, api_key=TOKEN, max_retries=0) as plain:
            with pytest.raises(anthropic.BadRequestError, match="removesuffix"):
                await plain.messages.create(**question)
        # a slot that runs no attempt: 401 without the agents' token, 404 with it (never recorded elsewhere)
        slot_url = running.slot_url(SLOT_KEY).removesuffix("/v1")
        slot = AsyncAnthropic(base_url=slot_url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            await slot.messages.create(**question)
        async with AsyncAnthropic(base_url=slot_url, api_key=TOKEN, max_retries=0) as with_token:
            with pytest.raises(anthropic.NotFoundError):
                await with_token.messages.create(**question)
        # registered: the slot's key admits the call whatever the api_key
        async with httpx.AsyncClient() as http:
            auth = {"Authorization": f"Bearer {running.runner_token}"}
            put = await http.put(f"{running.url}/slot/{SLOT_KEY}", json={"rollout_id": "ro-1", "attempt_id": aid},
                                 headers=auth)  # fmt: skip
            assert put.status_code == 200, put.text
            assert (await slot.messages.create(**question)).content[0].text == "Hello there."  # type: ignore[union-attr]
            # the attempt ended: a late call is refused with 409, before the backend, and not recorded
            ended = {"slots": {}, "ended": [{"rollout_id": "ro-1", "attempt_id": aid, "slot": SLOT_KEY}]}
            assert (await http.put(f"{running.url}/slots", json=ended, headers=auth)).status_code == 200
        forwarded = len(backend.requests)
        with pytest.raises(anthropic.ConflictError, match="already ended"):
            await slot.messages.create(**question)
        with pytest.raises(anthropic.ConflictError):
            await _client(running, aid).messages.create(**question)  # the per-rollout URL too
        await slot.close()
        assert len(backend.requests) == forwarded and running.late_calls == 2
        await running.flush()
        assert len(await store.query_llm_calls("ro-1", aid)) == 1


async def test_a_body_over_the_limit_is_refused_and_the_proxy_stays_healthy(
    proxy: tuple[LLMProxy, MemoryStore, str],
) -> None:
    running, store, aid = proxy
    async with _client(running, aid) as client:
        with pytest.raises(anthropic.APIStatusError) as refused:
            await client.messages.create(
                model="toy", max_tokens=8, messages=[{"role": "user", "content": "x" * 30_000}]
            )
        assert refused.value.status_code == 413
        assert await client.messages.create(model="toy", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert len(await _records(running, store, aid)) == 1


class _CutStream:
    """An in-process chat backend whose stream breaks after its first chunk (a backend that died mid-answer)."""

    async def request(self, method: str, path: str, body: bytes) -> InProcessReply:
        async def chunks() -> AsyncIterator[bytes]:
            head = {"id": "chatcmpl-cut", "model": "toy", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}
            yield b"data: " + json.dumps(head).encode() + b"\n\n"
            raise BackendLost("the backend died")

        return InProcessReply(200, {"content-type": "text/event-stream"}, chunks())


async def test_a_stream_cut_midway_ends_with_an_error_the_sdk_raises() -> None:
    store = MemoryStore()
    aid = (await start_attempts(store, ["ro-1"]))["ro-1"]
    url = register_backend(_CutStream())
    try:
        async with LLMProxy(store, [url]) as running, _client(running, aid) as client:
            with pytest.raises(anthropic.APIStatusError, match="ended before the answer was complete"):
                async with client.messages.stream(
                    model="toy", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                ) as stream:
                    await stream.get_final_message()
            await running.flush()
            (record,) = await store.query_llm_calls("ro-1", aid)
            assert record.error is not None and "broke" in record.error  # recorded as a failed call, never trained
    finally:
        unregister_backend(url)


async def test_count_tokens_without_tokenize_names_why(proxy: tuple[LLMProxy, MemoryStore, str]) -> None:
    running, _, aid = proxy
    async with _client(running, aid) as client:
        with pytest.raises(anthropic.BadRequestError, match="/tokenize"):
            await client.messages.count_tokens(model="toy", messages=[{"role": "user", "content": "hi"}])


class _Reasoner:
    """An in-process chat backend whose model reasons first (``reasoning_content``, as vLLM's reasoning parsers and the
    embedded backend send it), then answers; it keeps the requests it got."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, body: bytes) -> InProcessReply:
        request = json.loads(body)
        self.requests.append(request)
        head = {"id": "chatcmpl-r", "model": "toy", "prompt_token_ids": [1, 2]}
        if not request.get("stream"):
            message = {"role": "assistant", "reasoning_content": "2 and 2 make 4.", "content": "4"}
            choice = {"index": 0, "message": message, "finish_reason": "stop", "token_ids": [7, 8, 9]}
            answer = {**head, "choices": [choice], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
            return InProcessReply(200, {"content-type": "application/json"}, None, answer)

        async def chunks() -> AsyncIterator[bytes]:
            deltas = [({"reasoning_content": "2 and 2 "}, None), ({"reasoning_content": "make 4."}, None),
                      ({"content": "4"}, "stop")]  # fmt: skip
            for index, (delta, finish) in enumerate(deltas):
                choice = {"index": 0, "delta": delta, "finish_reason": finish, "token_ids": [7 + index]}
                yield b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"
            usage = {**head, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
            yield b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"

        return InProcessReply(200, {"content-type": "text/event-stream"}, chunks())


async def test_thinking_is_kept_as_the_model_produced_it_and_tool_choice_is_translated() -> None:
    store = MemoryStore()
    aid = (await start_attempts(store, ["ro-1"]))["ro-1"]
    reasoner = _Reasoner()
    url = register_backend(reasoner)
    question: list[Any] = [{"role": "user", "content": "2+2?"}]
    try:
        async with LLMProxy(store, [url]) as running, _client(running, aid) as client:
            whole = await client.messages.create(
                model="toy", max_tokens=8, messages=question, tools=TOOLS, tool_choice={"type": "tool", "name": "add"}
            )
            async with client.messages.stream(
                model="toy",
                max_tokens=8,
                messages=question,
                tools=TOOLS,
                tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            ) as stream:
                streamed = await stream.get_final_message()
            # the thinking block goes back into the conversation as the model's reasoning
            await client.messages.create(
                model="toy", max_tokens=8, tools=TOOLS, tool_choice={"type": "none"},
                messages=[*question, {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
                          {"role": "user", "content": "sure?"}],
            )  # fmt: skip
            await running.flush()
            assert len(await store.query_llm_calls("ro-1", aid)) == 3
    finally:
        unregister_backend(url)
    for answer in (whole, streamed):
        assert [b.type for b in answer.content] == ["thinking", "text"]
        assert answer.content[0].thinking == "2 and 2 make 4."  # type: ignore[union-attr]
        assert answer.content[1].text == "4" and answer.stop_reason == "end_turn"  # type: ignore[union-attr]
        assert (answer.usage.input_tokens, answer.usage.output_tokens) == (2, 3)
    first, second, third = reasoner.requests
    assert first["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert (second["tool_choice"], second["parallel_tool_calls"]) == ("auto", False)
    assert third["tool_choice"] == "none"
    assert third["messages"][1] == {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4."}
