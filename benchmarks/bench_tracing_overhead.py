"""Per-span cost of Agent Lightning's tracing, next to the plain OpenTelemetry SDK floor.

Measures, for N spans (create, set one attribute, end):
  * otel_batch_noop: SDK tracer + BatchSpanProcessor + an exporter that does nothing (the floor).
  * agl_hot_path: our tracer inside a rollout context, time in the agent's thread only (spans still queued).
  * agl_end_to_end_<store>: same, plus flush() until the store acknowledged every span (MemoryStore, SqliteStore).
  * agl_outside_rollout: our tracer with no rollout (spans are dropped).
  * agl_cpu_memory / light_record_cpu_memory: process CPU µs per span, from the first span to every span stored in a
    MemoryStore: through our tracer (the SDK's span objects, our processor's conversion on its writer thread), and
    building the same `Span` records directly (ids, clock, attributes with rollout/attempt ids, sequence numbers,
    validation) and storing them in batches of the same size: the floor of any recording path.
  * agl_light_cpu_memory: as agl_cpu_memory, through the light tracer that records our own spans (root, LLM,
    reward; `agentlightning.tracing._light`) while no OTLP exporter or other processor needs the SDK's spans.
Run: .venv/bin/python benchmarks/bench_tracing_overhead.py [N]
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from agentlightning import Span, semconv
from agentlightning.store import MemoryStore, SqliteStore
from agentlightning.tracing import flush, get_span_processor, get_tracer, rollout_context
from agentlightning.tracing._provider import light_tracer


class _NoopExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _make_spans(tracer, n: int) -> None:
    for i in range(n):
        span = tracer.start_span("llm")
        span.set_attribute("i", i)
        span.end()


def _per_span_us(seconds: float, n: int) -> float:
    return seconds / n * 1e6


def bench_otel(n: int) -> float:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_NoopExporter()))
    tracer = provider.get_tracer("bench")
    _make_spans(tracer, 500)  # warm up
    t0 = time.perf_counter()
    _make_spans(tracer, n)
    elapsed = time.perf_counter() - t0
    provider.shutdown()
    return _per_span_us(elapsed, n)


def _claim(store) -> tuple[str, str]:
    async def go() -> tuple[str, str]:
        await store.enqueue_rollout({})
        claim = await store.dequeue_rollout("bench")
        assert claim is not None
        return claim.rollout.rollout_id, claim.attempt.attempt_id

    return asyncio.run(go())


def bench_agl(store, n: int, tracer=None) -> tuple[float, float, float]:
    tracer = tracer if tracer is not None else get_tracer("bench")
    rid, aid = _claim(store)
    with rollout_context(store, rid, aid):
        _make_spans(tracer, 500)
    flush(60)
    rid, aid = _claim(store)
    with rollout_context(store, rid, aid):
        t0, cpu0 = time.perf_counter(), time.process_time()
        _make_spans(tracer, n)
        hot = time.perf_counter() - t0
    flush(120)
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stored = len(asyncio.run(store.query_spans(rid)))
    assert stored == n, f"{stored} of {n} spans stored"
    return _per_span_us(hot, n), _per_span_us(total, n), _per_span_us(cpu, n)


def bench_light(store, n: int, batch: int) -> float:
    """Process CPU µs per span to build the same records as `bench_agl` directly and store them."""
    rid, aid = _claim(store)
    trace_id = format(random.getrandbits(128), "032x")
    cpu0 = time.process_time()
    records: list[Span] = []
    for i in range(n):
        start = time.time_ns()
        records.append(
            Span.model_validate(
                {
                    "rollout_id": rid,
                    "attempt_id": aid,
                    "sequence_id": i,
                    "trace_id": trace_id,
                    "span_id": format(random.getrandbits(64), "016x"),
                    "parent_id": None,
                    "name": "llm",
                    "start_time": start / 1e9,
                    "end_time": time.time_ns() / 1e9,
                    "attributes": {semconv.ROLLOUT_ID: rid, semconv.ATTEMPT_ID: aid, "i": i},
                }
            )
        )

    async def store_all() -> None:
        for k in range(0, n, batch):
            await store.add_spans(records[k : k + batch])

    asyncio.run(store_all())
    cpu = time.process_time() - cpu0
    assert len(asyncio.run(store.query_spans(rid))) == n
    return _per_span_us(cpu, n)


def bench_outside(n: int) -> float:
    tracer = get_tracer("bench")
    t0 = time.perf_counter()
    _make_spans(tracer, n)
    return _per_span_us(time.perf_counter() - t0, n)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    figures: dict[str, float] = {"spans": n}
    figures["otel_batch_noop_us"] = bench_otel(n)
    hot, total, cpu = bench_agl(MemoryStore(), n)
    figures["agl_hot_path_memory_us"] = hot
    figures["agl_end_to_end_memory_us"] = total
    figures["agl_cpu_memory_us"] = cpu
    stats = get_span_processor().stats()
    batch = max(1, round(stats["spans_written"] / max(1, stats["batches_written"])))
    figures["light_record_cpu_memory_us"] = bench_light(MemoryStore(), n, batch)
    _, _, figures["agl_light_cpu_memory_us"] = bench_agl(MemoryStore(), n, light_tracer("bench"))
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        hot, total, _ = bench_agl(store, n)
        asyncio.run(store.close())
    figures["agl_hot_path_sqlite_us"] = hot
    figures["agl_end_to_end_sqlite_us"] = total
    figures["agl_outside_rollout_us"] = bench_outside(n)
    stats = get_span_processor().stats()
    figures["batches_written"] = stats["batches_written"]
    figures["mean_batch_size"] = stats["spans_written"] / max(1, stats["batches_written"])

    print(f"{'measure':34} {'µs per span':>12}")
    for key, value in figures.items():
        if key.endswith("_us"):
            print(f"{key:34} {value:12.1f}")
    print(f"{'spans per run':34} {n:12d}")
    print(f"{'mean batch size':34} {figures['mean_batch_size']:12.1f}")
    floor = 1 - figures["light_record_cpu_memory_us"] / figures["agl_cpu_memory_us"]
    light = 1 - figures["agl_light_cpu_memory_us"] / figures["agl_cpu_memory_us"]
    print(f"our light spans save {light:.0%} of the SDK path's CPU per span (building records directly: {floor:.0%})")
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
