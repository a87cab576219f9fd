"""Late LLM calls for attempts that ended elsewhere (issue 38): refused with 409 and never recorded.

The proxy knows of an end its runner reported (``test_proxy_slot_security.py``); these attempts end where it cannot
see: through the store's API, by a heartbeat timeout (the retry already running), by a cancel, and before the proxy
that gets the call was started (a new proxy object over the same store, as after a restart). The store refuses
their records, and the proxy answers the refusal instead of 200.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import cast

import openai
import pytest
from openai import AsyncOpenAI

from agentlightning import LLMCall
from agentlightning.proxy import LLMProxy
from agentlightning.store import LightningStore, RetryPolicy, SqliteStore
from agentlightning.testing import ScriptedModelServer, start_attempts

Ender = Callable[[SqliteStore, str, str], Awaitable[str]]


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(stream_chunk_chars=4) as server:
        yield server


async def _finish(store: SqliteStore, rollout_id: str, attempt_id: str) -> str:
    await store.finish_attempt(rollout_id, attempt_id, "succeeded")
    return "succeeded"


async def _cancel(store: SqliteStore, rollout_id: str, attempt_id: str) -> str:
    await store.cancel_rollout(rollout_id)
    return "cancelled"


async def _time_out(store: SqliteStore, rollout_id: str, attempt_id: str) -> str:
    while attempt_id not in [a.attempt_id for a in await store.check_timeouts()]:  # the store's answer, no clock
        await asyncio.sleep(0.02)
    retry = await store.dequeue_rollout()  # the retry runs while the old attempt's agent still calls
    assert retry is not None and retry.rollout.rollout_id == rollout_id
    return "unresponsive"


ENDS: dict[str, Ender] = {"finished-through-the-api": _finish, "cancelled": _cancel, "heartbeat-timeout": _time_out}


async def _ask(client: AsyncOpenAI, streamed: bool) -> None:
    messages = [{"role": "user", "content": "still there?"}]
    if not streamed:
        await client.chat.completions.create(model="toy", messages=messages)  # pyright: ignore[reportArgumentType]
        return
    stream = await client.chat.completions.create(
        model="toy",
        messages=messages,  # pyright: ignore[reportArgumentType]
        stream=True,
    )
    async for _ in stream:
        pass


async def _records(store: LightningStore, rollout_id: str, attempt_id: str) -> int:
    return len(await store.query_llm_calls(rollout_id, attempt_id))


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("end", sorted(ENDS))
async def test_a_late_call_after_an_end_elsewhere_and_a_proxy_restart_is_refused(
    tmp_path: Path, backend: ScriptedModelServer, end: str, streamed: bool
) -> None:
    store = SqliteStore(tmp_path / "store.db", retry_policy=RetryPolicy(max_attempts=2, heartbeat_timeout=0.2))
    try:
        attempt_id = (await start_attempts(store, ["ro-late"]))["ro-late"]
        async with LLMProxy(store, [backend.url]) as first:
            client = AsyncOpenAI(base_url=first.base_url("ro-late", attempt_id), api_key="k", max_retries=0)
            await _ask(client, streamed)  # while the attempt runs: answered and recorded
        assert await _records(store, "ro-late", attempt_id) == 1
        status = await ENDS[end](store, "ro-late", attempt_id)

        # a new proxy over the same store (a restart): it was never told of the end
        async with LLMProxy(store, [backend.url]) as restarted:
            client = AsyncOpenAI(base_url=restarted.base_url("ro-late", attempt_id), api_key="k", max_retries=0)
            forwarded = len(backend.requests)
            if streamed:  # the answer's head is out: the stream ends with the refusal instead of [DONE]
                with pytest.raises(openai.APIError) as late:
                    await _ask(client, streamed=True)
                assert late.value.body["type"] == "attempt_finished"  # type: ignore[index]
                assert late.value.body["code"] == 409  # type: ignore[index]
            else:
                with pytest.raises(openai.APIStatusError) as late:
                    await _ask(client, streamed=False)
                assert late.value.status_code == 409
                assert late.value.body["type"] == "attempt_finished"  # type: ignore[index]
            message = late.value.message
            assert f"already ended ({status})" in message and "\n" not in message
            # the proxy now knows: the next late call is refused before it reaches the backend
            with pytest.raises(openai.APIStatusError) as again:
                await _ask(client, streamed=False)
            assert again.value.status_code == 409
            assert len(backend.requests) == forwarded + 1
            assert restarted.late_calls == 2
        assert await _records(store, "ro-late", attempt_id) == 1  # nothing late was recorded
    finally:
        await store.close()


class _GatedStore:
    """A store whose LLM-call writes wait for ``gate``: records queue up meanwhile, to be written as one batch."""

    def __init__(self, inner: LightningStore) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.batches: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def add_llm_calls(self, calls: list[LLMCall], *, request_id: str | None = None) -> int:
        await self.gate.wait()
        self.batches.append(len(calls))
        return await self.inner.add_llm_calls(calls, request_id=request_id)


async def test_background_recording_drops_only_the_late_records_of_a_batch(
    tmp_path: Path, backend: ScriptedModelServer
) -> None:
    inner = SqliteStore(tmp_path / "store.db")
    store = _GatedStore(inner)
    try:
        attempts = await start_attempts(inner, ["ro-running", "ro-ended"])
        await inner.finish_attempt("ro-ended", attempts["ro-ended"], "succeeded")
        async with LLMProxy(cast(LightningStore, store), [backend.url], record="background") as proxy:
            clients = {
                rollout_id: AsyncOpenAI(base_url=proxy.base_url(rollout_id, attempt_id), api_key="k", max_retries=0)
                for rollout_id, attempt_id in attempts.items()
            }
            # the first record's write holds the writer; the next two queue up behind it and go as one batch
            await _ask(clients["ro-running"], streamed=False)
            await _ask(clients["ro-running"], streamed=False)
            await _ask(clients["ro-ended"], streamed=False)  # background mode answers before the record is written
            store.gate.set()
            await proxy.flush()
            assert store.batches[:2] == [1, 2]  # the batch of two was refused as a whole, then written per attempt
            assert await _records(inner, "ro-running", attempts["ro-running"]) == 2  # not lost with the late one
            assert await _records(inner, "ro-ended", attempts["ro-ended"]) == 0
            assert proxy.late_calls == 1
            with pytest.raises(openai.APIStatusError) as again:  # the store's refusal is remembered
                await _ask(clients["ro-ended"], streamed=False)
            assert again.value.status_code == 409
    finally:
        await inner.close()
