"""The LLM proxy calling the local backend in-process answers and records exactly as it does over HTTP.

One `LocalBackend` is served both ways at once: by its HTTP server, and registered in-process
(`agentlightning.proxy.register_backend`). Two LLM proxies on one store forward to it, one each way; agents call the
proxies over real HTTP. Every exchange must give the agent the same status, headers and body bytes (ids and
timestamps aside) and store the same `LLMCall` (token ids, logprobs, model version, error).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from agentlightning import LLMCall, MemoryStore
from agentlightning.proxy import (
    IN_PROCESS_SCHEME,
    LLMProxy,
    register_backend,
    registered_backend,
    unregister_backend,
)
from agentlightning.testing import start_attempts
from agentlightning_torch import LocalBackend, OpenAIEndpoint, serve_backend

USER = [{"role": "user", "content": "Q:2*3+4="}]
CALCULATOR_TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
HEADERS = ("content-type", "content-length", "retry-after", "x-agentlightning-model-version")
# what differs between any two answers: response and tool-call ids, creation times
_VARYING = re.compile(rb'"(chatcmpl-|cmpl-|call_)[0-9A-Za-z]+"|(?<="created":)\s*\d+')


def _same(body: bytes) -> bytes:
    """``body`` with ids and creation times blanked (they differ between any two answers)."""
    return _VARYING.sub(lambda m: b'"<id>"' if m.group(0).startswith(b'"') else b"0", body)


@dataclass
class Side:
    """One way to the backend: its proxy, the rollout its calls are recorded under, and an agent's HTTP client."""

    proxy: LLMProxy
    rollout: str
    client: httpx.AsyncClient


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@pytest.fixture
async def sides(
    calc_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> AsyncIterator[tuple[Side, Side, LocalBackend, MemoryStore]]:
    backend = LocalBackend(calc_model, tokenizer, batch_wait_ms=1.0, model_name="tiny-calc")
    server = serve_backend(backend)
    in_process = register_backend(OpenAIEndpoint(backend))
    assert in_process.startswith(IN_PROCESS_SCHEME)
    store = MemoryStore()
    attempts = await start_attempts(store, ["ro-http", "ro-local"])
    made: list[Side] = []
    try:
        for url, rollout in ((server.url, "ro-http"), (in_process, "ro-local")):
            proxy = await LLMProxy(store, [url], model_version=0).start()
            client = httpx.AsyncClient(base_url=proxy.base_url(rollout, attempts[rollout]), timeout=60)
            made.append(Side(proxy, rollout, client))
        yield made[0], made[1], backend, store
    finally:
        for side in made:
            await side.client.aclose()
            await side.proxy.stop()
        unregister_backend(in_process)
        server.stop()


async def _ask(side: Side, body: dict[str, Any], path: str = "/chat/completions") -> Answer:
    if path == "/models":
        reply = await side.client.get(path)
    else:
        reply = await side.client.post(path, json={"model": "tiny-calc", **body})
    headers = {name: reply.headers[name] for name in HEADERS if name in reply.headers}
    return Answer(reply.status_code, headers, _same(reply.content))


async def _both(http: Side, local: Side, body: dict[str, Any], path: str = "/chat/completions") -> Answer:
    """Ask both ways; the agent sees the same answer (returned)."""
    over_http, in_process = await _ask(http, body, path), await _ask(local, body, path)
    assert in_process == over_http
    return in_process


def _row(call: LLMCall) -> tuple[Any, ...]:
    response = json.loads(_same(json.dumps(call.response).encode())) if call.response else None
    return (
        call.request,
        response,
        call.prompt_token_ids,
        call.response_token_ids,
        call.response_logprobs,
        call.model_version,
        call.error,
    )


async def _records(store: MemoryStore, http: Side, local: Side) -> list[tuple[Any, ...]]:
    """The calls each side recorded, which must be the same (returned)."""
    for side in (http, local):
        await side.proxy.flush()
    over_http = [_row(c) for c in await store.query_llm_calls(http.rollout)]
    in_process = [_row(c) for c in await store.query_llm_calls(local.rollout)]
    assert in_process == over_http
    return in_process


async def test_completions_streams_and_tool_calls_are_answered_and_recorded_alike(
    sides: tuple[Side, Side, LocalBackend, MemoryStore],
) -> None:
    http, local, _backend, store = sides
    plain = await _both(http, local, {"messages": USER, "temperature": 0.0, "max_tokens": 20, "logprobs": True})
    assert plain.status == 200 and plain.headers["x-agentlightning-model-version"] == "0"
    assert json.loads(plain.body)["choices"][0]["message"]["content"] == "CALC(2*3+4)"
    tool = await _both(http, local, {"messages": USER, "tools": [CALCULATOR_TOOL], "temperature": 0.0})
    assert json.loads(tool.body)["choices"][0]["finish_reason"] == "tool_calls"
    stream_options = {"include_usage": True}
    for tools in ([], [CALCULATOR_TOOL]):
        body = {"messages": USER, "temperature": 0.0, "stream": True, "stream_options": stream_options}
        streamed = await _both(http, local, {**body, "tools": tools} if tools else body)
        assert streamed.status == 200 and streamed.headers["content-type"].startswith("text/event-stream")
        assert streamed.body.endswith(b"data: [DONE]\n\n")
    completion = await _both(
        http, local, {"prompt": "<bos>Q:2*3+4=\n", "temperature": 0.0, "max_tokens": 20}, "/completions"
    )
    assert json.loads(completion.body)["choices"][0]["text"] == "CALC(2*3+4)"
    models = await _both(http, local, {}, "/models")
    assert [m["id"] for m in json.loads(models.body)["data"]] == ["tiny-calc"]
    rows = await _records(store, http, local)
    assert len(rows) == 5 and all(row[2] and row[3] and row[5] == 0 and row[6] is None for row in rows)


async def test_a_refused_prompt_is_answered_and_recorded_alike(
    sides: tuple[Side, Side, LocalBackend, MemoryStore],
) -> None:
    http, local, _backend, store = sides
    too_long = [{"role": "user", "content": "Q:" + "1+" * 80 + "1="}]  # past the model's 128-token context
    refused = await _both(http, local, {"messages": too_long, "max_tokens": 8})
    assert refused.status == 400 and "context" in json.loads(refused.body)["error"]["message"]
    unknown = await _both(http, local, {"messages": USER, "temperature": -1})
    assert unknown.status == 400 and "temperature" in json.loads(unknown.body)["error"]["message"]
    rows = await _records(store, http, local)
    assert [row[6] is not None and row[6].startswith("backend HTTP 400") for row in rows] == [True, True]


async def test_a_weight_sync_between_pause_and_resume_is_seen_alike(
    sides: tuple[Side, Side, LocalBackend, MemoryStore],
    make_small_model: Callable[..., PreTrainedModel],
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    http, local, backend, store = sides
    ask = {"messages": USER, "temperature": 0.0, "max_tokens": 6}
    before = await _both(http, local, ask)
    for side in (http, local):
        await side.proxy.pause()
    paused = await _both(http, local, ask)
    assert paused.status == 503 and paused.headers["retry-after"] == "1"
    backend.update_weights(make_small_model(tokenizer, seed=99), version=1)
    for side in (http, local):
        side.proxy.resume(model_version=1)
    after = await _both(http, local, {**ask, "stream": True})
    assert after.status == 200 and b'"model_version":1' in after.body.replace(b" ", b"")
    assert before.headers["x-agentlightning-model-version"] == "0"
    assert [row[5] for row in await _records(store, http, local)] == [0, 1]


async def test_a_backend_no_longer_registered_is_unreachable(
    sides: tuple[Side, Side, LocalBackend, MemoryStore],
) -> None:
    _http, local, _backend, store = sides
    [url] = local.proxy.backends
    unregister_backend(url)
    gone = await _ask(local, {"messages": USER, "max_tokens": 4})
    assert gone.status == 502 and f"no in-process backend is registered as {url}" in gone.body.decode()
    await local.proxy.flush()
    [call] = await store.query_llm_calls(local.rollout)
    assert call.error is not None and "could not reach backend" in call.error


async def test_an_answer_is_handed_over_unrendered_and_reads_back_as_the_http_servers_bytes(
    sides: tuple[Side, Side, LocalBackend, MemoryStore],
) -> None:
    http, local, _backend, _store = sides
    endpoint = registered_backend(local.proxy.backends[0])
    asks = [
        ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 3, "return_token_ids": True}),
        ("/v1/chat/completions", {"messages": USER, "tools": [CALCULATOR_TOOL]}),
        ("/v1/completions", {"prompt": "<bos>Q:2*3+4=\n", "logprobs": 2, "return_token_ids": True}),
    ]
    async with httpx.AsyncClient(base_url=http.proxy.backends[0], timeout=60) as server:
        for path, ask in asks:
            raw = json.dumps({"model": "tiny-calc", "temperature": 0.0, "max_tokens": 12, **ask}).encode()
            reply = await endpoint.request("POST", path, raw)
            assert reply.status == 200 and reply.content_type == "application/json"
            parsed = reply.parsed
            assert isinstance(parsed, dict) and parsed["choices"]  # handed over as its value
            body = await reply.read()  # rendered on demand
            assert json.loads(body) == parsed
            sent = await server.post(path, content=raw, headers={"content-type": "application/json"})
            assert sent.status_code == 200 and _same(body) == _same(sent.content)
            assert reply.header("x-agentlightning-model-version") == sent.headers["x-agentlightning-model-version"]


async def test_a_logprob_json_cannot_carry_is_a_server_error_both_ways(
    sides: tuple[Side, Side, LocalBackend, MemoryStore],
) -> None:
    """Starlette refuses NaN and infinities (orjson would write ``null``): the answer is a 500, not a silent null."""
    http, local, backend, store = sides

    def only_four_tokens(_module: torch.nn.Module, _inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_fill(-1, torch.arange(4, logits.shape[-1]), float("-inf"))  # logprob -inf beyond

    head = backend.model.get_output_embeddings()
    assert isinstance(head, torch.nn.Module)
    hook = head.register_forward_hook(only_four_tokens)
    try:
        ask = {"messages": USER, "temperature": 0.0, "max_tokens": 2, "logprobs": True}
        shown = await _both(http, local, {**ask, "top_logprobs": 5})  # the fifth most likely has logprob -inf
        assert shown.status == 500 and b"NaN or infinite logprob" in shown.body  # the connection stays open
        assert (await _both(http, local, {**ask, "top_logprobs": 4})).status == 200  # all finite
    finally:
        hook.remove()
    rows = await _records(store, http, local)
    assert [row[6] is not None and row[6].startswith("backend HTTP 500") for row in rows] == [True, False]
