"""The LLM proxy over real loopback HTTP: recorded token ids, routing, errors, pause/resume, admin routes."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from agentlightning import LLMCall, LLMResource, Resources
from agentlightning.proxy import CALL_ID_HEADER, LLMProxy, create_proxy_app
from agentlightning.store import MemoryStore, SqliteStore
from agentlightning.testing import ScriptedModelServer, ScriptedReply, ToyTokenizer, start_attempts

TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
    }
]


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


# The store refuses records of attempts it never started: every rollout id the tests call under is started first.
ROLLOUT_IDS = ["ro-1", "ro-t", *(f"ro-{i}" for i in range(16))]
ATTEMPT: dict[str, str] = {}  # rollout id -> its attempt id in the current test's store


@pytest.fixture
def store() -> MemoryStore:
    memory = MemoryStore()
    ATTEMPT.clear()
    ATTEMPT.update(asyncio.run(start_attempts(memory, ROLLOUT_IDS)))
    return memory


@pytest.fixture
async def proxy(store: MemoryStore, backend: ScriptedModelServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(store, [backend.url]) as running:
        yield running


def agent(proxy: LLMProxy, rollout_id: str = "ro-1") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proxy.base_url(rollout_id, ATTEMPT[rollout_id]), api_key="k", max_retries=0)


async def test_chat_call_is_recorded_with_the_backends_exact_ids(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    messages = [{"role": "system", "content": "terse"}, {"role": "user", "content": "hello"}]
    raw = await agent(proxy).chat.completions.with_raw_response.create(model="toy", messages=messages)  # type: ignore[arg-type]
    out = raw.parse()
    assert out.choices[0].message.content == "hello"
    [call] = await store.query_llm_calls("ro-1")
    served = backend.served[0]
    assert call.prompt_token_ids == served.prompt_token_ids and call.prompt_token_ids
    assert call.response_token_ids == served.token_ids and call.response_token_ids
    assert call.response_logprobs == served.logprobs
    assert call.response_id == out.id == served.response_id
    assert call.call_id == raw.headers[CALL_ID_HEADER]
    assert call.attempt_id == ATTEMPT["ro-1"] and call.backend == backend.url and call.error is None
    # the record keeps the agent's request; the backend got the token-id options added
    assert call.request == {"model": "toy", "messages": messages}
    assert backend.requests[0]["return_token_ids"] is True and backend.requests[0]["logprobs"] is True
    assert call.response is not None and "prompt_token_ids" not in call.response
    assert call.end_time is not None and call.end_time >= call.start_time


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("asks", [False, True])
async def test_the_agent_gets_token_ids_and_logprobs_only_when_it_asks_for_them(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer, kind: str, asks: bool
) -> None:
    """The proxy asks the backend for ids and logprobs to record them; the agent's answer is what it asked for."""
    options: dict[str, object] = {"return_token_ids": True, "logprobs": True if kind == "chat" else 1} if asks else {}
    client = agent(proxy)
    if kind == "chat":
        raw = await client.chat.completions.with_raw_response.create(
            model="toy", messages=[{"role": "user", "content": "hello"}], extra_body=options
        )
    else:
        raw = await client.completions.with_raw_response.create(model="toy", prompt="2+2=", extra_body=options)
    answer = json.loads(raw.content)
    [choice] = answer["choices"]
    assert ("prompt_token_ids" in answer, "token_ids" in choice) == (asks, asks)
    assert (choice["logprobs"] is not None) is asks
    [served] = backend.served
    if asks:  # exactly what the backend sent
        assert answer["prompt_token_ids"] == served.prompt_token_ids and choice["token_ids"] == served.token_ids
    [call] = await store.query_llm_calls("ro-1")  # recorded in full either way
    assert (call.prompt_token_ids, call.response_token_ids) == (served.prompt_token_ids, served.token_ids)
    assert call.response_logprobs == served.logprobs and call.response_logprobs


