"""The LLM proxy under bad input (issue 12): ids that break URLs, oversized prompts, calls it cannot record."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from agentlightning import LLMResource
from agentlightning.proxy import LLMProxy, parse_rollout_prefix, rollout_base_url, rollout_prefix
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, start_attempts

ODD_IDS = ["task/7#2", "a b?c=d&e", "ünï/%2F..", "x" * 200]


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(stream_chunk_chars=4) as server:
        yield server


@pytest.fixture
async def setup(backend: ScriptedModelServer) -> AsyncIterator[tuple[LLMProxy, MemoryStore, dict[str, str]]]:
    store = MemoryStore()
    attempts = await start_attempts(store, [*ODD_IDS, "ro-ok"])
    async with LLMProxy(store, [backend.url], max_body_bytes=4096) as proxy:
        yield proxy, store, attempts


def test_the_per_rollout_url_round_trips_any_id() -> None:
    for rollout_id in ODD_IDS:
        prefix = rollout_prefix(rollout_id, f"at-{rollout_id}")
        assert prefix.count("/") == 4 and "#" not in prefix and "?" not in prefix
        assert parse_rollout_prefix(prefix) == (rollout_id, f"at-{rollout_id}")
    url = LLMResource(endpoint="http://proxy:1/", model="m").base_url("task/7#2", "at-1")
    assert (
        url
        == rollout_base_url("http://proxy:1", "task/7#2", "at-1")
        == ("http://proxy:1/rollout/task%2F7%232/attempt/at-1/v1")
    )
    assert parse_rollout_prefix("/rollout//attempt/a") is None


async def test_ids_that_break_urls_are_routed_and_recorded_under_the_right_rollout(
    setup: tuple[LLMProxy, MemoryStore, dict[str, str]],
) -> None:
    proxy, store, attempts = setup
    for rollout_id in ODD_IDS:
        client = AsyncOpenAI(base_url=proxy.base_url(rollout_id, attempts[rollout_id]), api_key="k", max_retries=0)
        out = await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}])
        assert out.choices[0].message.content == "hi"
        [call] = await store.query_llm_calls(rollout_id)
        assert (call.rollout_id, call.attempt_id, call.error) == (rollout_id, attempts[rollout_id], None)


async def test_an_oversized_prompt_gets_413_naming_the_limit_and_reaches_no_backend(
    setup: tuple[LLMProxy, MemoryStore, dict[str, str]], backend: ScriptedModelServer
) -> None:
    proxy, store, attempts = setup
    client = AsyncOpenAI(base_url=proxy.base_url("ro-ok", attempts["ro-ok"]), api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "x" * 10_000}])
    assert info.value.status_code == 413 and "limit of 4096 bytes" in str(info.value)

    # a chunked upload (no Content-Length) is counted while it is read
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 1000

    async with aiohttp.ClientSession() as http:
        url = f"{proxy.base_url('ro-ok', attempts['ro-ok'])}/chat/completions"
        async with http.post(url, data=chunks(), headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 413
    assert backend.requests == [] and await store.query_llm_calls("ro-ok") == []


async def test_a_call_the_store_refuses_is_never_answered_200(
    setup: tuple[LLMProxy, MemoryStore, dict[str, str]], backend: ScriptedModelServer
) -> None:
    proxy, _, _ = setup
    # an attempt the store never started: the record is refused, so the agent must not see a success
    client = AsyncOpenAI(base_url=proxy.base_url("ro-ok", "at-forged"), api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404 and "could not record this call" in str(info.value)
    with pytest.raises(openai.APIError, match="could not record this call"):
        stream = await client.chat.completions.create(
            model="toy", messages=[{"role": "user", "content": "streamed"}], stream=True
        )
        async for _ in stream:
            pass
