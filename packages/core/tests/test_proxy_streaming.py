"""Streaming through the LLM proxy: chunks pass through, the assembled call is recorded with exact ids."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from agentlightning.proxy import LLMProxy
from agentlightning.proxy._assemble import SSEParser, StreamAssembler, extract
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, ScriptedReply, start_attempts


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(stream_chunk_chars=3) as server:
        yield server


ATTEMPT: dict[str, str] = {}  # the store refuses records of attempts it never started: "ro-s" is started first


@pytest.fixture
def store() -> MemoryStore:
    memory = MemoryStore()
    ATTEMPT.clear()
    ATTEMPT.update(asyncio.run(start_attempts(memory, ["ro-s"])))
    return memory


@pytest.fixture
async def proxy(store: MemoryStore, backend: ScriptedModelServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(store, [backend.url]) as running:
        yield running


def agent(proxy: LLMProxy) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proxy.base_url("ro-s", ATTEMPT["ro-s"]), api_key="k", max_retries=0)


async def test_streamed_chat_passes_chunks_and_records_exact_ids(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    backend.set_script(["a fairly long streamed reply, ünïcode too"])
    stream = await agent(proxy).chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "go"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "a fairly long streamed reply, ünïcode too"
    assert len(chunks) > 10  # streamed in pieces, not buffered into one
    [call] = await store.query_llm_calls("ro-s")
    served = backend.served[0]
    assert call.prompt_token_ids == served.prompt_token_ids
    assert call.response_token_ids == served.token_ids
    assert call.response_logprobs == served.logprobs
    assert call.response_id == chunks[0].id == served.response_id
    assert call.error is None and call.request["stream"] is True
    assert call.response is not None
    assert call.response["choices"][0]["message"]["content"] == text
    assert call.response["choices"][0]["finish_reason"] == "stop"
    assert call.response["usage"]["completion_tokens"] == len(served.token_ids)


async def test_streamed_tool_calls_are_assembled(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    calls = [
        {"name": "search", "arguments": {"query": "weather in Paris tomorrow"}, "id": "call_a"},
        {"name": "clock", "arguments": {}, "id": "call_b"},
    ]
    backend.set_script([ScriptedReply(content="checking", tool_calls=calls)])
    stream = await agent(proxy).chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "weather?"}], stream=True
    )
    args: dict[int, str] = {}
    async for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or []:
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")  # type: ignore[union-attr]
    assert {i: json.loads(a) for i, a in args.items()} == {0: calls[0]["arguments"], 1: {}}
    [call] = await store.query_llm_calls("ro-s")
    assert call.response_token_ids == backend.served[0].token_ids
    assert call.response is not None
    message = call.response["choices"][0]["message"]
    assert message["content"] == "checking"
    assert [
        (t["id"], t["function"]["name"], json.loads(t["function"]["arguments"])) for t in message["tool_calls"]
    ] == [
        ("call_a", "search", calls[0]["arguments"]),
        ("call_b", "clock", {}),
    ]
    assert call.response["choices"][0]["finish_reason"] == "tool_calls"


async def test_streamed_completion_is_recorded(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    backend.set_script(["completion text streamed"])
    stream = await agent(proxy).completions.create(model="toy", prompt="say it", stream=True)
    text = "".join([c.choices[0].text async for c in stream])
    assert text == "completion text streamed"
    [call] = await store.query_llm_calls("ro-s")
    assert call.prompt_token_ids == backend.served[0].prompt_token_ids
    assert call.response_token_ids == backend.served[0].token_ids
    assert call.response_logprobs == backend.served[0].logprobs
    assert call.response is not None and call.response["choices"][0]["text"] == text


async def test_stream_request_that_fails_at_the_backend_returns_its_status(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    backend.fail_next(1, status=503, message="overloaded")
    with pytest.raises(openai.APIStatusError, match="overloaded") as info:
        await agent(proxy).chat.completions.create(
            model="toy", messages=[{"role": "user", "content": "x"}], stream=True
        )
    assert info.value.status_code == 503
    [call] = await store.query_llm_calls("ro-s")
    assert call.error is not None and "503" in call.error


@pytest.mark.parametrize("asks_for_ids", [False, True])
async def test_the_agent_streams_what_the_backend_answers_its_own_request(
    proxy: LLMProxy, backend: ScriptedModelServer, store: MemoryStore, asks_for_ids: bool
) -> None:
    backend.set_script(["same bytes", "same bytes"])
    body: dict[str, Any] = {"model": "toy", "messages": [{"role": "user", "content": "x"}], "stream": True}
    if asks_for_ids:
        body |= {"return_token_ids": True, "logprobs": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url('ro-s', ATTEMPT['ro-s'])}/chat/completions", json=body) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            through_proxy = await resp.read()
        # the proxy asked for token ids and logprobs on its own account; the agent gets neither unless it asked
        assert backend.requests[0]["return_token_ids"] is True and backend.requests[0]["logprobs"] is True
        async with http.post(f"{backend.base_url}/chat/completions", json=body) as resp:
            direct = await resp.read()
    assert through_proxy.endswith(b"data: [DONE]\n\n")
    [call] = await store.query_llm_calls("ro-s")  # the record has them either way
    assert call.prompt_token_ids and call.response_token_ids and call.response_logprobs
    proxied_events = [json.loads(e[6:]) for e in through_proxy.split(b"\n\n") if e.startswith(b"data: {")]
    direct_events = [json.loads(e[6:]) for e in direct.split(b"\n\n") if e.startswith(b"data: {")]
    for event in proxied_events + direct_events:  # ids and timestamps differ between the two requests
        event.pop("id")
        event.pop("created")
    assert proxied_events == direct_events
    choices = [c for event in proxied_events for c in event["choices"]]
    assert any("token_ids" in c for c in choices) is asks_for_ids
    assert any(c.get("logprobs") is not None for c in choices) is asks_for_ids


def test_sse_parser_handles_arbitrary_chunk_boundaries_and_crlf() -> None:
    stream = b'data: {"a": 1}\n\n: comment\n\ndata: {"b":\r\ndata: 2}\r\n\r\ndata: [DONE]\n\n'
    parser = SSEParser()
    events: list[tuple[bytes, str | None]] = []
    for i in range(len(stream)):
        events.extend(parser.feed(stream[i : i + 1]))
    assert b"".join(raw for raw, _ in events) == stream
    assert [data for _, data in events] == ['{"a": 1}', None, '{"b":\n2}', "[DONE]"]
    assert parser.rest() == b""


def test_assembler_and_extract_accept_ids_inside_the_choice() -> None:
    chunks: list[dict[str, Any]] = [
        {
            "id": "x",
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant"}, "prompt_token_ids": [1, 2]}],
        },
        {"id": "x", "choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [7, 8]}]},
        {"id": "x", "choices": [{"index": 0, "delta": {}, "token_ids": [9], "finish_reason": "stop"}]},
    ]
    assembler = StreamAssembler("chat")
    for chunk in chunks:
        assembler.feed(chunk)
    got = assembler.extracted()
    assert (got.prompt_token_ids, got.response_token_ids, got.response_logprobs) == ([1, 2], [7, 8, 9], None)
    full = {"choices": [{"prompt_token_ids": [3], "token_ids": [4, 5], "logprobs": {"content": [{"logprob": -1.0}]}}]}
    found = extract(full, "chat")
    assert found.prompt_token_ids == [3] and found.response_token_ids == [4, 5]
    assert found.response_logprobs is None and found.note is not None and "do not match" in found.note


def test_assembler_records_choice_zero_of_interleaved_n_choices() -> None:
    """vLLM streams ``n > 1`` as chunks of one choice each (by ``index``): only choice 0's ids and text count."""

    def chunk(index: int, text: str, ids: list[int], finish: str | None = None) -> dict[str, Any]:
        entries = [{"token": str(i), "logprob": -0.5 * i} for i in ids]
        choice = {"index": index, "delta": {"content": text}, "token_ids": ids, "logprobs": {"content": entries}}
        return {"id": "x", "choices": [{**choice, "finish_reason": finish}]}

    assembler = StreamAssembler("chat")
    assembler.feed({"id": "x", "prompt_token_ids": [1, 2], "choices": []})
    for piece in (chunk(0, "a", [10]), chunk(1, "b", [20]), chunk(1, "c", [21], "length"), chunk(0, "d", [11], "stop")):
        assembler.feed(piece)
    got = assembler.extracted()
    assert (got.prompt_token_ids, got.response_token_ids, got.response_logprobs) == ([1, 2], [10, 11], [-5.0, -5.5])
    response = assembler.response()
    assert response["choices"][0]["message"]["content"] == "ad" and response["choices"][0]["finish_reason"] == "stop"
