"""vLLM's engine dies mid-generation behind the proxy: the agent gets vLLM's own 500, then the proxy's 502, and no call
is recorded as a success.

This module starts its own vLLM (the engine is killed, so the session's shared server cannot be used). The engine's
scheduler is paused first (vLLM's ``/pause?mode=keep``: requests stay queued), so the agent's request is certainly
still in flight when the test, once vLLM's ``/load`` counts it, kills the engine-core process (what a crashed GPU
worker looks like to the API server).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning_torch.testing import VLLMNotInstalledError, VLLMServer, find_vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

ASK = {"model": "tiny", "messages": [{"role": "user", "content": "What is 2 plus 3?"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def doomed_server(request: pytest.FixtureRequest) -> Iterator[VLLMServer]:
    try:
        python = find_vllm_python()
    except VLLMNotInstalledError as error:
        pytest.fail(str(error), pytrace=False)
    tool_model_dir: Path = request.getfixturevalue("tool_model_dir")
    server = VLLMServer(
        tool_model_dir, served_model_name="tiny", enforce_eager=True, python=python,
        args=["--enable-server-load-tracking"],  # /load counts the requests inside the API server
        env={"VLLM_SERVER_DEV_MODE": "1"},  # /pause and /resume
    )  # fmt: skip
    with server:
        yield server


@pytest.fixture
async def proxied(doomed_server: VLLMServer) -> AsyncIterator[tuple[LLMProxy, MemoryStore]]:
    store = MemoryStore()
    async with LLMProxy(store, [doomed_server.base_url]) as proxy:
        yield proxy, store


def engine_core_pids(pid: int) -> list[int]:
    """Descendants of ``pid`` whose process title is vLLM's engine core (Linux ``/proc``)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        children = Path(f"/proc/{parent}/task/{parent}/children")
        kids = [int(k) for k in children.read_text().split()] if children.exists() else []
        pending += kids
        for kid in kids:
            cmdline = Path(f"/proc/{kid}/cmdline")
            if cmdline.exists() and cmdline.read_bytes().startswith(b"VLLM::EngineCore"):
                found.append(kid)
    return found


async def wait_until_inside(server: VLLMServer, count: int) -> None:
    """Wait until vLLM's ``/load`` counts ``count`` requests in its API server (polled; the test's timeout bounds it).

    The scheduler is paused, so a request that got in stays in until the engine dies.
    """
    async with httpx.AsyncClient(timeout=30) as client:
        while (await client.get(f"{server.url}/load")).json()["server_load"] < count:
            await asyncio.sleep(0.1)  # a poll interval, not a synchronisation: the condition is re-checked


async def test_engine_death_reaches_the_agent_as_500_and_nothing_is_a_success(
    doomed_server: VLLMServer, proxied: tuple[LLMProxy, MemoryStore]
) -> None:
    proxy, store = proxied
    await store.enqueue_rollout(input="task")
    claim = await store.dequeue_rollout("test")
    assert claim is not None
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    client = AsyncOpenAI(base_url=proxy.base_url(rid, aid), api_key="t", max_retries=0)
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.post(f"{doomed_server.url}/pause", params={"mode": "keep"})).status_code == 200
    in_flight = asyncio.ensure_future(client.chat.completions.create(**ASK))
    await wait_until_inside(doomed_server, 1)
    assert doomed_server.process is not None
    (engine,) = engine_core_pids(doomed_server.process.pid)
    os.kill(engine, signal.SIGKILL)
    with pytest.raises(openai.InternalServerError) as info:
        await in_flight
    assert info.value.status_code == 500
    # the API server shuts down after its engine died: the next call finds no backend (the proxy's 502)
    doomed_server.process.wait(timeout=300)
    with pytest.raises(openai.APIStatusError) as after:
        await client.chat.completions.create(**ASK)
    assert after.value.status_code == 502
    await proxy.flush()
    calls = await store.query_llm_calls(rid, aid)
    assert len(calls) == 2
    assert calls[0].error is not None and calls[0].error.startswith("backend HTTP 500")
    assert calls[1].error is not None and "could not reach backend" in calls[1].error
    assert all(c.response is None and not c.response_token_ids for c in calls)