async def test_tool_calls_pass_through_unchanged(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    backend.set_script([ScriptedReply(tool_calls=[{"name": "lookup", "arguments": {"q": "paris"}, "id": "call_7"}])])
    out = await agent(proxy).chat.completions.create(
        model="toy",
        messages=[{"role": "user", "content": "where?"}],
        tools=TOOLS,  # type: ignore[arg-type]
    )
    [tool_call] = out.choices[0].message.tool_calls or []
    assert tool_call.id == "call_7" and tool_call.function.name == "lookup"  # type: ignore[union-attr]
    assert json.loads(tool_call.function.arguments) == {"q": "paris"}  # type: ignore[union-attr]
    [call] = await store.query_llm_calls("ro-1")
    assert call.response_token_ids == backend.served[0].token_ids
    assert call.request["tools"] == TOOLS
    assert call.response is not None and call.response["choices"][0]["message"]["tool_calls"][0]["id"] == "call_7"


async def test_completions_endpoint_is_recorded(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    out = await agent(proxy).completions.create(model="toy", prompt="2+2=")
    assert out.choices[0].text == "2+2="
    [call] = await store.query_llm_calls("ro-1")
    assert backend.requests[0]["logprobs"] == 1
    assert call.prompt_token_ids == backend.served[0].prompt_token_ids
    assert call.response_token_ids == backend.served[0].token_ids
    assert call.response_logprobs == backend.served[0].logprobs


async def test_sixteen_concurrent_rollouts_are_recorded_under_their_own_rollout(
    proxy: LLMProxy, store: MemoryStore
) -> None:
    async def rollout(i: int) -> None:
        client = agent(proxy, f"ro-{i}")
        for turn in range(3):
            await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": f"r{i} t{turn}"}])

    await asyncio.gather(*(rollout(i) for i in range(16)))
    for i in range(16):
        calls = await store.query_llm_calls(f"ro-{i}")
        assert len(calls) == 3
        for call in calls:
            assert call.attempt_id == ATTEMPT[f"ro-{i}"]
            assert call.response is not None
            text = call.response["choices"][0]["message"]["content"]
            assert text.startswith(f"r{i} t")
            assert call.response_token_ids == ToyTokenizer().encode(text)


async def test_backend_error_status_and_body_reach_the_agent_and_are_recorded(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    backend.fail_next(1, status=500, message="GPU on fire")
    with pytest.raises(openai.InternalServerError, match="GPU on fire") as info:
        await agent(proxy).chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 500
    backend.fail_next(1, status=429)
    with pytest.raises(openai.RateLimitError):
        await agent(proxy).chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}])
    calls = await store.query_llm_calls("ro-1")
    assert [c.error is not None for c in calls] == [True, True]
    assert calls[0].error is not None and "500" in calls[0].error and "GPU on fire" in calls[0].error
    assert calls[0].response_token_ids == [] and calls[0].request["messages"][0]["content"] == "x"


async def test_unreachable_backend_gives_502_and_is_recorded(store: MemoryStore) -> None:
    async with LLMProxy(store, ["http://127.0.0.1:9"]) as proxy:
        with pytest.raises(openai.APIStatusError) as info:
            await agent(proxy).chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502
    [call] = await store.query_llm_calls("ro-1")
    assert call.error is not None and "127.0.0.1:9" in call.error


async def test_backend_without_token_ids_is_recorded_empty_with_a_warning_naming_it(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    with ScriptedModelServer(emit_token_ids=False) as plain:
        url = plain.url
        async with LLMProxy(store, [plain.url]) as proxy:
            with caplog.at_level(logging.WARNING, logger="agentlightning.proxy"):
                await agent(proxy).chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}])
    [call] = await store.query_llm_calls("ro-1")
    assert call.prompt_token_ids == [] and call.response_token_ids == [] and call.response_logprobs is None
    assert call.error is None
    assert any(url in r.getMessage() and "no token ids" in r.getMessage() for r in caplog.records)


async def test_plain_v1_is_refused_unless_unrecorded_calls_are_allowed(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    async with LLMProxy(store, [backend.url]) as proxy:
        plain = AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="/rollout/"):
            await plain.chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}])
        assert [m.id async for m in plain.models.list()] == ["toy-model"]
    async with LLMProxy(store, [backend.url], allow_unrecorded=True) as proxy:
        plain = AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        out = await plain.chat.completions.create(model="toy", messages=[{"role": "user", "content": "free"}])
        assert out.choices[0].message.content == "free"
        assert "return_token_ids" not in backend.requests[-1]
    assert (await store.stats()).llm_calls == 0


