"""HTTP benchmarks over loopback: the served store (``agl store serve`` + `StoreClient`).

Run: ``.venv/bin/python benchmarks/http_bench.py [--quick] [--db postgresql://...|--db local]``. Prints a table
per section and, last, one line that is a JSON object of every figure. The server runs in its own process (SQLite
file, bearer token), so the figures include real HTTP, JSON (de)serialisation, validation and SQLite commits.

With ``--db``, the same figures are taken for a PostgreSQL store too, side by side: one ``agl store serve`` over
the database, then two over the same database with the clients split between them (``--db local`` starts a
throwaway PostgreSQL server with default, durable settings; a given database gets a fresh schema per run).

The ``sqlite_ceiling`` section writes the same rows straight into SQLite (the store's spans table, rows of a
stored span's size, 500 per transaction): the ceiling the served store's batched span writes are read against.

Sections are plain functions registered in ``SECTIONS``: each takes the parsed args and returns
``{figure_name: value}``; add a section (e.g. proxy latency) by appending one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from agentlightning.store import RolloutRequest, StoreClient
from agentlightning.testing import PostgresServer, StoreServerProcessForTests, make_span

TOKEN = "bench-token"
Section = Callable[[argparse.Namespace], dict[str, float]]


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far, from /proc (0.0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Meter:
    """Times runs of an operation: wall-clock rate plus client and server CPU µs per operation.

    On a shared machine the rates swing with the load; CPU time per operation stays comparable between runs.
    """

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.cpu: dict[str, float] = {}

    async def timed(
        self, name: str, total: int, in_flight: int, op: Callable[[int], Awaitable[Any]], per_op: int = 1
    ) -> float:
        """Run ``op(i)`` for i in range(total) with ``in_flight`` concurrent workers; returns ops per second."""
        counter = iter(range(total))

        async def worker() -> None:
            for i in counter:
                await op(i)

        server0, client0, start = _cpu_seconds(self.server_pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(in_flight)])
        wall = time.perf_counter() - start
        n = total * per_op
        self.cpu[f"{name}_client_cpu_us"] = (time.process_time() - client0) / n * 1e6
        self.cpu[f"{name}_server_cpu_us"] = (_cpu_seconds(self.server_pid) - server0) / n * 1e6
        return total / wall


async def _store_figures(url: str, server_pid: int, scale: float) -> dict[str, float]:
    client = StoreClient(url, token=TOKEN)
    figures: dict[str, float] = {}
    meter = _Meter(server_pid)
    _timed = meter.timed
    n = int(2_000 * scale)
    try:
        await client.stats()  # warm the connection pool
        # baseline: the cheapest request the server answers (read the other figures against it on a busy machine)
        import aiohttp

        async with aiohttp.ClientSession() as raw:

            async def health(_: int) -> None:
                async with raw.get(f"{url}/healthz") as resp:
                    await resp.read()

            figures["baseline_healthz_per_s_1_in_flight"] = await _timed("healthz", n, 1, health)
        # enqueue (batched, 500 per request)
        start = time.perf_counter()
        total = 0
        for b in range(8):
            reqs = [RolloutRequest(rollout_id=f"b{b}-{i}", input={"task": i}) for i in range(int(500 * scale) + 1)]
            total += len(await client.enqueue_rollouts(reqs))
        figures["enqueue_batched_rollouts_per_s"] = total / (time.perf_counter() - start)

        async def dequeue(_: int) -> None:
            assert await client.dequeue_rollout(worker_id="bench") is not None

        figures["dequeue_per_s_1_in_flight"] = await _timed("dequeue_1", n, 1, dequeue)
        figures["dequeue_per_s_8_in_flight"] = await _timed("dequeue_8", n, 8, dequeue)

        # enqueue + dequeue one at a time (the runner's hot loop without the agent)
        async def round_trip(i: int) -> None:
            await client.enqueue_rollout(i, rollout_id=f"rt-{i}")
            assert await client.dequeue_rollout(worker_id="bench") is not None

        figures["enqueue_then_dequeue_pairs_per_s_1_in_flight"] = await _timed("pair_1", n // 2, 1, round_trip)

        claim = await client.dequeue_rollout()
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        spans = [make_span(rid, aid, i) for i in range(int(200_000 * scale))]

        async def add_one(i: int) -> None:
            await client.add_spans([spans[i]])

        figures["single_span_adds_per_s_1_in_flight"] = await _timed("span_1", n, 1, add_one)

        async def add_one_more(i: int) -> None:
            await client.add_spans([spans[n + i]])

        figures["single_span_adds_per_s_8_in_flight"] = await _timed("span_8", n, 8, add_one_more)

        batch = 500
        offset = 2 * n
        n_batches = (len(spans) - offset) // batch // 2

        async def add_batch(i: int) -> None:
            await client.add_spans(spans[offset + i * batch : offset + (i + 1) * batch])

        figures["batched_spans_per_s_1_in_flight"] = await _timed("batch_1", n_batches, 1, add_batch, batch) * batch
        offset += n_batches * batch
        figures["batched_spans_per_s_4_in_flight"] = await _timed("batch_4", n_batches, 4, add_batch, batch) * batch
        stats = await client.stats()
        assert stats.spans == offset + n_batches * batch, "every span must be stored exactly once"
    finally:
        await client.close()
    return figures | meter.cpu


def store_section(args: argparse.Namespace) -> dict[str, float]:
    """Served SQLite store: enqueue/dequeue and span writes over loopback."""
    with (
        tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp,
        StoreServerProcessForTests(Path(tmp) / "bench.db", token=TOKEN) as server,
    ):
        assert server.pid is not None
        return asyncio.run(_store_figures(server.url, server.pid, 0.25 if args.quick else 1.0))


def _fresh_schema(dsn: str) -> str:
    """A new, empty schema in the database ``dsn``; the DSN with that schema as its ``search_path``."""
    import uuid

    import psycopg
    from psycopg import sql

    name = f"agl_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    if "options=" in dsn:  # keep the DSN's own settings (e.g. -csynchronous_commit=off)
        return dsn.replace("options=", f"options=-csearch_path%3D{name}%20", 1)
    return f"{dsn}{'&' if '?' in dsn else '?'}options=-csearch_path%3D{name}"


@contextlib.contextmanager
def _database(args: argparse.Namespace) -> Iterator[str]:
    if args.db == "local":
        with PostgresServer() as server:
            yield server.dsn
    else:
        yield args.db


def postgres_section(args: argparse.Namespace) -> dict[str, float]:
    """Served PostgreSQL store (--db): one server, as the SQLite section measures it."""
    if args.db is None:
        return {}
    with _database(args) as dsn, StoreServerProcessForTests(_fresh_schema(dsn), token=TOKEN) as server:
        assert server.pid is not None
        return asyncio.run(_store_figures(server.url, server.pid, 0.25 if args.quick else 1.0))


async def _two_server_figures(urls: list[str], scale: float) -> dict[str, float]:
    """Dequeues and batched span writes with the clients split evenly between the servers."""
    clients = [StoreClient(url, token=TOKEN) for url in urls]
    figures: dict[str, float] = {}
    n = int(2_000 * scale)
    try:
        await clients[0].enqueue_rollouts([RolloutRequest(rollout_id=f"t-{i}") for i in range(3 * n + 1)])
        for in_flight in (8, 16):
            counter = iter(range(n))

            async def dequeue(client: StoreClient, counter: Iterator[int] = counter) -> None:
                for _ in counter:
                    assert await client.dequeue_rollout(worker_id="bench") is not None

            start = time.perf_counter()
            await asyncio.gather(*(dequeue(clients[k % len(clients)]) for k in range(in_flight)))
            figures[f"dequeue_per_s_{in_flight}_in_flight"] = n / (time.perf_counter() - start)
        claim = await clients[0].dequeue_rollout()
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        batch, n_batches = 500, max(8, int(160 * scale))
        batches = iter(range(n_batches))

        async def add(client: StoreClient) -> None:
            for i in batches:
                await client.add_spans([make_span(rid, aid, j) for j in range(i * batch, (i + 1) * batch)])

        start = time.perf_counter()
        await asyncio.gather(*(add(clients[k % len(clients)]) for k in range(4)))
        figures["batched_spans_per_s_4_in_flight"] = n_batches * batch / (time.perf_counter() - start)
        stats = await clients[-1].stats()
        assert stats.spans == n_batches * batch, "every span must be stored exactly once"
    finally:
        for client in clients:
            await client.close()
    return figures


def postgres_two_servers_section(args: argparse.Namespace) -> dict[str, float]:
    """Side by side (--db): SQLite, PostgreSQL with one server, PostgreSQL with two (clients split between them)."""
    if args.db is None:
        return {}
    scale = 0.25 if args.quick else 1.0
    with (
        tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp,
        StoreServerProcessForTests(Path(tmp) / "side.db", token=TOKEN) as sqlite,
    ):
        lite = asyncio.run(_two_server_figures([sqlite.url], scale))
    with _database(args) as dsn:
        fresh = _fresh_schema(dsn)
        with (
            StoreServerProcessForTests(fresh, token=TOKEN) as first,
            StoreServerProcessForTests(fresh, token=TOKEN) as second,
        ):
            two = asyncio.run(_two_server_figures([first.url, second.url], scale))
        with StoreServerProcessForTests(_fresh_schema(dsn), token=TOKEN) as only:
            one = asyncio.run(_two_server_figures([only.url], scale))
    return (
        {f"sqlite_{k}": v for k, v in lite.items()}
        | {f"postgres_one_server_{k}": v for k, v in one.items()}
        | {f"postgres_two_servers_{k}": v for k, v in two.items()}
    )


def sqlite_ceiling_section(args: argparse.Namespace) -> dict[str, float]:
    """SQLite alone: the served store's spans table, rows of a stored span's size, 500 per transaction.

    Also the table of schema version 6 (three text ids) in the same run, for reference.
    """
    import random
    import sqlite3

    n = int(100_000 * (0.25 if args.quick else 1.0))
    rng = random.Random(0)
    data = bytes(rng.getrandbits(8) for _ in range(273))  # 273 B (a make_span span is 93 B in format 1)
    tables = {
        # schema version 7: (attempt key, span id as a 64-bit integer), see store/_sqlite_spans.py
        "": (
            "CREATE TABLE spans (attempt_key INTEGER NOT NULL, span_key NOT NULL, sequence_id INTEGER NOT NULL, "
            "data BLOB NOT NULL, PRIMARY KEY (attempt_key, span_key)) WITHOUT ROWID",
            [(1, i + 1 - 2**63, i, data) for i in range(n)],
        ),
        "text_keys_": (
            "CREATE TABLE spans (rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL, span_id TEXT NOT NULL, "
            "sequence_id INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (rollout_id, attempt_id, span_id)) "
            "WITHOUT ROWID",
            [("ro-" + "a" * 32, "at-" + "b" * 32, f"{i + 1:016x}", i, data) for i in range(n)],
        ),
    }
    figures: dict[str, float] = {}
    for prefix, (schema, rows) in tables.items():
        with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
            conn = sqlite3.connect(Path(tmp) / "ceiling.db", isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(schema)
            insert = f"INSERT OR IGNORE INTO spans VALUES ({', '.join('?' * len(rows[0]))})"
            cpu, start = time.process_time(), time.perf_counter()
            for offset in range(0, n, 500):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(insert, rows[offset : offset + 500])
                conn.execute("COMMIT")
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            conn.close()
        figures |= {f"{prefix}batched_spans_per_s": n / wall, f"{prefix}batched_cpu_us": cpu / n * 1e6}
    return figures


SECTIONS: list[tuple[str, Section]] = [
    ("sqlite_ceiling", sqlite_ceiling_section),
    ("store", store_section),
    ("postgres", postgres_section),
    ("side_by_side", postgres_two_servers_section),
]
"""Benchmark sections in run order: (name, function). Figures are prefixed with the section name."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (a smoke test of the script)")
    parser.add_argument("--only", default=None, help="comma-separated section names to run")
    parser.add_argument(
        "--db",
        default=None,
        help="also measure a PostgreSQL store: postgresql://user@host/db (a fresh schema per run), or 'local' to "
        "start a throwaway PostgreSQL server here",
    )
    args = parser.parse_args(argv)
    wanted = None if args.only is None else set(args.only.split(","))
    everything: dict[str, float] = {}
    for name, section in SECTIONS:
        if wanted is not None and name not in wanted:
            continue
        figures = section(args)
        if not figures:
            continue
        print(f"\n{name}: {section.__doc__ or ''}".rstrip())
        width = max(len(k) for k in figures)
        for key, value in figures.items():
            print(f"  {key:<{width}}  {value:>12,.0f}{'  (CPU µs per op)' if key.endswith('_cpu_us') else ''}")
            everything[f"{name}.{key}"] = round(value, 1)
    sys.stdout.flush()
    print(json.dumps(everything))
    return 0


if __name__ == "__main__":
    sys.exit(main())
