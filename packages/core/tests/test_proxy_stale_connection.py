"""A kept-alive connection the server closed unanswered: the proxy and the store client send once more, at once.

The backend below promises keep-alive on its error answer and then closes that connection when the next request
arrives on it, without a byte of answer: exactly what a server that closes after an error looks like to a client
that pooled the connection before seeing the close. It is deterministic (the close always happens on the reused
connection), unlike waiting for a real server's close to race the next request.
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest

from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore, StoreClient
from agentlightning.testing import RawHttpServer, read_request, start_attempts

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi"},
            "finish_reason": "stop",
            "token_ids": [7, 8],
            "logprobs": {"content": [{"token": "h", "logprob": -0.5}, {"token": "i", "logprob": -0.25}]},
        }
    ],
}


class ClosesAfterErrors(RawHttpServer):
    """A raw HTTP/1.1 server: a connection's first request is answered 500 when ``fail_first`` is set (keep-alive
    promised); any later request on a connection that answered an error is met with a close, no answer. With
    ``fail_first`` unset, a connection's second request meets the close instead (a server's idle close)."""

    def __init__(self, answer: bytes = json.dumps(ANSWER).encode(), fail_first: bool = True) -> None:
        self.answer = answer
        self.fail_first = fail_first
        self.close_second = not fail_first
        self.connections = 0
        self.closed_unanswered = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        errored = False
        try:
            while True:
                await read_request(reader)
                if errored:
                    self.closed_unanswered += 1
                    return
                if self.fail_first:
                    self.fail_first = False
                    errored = True
                    body, status = b'{"error": {"message": "boom"}}', b"500 Internal Server Error"
                else:
                    body, status = self.answer, b"200 OK"
                    errored = self.close_second
                writer.write(
                    b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


async def test_a_request_on_a_connection_closed_after_an_error_is_resent_once() -> None:
    store = MemoryStore()
    attempts = await start_attempts(store, ["ro-1"])
    async with ClosesAfterErrors() as backend:
        proxy = await LLMProxy(store, [backend.url]).start()
        try:
            url = proxy.base_url("ro-1", attempts["ro-1"]) + "/chat/completions"
            request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession() as agent:
                async with agent.post(url, json=request) as first:
                    assert first.status == 500  # the backend's own answer
                async with agent.post(url, json=request) as second:
                    assert second.status == 200, await second.text()
                    assert (await second.json())["choices"][0]["message"]["content"] == "hi"
            await proxy.flush()
        finally:
            await proxy.stop()
    assert backend.closed_unanswered == 1  # the second request did meet the closed connection...
    assert proxy.resent == 1  # ...and was sent again, counted
    calls = await store.query_llm_calls("ro-1")
    assert [call.error is None for call in calls] == [False, True]
    assert calls[1].response_token_ids == [7, 8] and calls[1].prompt_token_ids == [1, 2, 3]


async def test_the_store_client_resends_at_once_without_a_retry_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A POST (aiohttp resends only idempotent methods by itself) on a pooled connection the server had closed."""
    async with ClosesAfterErrors(b'{"attempts": []}', fail_first=False) as server:
        client = StoreClient(server.url, retries=0)  # no retries: only the stale-connection resend can save it
        try:
            with caplog.at_level(logging.WARNING, logger="agentlightning"):
                assert await client.check_timeouts() == []
                assert await client.check_timeouts() == []  # sent on the pooled connection, which is closed
        finally:
            await client.close()
    assert server.closed_unanswered == 1 and client.resent == 1
    assert not [r for r in caplog.records if "retrying" in r.getMessage() or "again after" in r.getMessage()]


@pytest.mark.parametrize(
    ("error", "stale"),
    [
        (aiohttp.ServerDisconnectedError(), True),
        # aiohttp raises this when the request cannot be written: the server closed the pooled connection first
        (aiohttp.ClientConnectionResetError("Connection lost"), True),
        (aiohttp.ClientPayloadError("the answer broke off"), False),  # an answer had begun: not sent again
    ],
)
def test_which_errors_mean_the_connection_was_closed_before_any_answer(error: Exception, stale: bool) -> None:
    from agentlightning._connections import connection_went_stale

    assert connection_went_stale(error) is stale
