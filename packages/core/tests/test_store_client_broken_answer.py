"""A store server killed while it sends an answer: the client retries the request (another server, or the same one
restarted, answers it), as after a lost connection, instead of failing the runner with aiohttp's payload error."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from agentlightning.store import StoreClient, StoreUnavailableError
from agentlightning.testing import RawHttpServer, read_request


class BreaksOffFirstAnswer(RawHttpServer):
    """A raw HTTP/1.1 server: the first request gets its answer's head (``content-length: 200``) and then a close,
    no body; every later one gets ``answer`` in full."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                self.requests += 1
                if self.requests == 1:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n")
                    await writer.drain()
                    return  # the close: the body never comes
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: " + str(len(self.answer)).encode() + b"\r\n\r\n" + self.answer
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


async def test_an_answer_that_breaks_off_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    async with BreaksOffFirstAnswer(json.dumps({"attempts": []}).encode()) as server:
        client = StoreClient(server.url, backoff=0.01)
        try:
            with caplog.at_level(logging.WARNING, logger="agentlightning"):
                assert await client.check_timeouts() == []
        finally:
            await client.close()
    assert server.requests == 2
    said = [r.getMessage() for r in caplog.records]
    assert any("retrying" in m and "ClientPayloadError" in m for m in said), said  # said once, with the cause


async def test_with_no_retries_left_it_is_the_stores_unavailable_error() -> None:
    async with BreaksOffFirstAnswer(b'{"attempts": []}') as server:
        client = StoreClient(server.url, retries=0)
        try:
            with pytest.raises(StoreUnavailableError, match="ClientPayloadError"):
                await client.check_timeouts()
        finally:
            await client.close()
    assert server.requests == 1