async def _raw_chat(proxy: LLMProxy) -> tuple[int, dict[str, str], str]:
    """POST one chat request for ``ro-1`` without a client's retries: status, headers and the error message."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{proxy.base_url('ro-1', ATTEMPT['ro-1'])}/chat/completions",
            json={"model": "toy", "messages": [{"role": "user", "content": "x"}]},
        ) as resp,
    ):
        body = await resp.json()
        return resp.status, dict(resp.headers), str(body.get("error", {}).get("message", ""))


async def test_pause_refuses_new_requests_drains_in_flight_and_resume_readmits(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    backend.latency = 0.5
    async with LLMProxy(store, [backend.url], retry_after=3) as proxy:
        client = agent(proxy)
        in_flight = asyncio.create_task(
            client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "slow"}])
        )
        while not backend.requests:  # the request has reached the backend
            await asyncio.sleep(0.01)
        assert proxy.in_flight == 1
        await proxy.pause()
        # drained: the backend has answered and the call is recorded before pause() returns
        assert proxy.in_flight == 0 and len(backend.served) == 1
        assert len(await store.query_llm_calls("ro-1")) == 1
        assert (await in_flight).choices[0].message.content == "slow"
        backend.latency = 0.0
        status, headers, message = await _raw_chat(proxy)
        assert status == 503 and headers["Retry-After"] == "3" and "paused" in message
        proxy.resume(model_version=7)
        await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "after"}])
    calls = await store.query_llm_calls("ro-1")
    assert [c.response["choices"][0]["message"]["content"] for c in calls if c.response] == ["slow", "after"]
    assert calls[-1].model_version == 7


async def test_a_pause_with_a_hold_keeps_new_requests_until_resume_and_refuses_them_once_the_hold_is_over(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    async with LLMProxy(store, [backend.url], model_version=3) as proxy:
        client = agent(proxy)
        await proxy.pause(hold_s=3600)
        held = asyncio.create_task(
            client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "held"}])
        )
        while proxy.held == 0:  # the request has arrived and waits for the resume
            await asyncio.sleep(0.01)
        assert not held.done() and not backend.requests and proxy.in_flight == 0
        proxy.resume(model_version=4)  # e.g. after a weight sync: the held call is served by the new version
        assert (await held).choices[0].message.content == "held"
        assert proxy.held == 0
        # a hold that ends while the proxy is still paused: the request gets the 503 a plain pause gives at once
        await proxy.pause(hold_s=0.05)
        status, _, message = await _raw_chat(proxy)
        assert status == 503 and "paused" in message
        proxy.resume()
    calls = await store.query_llm_calls("ro-1")
    assert [(c.response["choices"][0]["message"]["content"], c.model_version) for c in calls if c.response] == [
        ("held", 4)
    ]


async def test_pause_timeout_says_how_many_are_still_in_flight(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    backend.latency = 1.0
    async with LLMProxy(store, [backend.url]) as proxy:
        task = asyncio.create_task(agent(proxy).completions.create(model="toy", prompt="p"))
        while not backend.requests:
            await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError, match="1 request"):
            await proxy.pause(timeout=0.05)
        assert proxy.paused
        await task
        proxy.resume()


async def test_admin_routes_need_the_token_and_control_the_proxy(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    async with LLMProxy(store, [backend.url], admin_token="s3cret") as proxy, aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/admin/pause") as resp:
            assert resp.status == 401
        assert not proxy.paused
        auth = {"Authorization": "Bearer s3cret"}
        async with http.post(f"{proxy.url}/admin/pause", headers=auth) as resp:
            assert resp.status == 200 and (await resp.json())["paused"] is True
        assert proxy.paused
        async with http.post(f"{proxy.url}/admin/resume", headers=auth, json={"model_version": -1}) as resp:
            assert resp.status == 400 and "model_version" in (await resp.json())["error"]["message"]
        assert proxy.paused  # a bad request changes nothing
        async with http.post(f"{proxy.url}/admin/resume", headers=auth, json={"model_version": 4}) as resp:
            assert resp.status == 200 and (await resp.json()) == {
                "paused": False,
                "in_flight": 0,
                "backends": [backend.url],
                "model_version": 4,
                "resent": 0,
                "slots": 0,
                "late_calls": 0,
            }
        async with http.post(f"{proxy.url}/admin/backends", headers=auth, json={"backends": ["ftp://x"]}) as resp:
            assert resp.status == 400 and "http://" in (await resp.json())["error"]["message"]
        async with http.post(f"{proxy.url}/admin/model_version", headers=auth, json={"model_version": 5}) as resp:
            assert resp.status == 200
        await agent(proxy).chat.completions.create(model="toy", messages=[{"role": "user", "content": "v"}])
    [call] = await store.query_llm_calls("ro-1")
    assert call.model_version == 5


async def test_rollouts_stick_to_one_backend_and_move_when_it_is_removed(store: MemoryStore) -> None:
    with ScriptedModelServer() as b1, ScriptedModelServer() as b2:
        async with LLMProxy(store, [b1.url, b2.url]) as proxy:
            for i in range(4):
                for _ in range(3):
                    await agent(proxy, f"ro-{i}").completions.create(model="toy", prompt=f"{i}")
            for i in range(4):
                backends = {c.backend for c in await store.query_llm_calls(f"ro-{i}")}
                assert len(backends) == 1
            assert len(b1.served) == 6 and len(b2.served) == 6
            moved = (await store.query_llm_calls("ro-0"))[0].backend
            remaining = b2.url if moved == b1.url else b1.url
            proxy.set_backends([remaining])
            await agent(proxy, "ro-0").completions.create(model="toy", prompt="again")
            assert (await store.query_llm_calls("ro-0"))[-1].backend == remaining
        with pytest.raises(ValueError, match="at least one backend"):
            proxy.set_backends([])


async def test_resources_versions_are_not_model_versions_and_background_recording_flushes(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    llm = LLMResource(endpoint="http://proxy", model="toy")
    await store.add_resources(Resources(resources_id="res-1", items={"llm": llm}))
    await store.add_resources(Resources(resources_id="res-2", items={"llm": llm}))
    async with LLMProxy(store, [backend.url + "/v1"], record="background", model_version=0) as proxy:
        assert proxy.model_version == 0  # two resources versions published; the served weights are still version 0
        for i in range(5):
            await agent(proxy).chat.completions.create(model="toy", messages=[{"role": "user", "content": f"{i}"}])
        await proxy.flush()
        calls = await store.query_llm_calls("ro-1")
        assert len(calls) == 5 and {c.model_version for c in calls} == {0}
        assert [c.response_token_ids for c in calls] == [s.token_ids for s in backend.served]


async def test_flush_waits_for_a_batch_the_background_writer_is_storing(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    writing, go = asyncio.Event(), asyncio.Event()
    real_add = store.add_llm_calls

    async def add_slowly(calls: Sequence[LLMCall], *, request_id: str | None = None) -> int:
        writing.set()
        await go.wait()
        return await real_add(calls, request_id=request_id)

    store.add_llm_calls = add_slowly  # type: ignore[method-assign]
    async with LLMProxy(store, [backend.url], record="background", model_version=0) as proxy:
        await agent(proxy).chat.completions.create(model="toy", messages=[{"role": "user", "content": "first"}])
        await writing.wait()  # the background writer holds the call's record, its write not done
        flush = asyncio.ensure_future(proxy.flush())
        asyncio.get_running_loop().call_soon(go.set)  # runs after the flush's first step
        await flush
        assert len(await store.query_llm_calls("ro-1")) == 1


async def test_create_proxy_app_exposes_the_proxy_and_rejects_bad_options(store: MemoryStore) -> None:
    app = create_proxy_app(store, ["http://127.0.0.1:1234/v1/"])
    proxy = app.state.llm_proxy
    assert isinstance(proxy, LLMProxy) and proxy.backends == ["http://127.0.0.1:1234"]
    with pytest.raises(ValueError, match="http:// or https://"):
        LLMProxy(store, ["127.0.0.1:8000"])
    with pytest.raises(ValueError, match="record must be"):
        LLMProxy(store, ["http://x"], record="later")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not started"):
        _ = proxy.url


def test_proxy_started_in_a_thread_serves_sync_clients(store: MemoryStore, backend: ScriptedModelServer) -> None:
    proxy = LLMProxy(store, [backend.url]).start_in_thread()
    try:
        client = openai.OpenAI(base_url=proxy.base_url("ro-t", ATTEMPT["ro-t"]), api_key="k", max_retries=0)
        assert (
            client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "sync"}])
            .choices[0]
            .message.content
            == "sync"
        )
        asyncio.run(proxy.pause())
        assert proxy.paused
        proxy.resume()
    finally:
        asyncio.run(proxy.stop())
    [call] = asyncio.run(store.query_llm_calls("ro-t"))
    assert call.response_token_ids == backend.served[0].token_ids


AGL = [sys.executable, "-c", "import sys; from agentlightning.cli import main; sys.exit(main())"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_agl_proxy_serve_records_into_a_sqlite_file(tmp_path: Path, backend: ScriptedModelServer) -> None:
    db = tmp_path / "calls.db"
    seeded = SqliteStore(db)
    attempt_id = asyncio.run(start_attempts(seeded, ["ro-cli"]))["ro-cli"]
    asyncio.run(seeded.close())
    port = _free_port()
    cmd = [*AGL, "proxy", "serve", "--db", str(db), "--backend", backend.url, "--admin-token", "admin-0123456789abcdef"]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        status = urllib.request.Request(
            f"{url}/admin/status", headers={"Authorization": "Bearer admin-0123456789abcdef"}
        )
        for _ in range(300):
            try:
                with urllib.request.urlopen(status) as resp:
                    assert json.load(resp)["backends"] == [backend.url]
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.05)
        client = openai.OpenAI(base_url=f"{url}/rollout/ro-cli/attempt/{attempt_id}/v1", api_key="k", max_retries=0)
        client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "cli"}])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    store = SqliteStore(db)
    try:
        [call] = asyncio.run(store.query_llm_calls("ro-cli"))
    finally:
        asyncio.run(store.close())
    assert call.response_token_ids == backend.served[0].token_ids


def test_agl_proxy_serve_refuses_a_bad_backend_url(tmp_path: Path) -> None:
    cmd = [*AGL, "proxy", "serve", "--db", str(tmp_path / "x.db")]
    done = subprocess.run([*cmd, "--backend", "localhost:8000"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "http:// or https://" in done.stderr
