"""A served store's CPU per span for batched span writes, in process: the spans route without HTTP.

Run: ``.venv/bin/python benchmarks/span_batch_cpu.py [--spans 100000] [--batch 500]``. Builds the served store's
app over a SQLite file (as ``agl store serve`` does) and hands its ``POST /v1/spans`` route the request bodies a
`StoreClient` sends (batches of ``--batch`` spans, each with a request id, made by the client's own code), one
after another: parse, check, the store boundary, encoding, SQLite's insert and commit. Prints CPU µs per span of
each request (its process CPU clock: fastest, 10th percentile, median) and the same for a retry of each request
(the request-id path).

On a machine shared with other jobs the fastest requests are the ones that ran alone: read the fastest and the 10th
percentile, which move little with the load, where ``http_bench.py``'s rates swing with it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

from agentlightning.store import SqliteStore, _wire
from agentlightning.store._server import create_store_app
from agentlightning.store._wire import SpansRequest
from agentlightning.testing import make_span


def _client_body(request: SpansRequest) -> bytes:
    make = getattr(_wire, "spans_request_json", None)
    return request.__pydantic_serializer__.to_json(request) if make is None else make(request)


def _figures(seconds: list[float], per: int, name: str) -> dict[str, float]:
    seconds = sorted(seconds)
    at = {"fastest": 0.0, "p10": 0.1, "median": 0.5}
    return {f"{name}_{k}_cpu_us": round(seconds[int(q * (len(seconds) - 1))] / per * 1e6, 2) for k, q in at.items()}


async def measure(spans: int, batch: int) -> dict[str, float]:
    """CPU µs per span of each request to the spans route (first requests, then their retries)."""
    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        app = create_store_app(store, token="bench-token")
        found = app.table.match("POST", "/v1/spans")
        assert found is not None
        await store.enqueue_rollout("bench")
        claim = await store.dequeue_rollout()
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        made = [make_span(rid, aid, i) for i in range(spans)]
        # the body a StoreClient sends (checkouts before spans_request_json: every field of every span)
        bodies = [
            _client_body(SpansRequest(spans=made[i : i + batch], request_id=f"req-{i}"))
            for i in range(0, spans - batch + 1, batch)
        ]
        del made
        gc.collect()
        gc.freeze()  # as agl store serve does with what it built before serving
        figures: dict[str, float] = {}
        for name in ("first", "retry"):
            seconds: list[float] = []
            for body in bodies:
                start = time.process_time()
                status, answer = await app._answer(found, body)  # pyright: ignore[reportPrivateUsage]
                seconds.append(time.process_time() - start)
                assert status == 200 and answer == b'{"added":%d}' % batch, answer
            figures |= _figures(seconds, batch, name)
        await store.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.spans, args.batch))
    for key, value in figures.items():
        print(f"  {key:<24} {value:>8.2f}")
    sys.stdout.flush()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
