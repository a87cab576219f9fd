"""Every recorded LLM call carries the version of the weights that produced it, never a resources version.

The scripted server's version at the time a request arrives is its "weights"; `hold` keeps the request unanswered
while the test swaps the version under it, so "served before the swap, recorded after" needs no clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from openai import AsyncOpenAI

from agentlightning import LLMResource, Resources
from agentlightning.proxy import MODEL_VERSION_FIELD, LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, start_attempts

ATTEMPT: dict[str, str] = {}  # the store refuses calls of attempts it never started: "ro-1" is started first


async def _seeded() -> MemoryStore:
    store = MemoryStore()
    ATTEMPT.update(await start_attempts(store, ["ro-1"]))
    return store


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
async def proxy(backend: ScriptedModelServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(await _seeded(), [backend.url], model_version=0) as running:
        yield running


def _client(proxy: LLMProxy) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proxy.base_url("ro-1", ATTEMPT["ro-1"]), api_key="k", max_retries=0)


async def _call(proxy: LLMProxy, kind: str, stream: bool) -> None:
    client = _client(proxy)
    if kind == "chat":
        messages = [{"role": "user", "content": "hello there"}]
        if stream:
            async for _ in await client.chat.completions.create(model="toy", messages=messages, stream=True):  # type: ignore[arg-type]
                pass
        else:
            await client.chat.completions.create(model="toy", messages=messages)  # type: ignore[arg-type]
    elif stream:
        async for _ in await client.completions.create(model="toy", prompt="hello there", stream=True):
            pass
    else:
        await client.completions.create(model="toy", prompt="hello there")


async def _recorded_versions(proxy: LLMProxy) -> list[int | None]:
    await proxy.flush()
    return [call.model_version for call in await proxy.store.query_llm_calls("ro-1")]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_the_backends_reported_version_wins_over_the_proxys(
    proxy: LLMProxy, backend: ScriptedModelServer, kind: str, stream: bool
) -> None:
    backend.model_version = 3
    await _call(proxy, kind, stream)
    assert await _recorded_versions(proxy) == [3]


@pytest.mark.parametrize("reports", [True, False], ids=["backend-reports", "backend-silent"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_call_served_before_a_weight_swap_keeps_the_old_version_when_recorded_after(
    proxy: LLMProxy, backend: ScriptedModelServer, stream: bool, reports: bool
) -> None:
    backend.model_version = 0 if reports else None
    backend.hold()
    call = asyncio.create_task(_call(proxy, "chat", stream))
    while not backend.requests:  # admitted by the proxy and generating on the backend (version 0)
        await asyncio.sleep(0.01)
    # The weights change while the answer is on its way (a trainer that does not drain, or an async engine).
    backend.model_version = 1 if reports else None
    proxy.model_version = 1
    backend.release()
    await call
    await _call(proxy, "chat", stream)  # admitted after the swap
    assert await _recorded_versions(proxy) == [0, 1]


async def test_resources_versions_never_become_model_versions(backend: ScriptedModelServer) -> None:
    store = await _seeded()
    llm = LLMResource(endpoint="http://proxy", model="toy")
    for i in range(3):  # e.g. sampling + greedy resources for one model version, and a prompt change
        await store.add_resources(Resources(resources_id=f"res-{i}", items={"llm": llm}))
    async with LLMProxy(store, [backend.url]) as proxy:
        await _call(proxy, "chat", False)
        backend.model_version = 0
        await _call(proxy, "chat", True)
        assert await _recorded_versions(proxy) == [None, 0]  # unknown stays unknown; never a guess


async def test_the_version_field_reaches_the_agent_and_the_recorded_response(
    proxy: LLMProxy, backend: ScriptedModelServer
) -> None:
    backend.model_version = 4
    raw = await _client(proxy).chat.completions.with_raw_response.create(
        model="toy",
        messages=[{"role": "user", "content": "v"}],  # type: ignore[list-item]
    )
    assert raw.headers["x-agentlightning-model-version"] == "4"
    assert (raw.parse().model_extra or {})[MODEL_VERSION_FIELD] == 4
    [call] = await proxy.store.query_llm_calls("ro-1")
    assert call.response is not None and call.response[MODEL_VERSION_FIELD] == 4
