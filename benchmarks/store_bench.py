"""Store throughput: rollouts enqueued/dequeued and spans added per second, per backend.

Run: ``.venv/bin/python benchmarks/store_bench.py [--quick]``

Prints a table, then ONE final line: a JSON object of every figure (keys ``<section>.<backend>.<metric>``).

The script is a list of sections; each is an async function registered with ``@section("name")`` that
returns rows ``(backend, metric, value, unit)``. To add a figure, add a section function (see the end of
the section list); ``main`` runs them all in order and prints them together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from agentlightning import MemoryStore, Span, SqliteStore
from agentlightning.store import LightningStore

Row = tuple[str, str, float, str]  # backend, metric, value, unit
SectionFn = Callable[[argparse.Namespace], Awaitable[list[Row]]]
SECTIONS: list[tuple[str, SectionFn]] = []


def section(name: str) -> Callable[[SectionFn], SectionFn]:
    """Register a benchmark section; sections run in registration order."""

    def register(fn: SectionFn) -> SectionFn:
        SECTIONS.append((name, fn))
        return fn

    return register


# ------------------------------------------------------------------ store helpers


def _backends(tmp: Path) -> dict[str, Callable[[], AbstractAsyncContextManager[LightningStore]]]:
    def opener(make: Callable[[], LightningStore]) -> Callable[[], AbstractAsyncContextManager[LightningStore]]:
        @asynccontextmanager
        async def open_store() -> Any:
            store = make()
            try:
                yield store
            finally:
                await store.close()

        return open_store

    counter = iter(range(1_000_000))
    return {
        "memory": opener(MemoryStore),
        "sqlite": opener(lambda: SqliteStore(tmp / f"normal-{next(counter)}.db")),
        "sqlite_full": opener(lambda: SqliteStore(tmp / f"full-{next(counter)}.db", synchronous="FULL")),
    }


def _span(rollout_id: str, attempt_id: str, i: int) -> Span:
    # a typical LLM-call span: ids as the runner makes them, a few gen_ai attributes
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=i,
        trace_id=f"{i:032x}",
        span_id=f"{i + 1:016x}",
        parent_id=f"{1:016x}",
        name="chat",
        start_time=1_700_000_000.0 + i,
        end_time=1_700_000_000.5 + i,
        attributes={"gen_ai.system": "openai", "gen_ai.usage.input_tokens": 120},
    )


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else float("inf")


def _cpu_us(cpu_seconds: float, n: int) -> float:
    # CPU time per operation: steadier than rates on a shared machine (waiting for a core does not count).
    return round(cpu_seconds / n * 1e6, 1)


# ------------------------------------------------------------------ sections


@section("store")
async def store_throughput(args: argparse.Namespace) -> list[Row]:
    """Rollout queue and span ingestion, one call at a time and batched, on each backend."""
    n_rollouts = 500 if args.quick else 3000
    n_single = 500 if args.quick else 3000
    n_batched = 5000 if args.quick else 50_000
    batch = 500
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend, open_store in _backends(Path(tmp)).items():
            async with open_store() as store:
                t0, c0 = time.perf_counter(), time.process_time()
                for i in range(n_rollouts):
                    await store.enqueue_rollout({"task": i})
                t_enq, c_enq = time.perf_counter() - t0, time.process_time() - c0
                t0, c0 = time.perf_counter(), time.process_time()
                claims = [await store.dequeue_rollout(worker_id="bench") for _ in range(n_rollouts)]
                t_deq, c_deq = time.perf_counter() - t0, time.process_time() - c0
                assert all(c is not None for c in claims)
                t0 = time.perf_counter()
                for claim in claims[2:]:  # the first two keep running: spans are only added to running attempts
                    assert claim is not None
                    await store.finish_attempt(claim.rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
                t_fin = time.perf_counter() - t0
                rows += [
                    (backend, "enqueue_per_s", _rate(n_rollouts, t_enq), "rollouts/s, 1 per call"),
                    (backend, "dequeue_per_s", _rate(n_rollouts, t_deq), "claims/s, 1 per call"),
                    (backend, "enqueue_dequeue_per_s", _rate(n_rollouts, t_enq + t_deq), "rollouts/s, both"),
                    (backend, "finish_per_s", _rate(n_rollouts - 2, t_fin), "attempts/s, 1 per call"),
                    (backend, "enqueue_cpu_us", _cpu_us(c_enq, n_rollouts), "CPU µs per call"),
                    (backend, "dequeue_cpu_us", _cpu_us(c_deq, n_rollouts), "CPU µs per call"),
                ]

                rid, aid = claims[0].rollout.rollout_id, claims[0].attempt.attempt_id  # type: ignore[union-attr]
                spans = [_span(rid, aid, i) for i in range(n_single)]
                t0, c0 = time.perf_counter(), time.process_time()
                for span in spans:
                    await store.add_spans([span])
                t_single, c_single = time.perf_counter() - t0, time.process_time() - c0
                rid2, aid2 = claims[1].rollout.rollout_id, claims[1].attempt.attempt_id  # type: ignore[union-attr]
                spans = [_span(rid2, aid2, i) for i in range(n_batched)]
                t0, c0 = time.perf_counter(), time.process_time()
                added = 0
                for start in range(0, n_batched, batch):
                    added += await store.add_spans(spans[start : start + batch])
                t_batch, c_batch = time.perf_counter() - t0, time.process_time() - c0
                assert added == n_batched
                t0 = time.perf_counter()
                got = await store.query_spans(rid2)
                t_query = time.perf_counter() - t0
                assert len(got) == n_batched
                rows += [
                    (backend, "span_add_single_per_s", _rate(n_single, t_single), "spans/s, 1 per call"),
                    (backend, f"span_add_batch{batch}_per_s", _rate(n_batched, t_batch), f"spans/s, {batch} per call"),
                    (backend, "span_query_per_s", _rate(n_batched, t_query), "spans/s read back"),
                    (backend, "span_add_single_cpu_us", _cpu_us(c_single, n_single), "CPU µs per call"),
                    (backend, f"span_add_batch{batch}_cpu_us", _cpu_us(c_batch, n_batched), "CPU µs per span"),
                ]
    span_bytes = len(_span("ro-" + "a" * 32, "at-" + "b" * 32, 7).model_dump_json())
    rows.append(("-", "span_json_bytes", float(span_bytes), "B"))
    return rows


@section("raw_sqlite")
async def raw_sqlite(args: argparse.Namespace) -> list[Row]:
    """The machine's ceiling right now: bare sqlite3 inserts of span-sized rows, no store code (calibration).

    The host is shared and noisy, so read the store's SQLite figures as a fraction of these.
    """
    n_single = 500 if args.quick else 3000
    n_batched = 5000 if args.quick else 50_000
    payload = "x" * 420
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for sync in ("NORMAL", "FULL"):
            conn = sqlite3.connect(Path(tmp) / f"raw-{sync}.db", isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {sync}")
            conn.execute("CREATE TABLE t (a TEXT, b TEXT, c TEXT, d INTEGER, data TEXT, PRIMARY KEY (a, b, c))")
            sql = "INSERT OR IGNORE INTO t VALUES (?, ?, ?, ?, ?)"
            n = n_single if sync == "NORMAL" else max(100, n_single // 10)
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(n):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(sql, ("ro-" + "a" * 32, "at-" + "b" * 32, f"{i:016x}", i, payload))
                conn.execute("COMMIT")
            t_single, c_single = time.perf_counter() - t0, time.process_time() - c0
            data = [("ro-" + "a" * 32, "at-" + "c" * 32, f"{i:016x}", i, payload) for i in range(n_batched)]
            t0 = time.perf_counter()
            for start in range(0, n_batched, 500):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, data[start : start + 500])
                conn.execute("COMMIT")
            t_batch = time.perf_counter() - t0
            conn.close()
            backend = "sqlite3" if sync == "NORMAL" else "sqlite3_full"
            rows += [
                (backend, "row_txn_single_per_s", _rate(n, t_single), "rows/s, 1 per txn"),
                (backend, "row_txn_single_cpu_us", _cpu_us(c_single, n), "CPU µs per txn"),
                (backend, "row_txn_batch500_per_s", _rate(n_batched, t_batch), "rows/s, 500 per txn"),
            ]
    return rows


@section("thread_hop")
async def thread_hop(args: argparse.Namespace) -> list[Row]:
    """What running each SQLite call through a worker thread would add (the store runs them inline)."""
    n = 500 if args.quick else 3000
    t0 = time.perf_counter()
    for _ in range(n):
        await asyncio.to_thread(int)
    per_call_us = (time.perf_counter() - t0) / n * 1e6
    return [("asyncio.to_thread", "overhead_us", round(per_call_us, 1), "µs per call")]


# (new sections go here: decorate an async function with @section("name"))


# ------------------------------------------------------------------ main


async def _run(args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    print(f"{'section':<12} {'backend':<18} {'metric':<28} {'value':>12}  unit")
    print("-" * 96)
    for name, fn in SECTIONS:
        if args.only and name not in args.only:
            continue
        for backend, metric, value, unit in await fn(args):
            print(f"{name:<12} {backend:<18} {metric:<28} {value:>12,.1f}  {unit}")
            figures[f"{name}.{backend}.{metric}"] = value
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    parser.add_argument("--only", action="append", help="run only this section (repeatable)")
    args = parser.parse_args(argv)
    figures = asyncio.run(_run(args))
    sys.stdout.flush()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
