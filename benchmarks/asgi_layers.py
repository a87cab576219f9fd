"""Where a served store's CPU goes per request: uvicorn and its loop, our ASGI layer, the store, sending the answer.

Run: ``.venv/bin/python benchmarks/asgi_layers.py [--requests 2000]``. Starts the served store as ``agl store
serve`` runs it (uvicorn with httptools on uvloop, no proxy headers, a SQLite file) with a CPU clock
(``time.thread_time``) read around the app, its admission, the body validation, the store's methods and each
``send``, then times ``GET /healthz`` and ``dequeue`` (1 in flight) twice each and prints CPU µs per request by layer
(``process``: the whole server process, from its own clock; ``uvicorn+loop``: process minus our app). Each clock read
costs a few µs of its own, counted in the layer it closes. A profiling aid: it patches core internals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

TOKEN = "bench-token"
_LAYERS = ("process", "app", "admit", "validate", "store", "send")


def serve(path: str, port: int) -> None:
    """The instrumented server (runs in a child process); ``GET /__cpu`` answers the clocks so far."""
    import uvicorn
    import uvloop

    import agentlightning.store._asgi as asgi
    from agentlightning.store import SqliteStore
    from agentlightning.store._server import create_store_app

    store = SqliteStore(path)
    app = create_store_app(store, token=TOKEN)
    clocks = dict.fromkeys(("requests", *_LAYERS[1:]), 0.0)
    clock = time.thread_time

    def timed(key: str, method: Any) -> Any:
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await method(*args, **kwargs)
            finally:
                clocks[key] += clock() - start

        return wrapped

    for name in ("dequeue_rollout", "enqueue_rollouts", "add_spans"):
        setattr(store, name, timed("store", getattr(store, name)))
    app._admit = timed("admit", app._admit)  # pyright: ignore[reportPrivateUsage]
    validate = asgi.validate_body

    def validate_timed(*args: Any) -> Any:
        start = clock()
        try:
            return validate(*args)
        finally:
            clocks["validate"] += clock() - start

    asgi.validate_body = validate_timed

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/__cpu":
            body = json.dumps({**clocks, "process": time.process_time()}).encode()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        start = clock()
        try:
            await app(scope, receive, timed("send", send))
        finally:
            if scope["type"] == "http":
                clocks["requests"] += 1
                clocks["app"] += clock() - start

    config = uvicorn.Config(
        outer, host="127.0.0.1", port=port, http="httptools", access_log=False, log_level="warning",
        lifespan="off", proxy_headers=False,
    )  # fmt: skip
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(uvicorn.Server(config).serve())


async def measure(url: str, requests: int) -> None:
    """Time /healthz and dequeue against the instrumented server at ``url``; print CPU µs per request by layer."""
    import aiohttp

    from agentlightning.store import RolloutRequest, StoreClient

    async with aiohttp.ClientSession() as raw:
        for _ in range(300):
            try:
                async with raw.get(f"{url}/healthz") as resp:
                    await resp.read()
                break
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)

        async def clocks() -> dict[str, float]:
            async with raw.get(f"{url}/__cpu") as resp:
                return json.loads(await resp.read())

        async def healthz() -> None:
            async with raw.get(f"{url}/healthz") as resp:
                await resp.read()

        client = StoreClient(url, token=TOKEN)
        await client.enqueue_rollouts([RolloutRequest(rollout_id=f"r{i}") for i in range(requests + 200)])

        async def dequeue() -> None:
            assert await client.dequeue_rollout(worker_id="bench") is not None

        try:
            for name, op in (("healthz", healthz), ("dequeue", dequeue)) * 2:
                for _ in range(50):
                    await op()
                before, start = await clocks(), time.perf_counter()
                for _ in range(requests // 2):
                    await op()
                wall, after = time.perf_counter() - start, await clocks()
                n = after["requests"] - before["requests"] - 1  # the /__cpu request itself is not counted
                per = {key: (after[key] - before[key]) / n * 1e6 for key in _LAYERS}
                per["uvicorn+loop"] = per["process"] - per["app"]
                per["our layer"] = per["app"] - per["store"] - per["send"]
                cells = "  ".join(f"{key} {value:4.0f}" for key, value in per.items())
                print(f"{name:8s} {n / wall:6.0f}/s  {cells}  (CPU µs per request)")
        finally:
            await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per operation, over two rounds")
    parser.add_argument("--serve", nargs=2, metavar=("DB", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
        server = subprocess.Popen([sys.executable, __file__, "--serve", f"{tmp}/layers.db", str(port)])
        try:
            asyncio.run(measure(f"http://127.0.0.1:{port}", args.requests))
        finally:
            server.terminate()
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
