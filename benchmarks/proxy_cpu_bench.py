"""LLM proxy: its own CPU per LLM call, without sockets (the RL loop's path: an in-process backend).

Run: ``.venv/bin/python benchmarks/proxy_cpu_bench.py [--calls N] [--record sync|background] [--tokens T]``

The trainer serves its model in-process (``inproc://``, `agentlightning.proxy.register_backend`) behind the proxy,
so per LLM call the trainer's event loop runs uvicorn's HTTP handling and then the proxy's app: admission, body
validation, forwarding, the backend's answer, the call's `LLMCall` record (validation, finite checks), the answer.
This benchmark drives the proxy's ASGI app directly with ``--calls`` sequential chat completions (scope, body and
``send`` made here, as uvicorn would) against an in-process backend that answers a parsed reply of ``--tokens``
tokens with logprobs (as the torch endpoint does), records into a `MemoryStore`, and prints the process CPU
(``time.process_time``) per call, garbage collection off while timed (it would charge the store's growing record
list to whichever call triggers it). uvicorn's own work (HTTP parsing, socket writes) is not in the figure:
`proxy_bench.py` measures the proxy over real HTTP. Ends with ONE line: a JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from collections.abc import MutableMapping
from typing import Any

import orjson
import uvloop

from agentlightning.proxy import InProcessReply, LLMProxy, register_backend
from agentlightning.store import MemoryStore


def _reply(tokens: int) -> bytes:
    entry = {"token": "tok", "logprob": -0.5, "bytes": [116, 111, 107], "top_logprobs": []}
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "prompt_token_ids": list(range(120)),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "The answer is 42."},
                    "finish_reason": "stop",
                    "token_ids": list(range(tokens)),
                    "logprobs": {"content": [entry] * tokens},
                }
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": tokens, "total_tokens": 120 + tokens},
        }
    )


class _Backend:
    """Answers every call with a freshly parsed reply (the proxy may keep what it is handed)."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    async def request(self, method: str, path: str, body: bytes) -> InProcessReply:
        return InProcessReply(200, {"content-type": "application/json"}, None, parsed=orjson.loads(self.reply))


async def _run(calls: int, record: str, tokens: int) -> dict[str, Any]:
    store = MemoryStore()
    await store.enqueue_rollout({"bench": True})
    claim = await store.dequeue_rollout("bench-worker")
    assert claim is not None
    path = f"/rollout/{claim.rollout.rollout_id}/attempt/{claim.attempt.attempt_id}/v1/chat/completions"
    proxy = LLMProxy(store, [register_backend(_Backend(_reply(tokens)))], record=record)  # type: ignore[arg-type]
    messages = [{"role": "system", "content": "calc " * 40}, {"role": "user", "content": "12*(3+4)?"}]
    body = json.dumps({"model": "m", "messages": messages}).encode()
    headers = [
        (b"host", b"127.0.0.1:1"),
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
    ]
    statuses: list[int] = []

    async def one() -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 1),
        }  # fmt: skip
        received = False
        done = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()  # the client stays connected until the answer is sent
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await proxy.app(scope, receive, send)
        done.set()

    for _ in range(200):  # warm-up
        await one()
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(calls):
            await one()
        cpu = time.process_time() - start
    finally:
        gc.enable()
    if set(statuses) != {200}:
        raise RuntimeError(f"the proxy answered {sorted(set(statuses))}, not only 200")
    return {"benchmark": "proxy_cpu", "calls": calls, "record": record, "tokens": tokens,
            "cpu_us_per_call": round(cpu / calls * 1e6, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed calls (after 200 warm-up calls)")
    parser.add_argument(
        "--record", choices=("sync", "background"), default="background", help="the RL loop's is background"
    )
    parser.add_argument("--tokens", type=int, default=40, help="tokens (with logprob entries) per answer")
    args = parser.parse_args()
    print(json.dumps(uvloop.run(_run(args.calls, args.record, args.tokens))))


if __name__ == "__main__":
    main()
