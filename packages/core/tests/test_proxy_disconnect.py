"""An agent that hangs up while the backend works: the proxy closes its backend leg too (the backend can stop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import RawHttpServer, read_request, start_attempts


class SilentBackend(RawHttpServer):
    """A raw HTTP server that takes a request, optionally sends stream headers and one chunk, then never answers.

    ``arrived`` is set when a request is in; ``closed`` when the proxy closes that connection (end of file).
    """

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.arrived = asyncio.Event()
        self.closed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if self.stream:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            event = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
        self.arrived.set()
        while await reader.read(1024):  # never answers; returns b"" once the proxy closes the connection
            pass
        self.closed.set()
        writer.close()


@pytest.fixture
async def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture(params=[False, True], ids=["plain", "stream"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[SilentBackend]:
    async with SilentBackend(stream=request.param) as server:
        yield server


async def test_agent_disconnect_closes_the_backend_leg(store: MemoryStore, backend: SilentBackend) -> None:
    attempts = await start_attempts(store, ["ro-1"])
    async with LLMProxy(store, [backend.url]) as proxy:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": backend.stream}
        url = f"{proxy.base_url('ro-1', attempts['ro-1'])}/chat/completions"
        first_bytes = asyncio.Event()

        async def agent() -> None:
            async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
                await resp.content.readany()  # streams: the first event; plain: blocks until hang-up
                first_bytes.set()
                await asyncio.Event().wait()

        call = asyncio.ensure_future(agent())
        await asyncio.wait_for(backend.arrived.wait(), 30)
        if backend.stream:
            await asyncio.wait_for(first_bytes.wait(), 30)
        assert proxy.in_flight == 1
        call.cancel()  # the agent hangs up (its connection closes)
        await asyncio.gather(call, return_exceptions=True)
        await asyncio.wait_for(backend.closed.wait(), 30)
        while proxy.in_flight:  # settles right after the backend leg closed
            await asyncio.sleep(0.01)


async def test_aborting_a_cancelled_rollout_closes_its_backend_leg_while_the_agent_waits(
    store: MemoryStore, backend: SilentBackend
) -> None:
    """`LLMProxy.abort_rollouts` (what the training loop calls for late rollouts it cancels): the backend connection
    closes at once (vLLM aborts the request), the agent gets 409 (plain) or a stream that ends without ``[DONE]``, and
    other rollouts' calls are left alone."""
    attempts = await start_attempts(store, ["ro-1", "ro-2"])
    async with LLMProxy(store, [backend.url]) as proxy:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": backend.stream}
        url = f"{proxy.base_url('ro-1', attempts['ro-1'])}/chat/completions"
        answered: list[tuple[int, bytes]] = []

        async def agent() -> None:
            async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
                answered.append((resp.status, await resp.read()))

        call = asyncio.ensure_future(agent())
        await asyncio.wait_for(backend.arrived.wait(), 30)
        assert proxy.in_flight == 1
        assert proxy.abort_rollouts(["ro-2"]) == 0  # another rollout: nothing of this call is touched
        assert proxy.abort_rollouts(["ro-1"]) == 1
        await asyncio.wait_for(backend.closed.wait(), 30)
        await asyncio.wait_for(call, 30)  # the agent is answered, not left hanging
        [(status, payload)] = answered
        if backend.stream:
            assert status == 200 and b"[DONE]" not in payload
        else:
            assert status == 409 and b"aborted" in payload
        while proxy.in_flight:  # settles right after the call ends
            await asyncio.sleep(0.01)
        assert proxy.abort_rollouts(["ro-1"]) == 0  # nothing left in flight
