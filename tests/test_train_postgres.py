"""``agl train --store postgresql://... --store-servers 2``: the calculator agent trains with its store in PostgreSQL,
served to its runners by two store servers, one of them SIGKILLed mid-run.

The trainer prints each store server's address and pid (``store server I: URL pid N``); the runners are spread over
the servers (runner 0 prefers server 0, runner 1 server 1) and fail over to the other when theirs dies, which they
log (``switching to``). What the runners did is read back from the database.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from agentlightning.testing import PostgresServer

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")
pytest.importorskip("psycopg", reason='the PostgreSQL driver: pip install "agentlightning-core[postgres]"')

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
SMALL = ["--tasks-per-iteration", "2", "--samples-per-task", "4", "--workers", "4", "--max-tokens", "24", "--quiet"]
SERVER = re.compile(r"store server (\d+): (http://\S+) pid (\d+)")
DASHBOARD = re.compile(r"dashboard: (http://\S+)/ui#token=(\S+)")


def _train_cmd(out: Path, dsn: str, iterations: int) -> list[str]:
    return [
        sys.executable, "-m", "agentlightning.cli", "train", "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC),
        "--model", str(CALC / "checkpoint"), "--tasks", str(CALC / "data" / "train.jsonl"), "--tool-parser", "calc",
        "--iterations", str(iterations), "--runners", "2", "--lr", "3e-4", "--output", str(out),
        "--store", dsn, "--store-servers", "2", *SMALL,
    ]  # fmt: skip


async def _records(dsn: str) -> dict[str, tuple[str, list[tuple[str, str]], list[str], list[str]]]:
    """rollout id -> (status, [(attempt id, status)], span ids, LLM call ids), read from the database."""
    from agentlightning.store import PostgresStore

    store = PostgresStore(dsn, pool_size=1)
    try:
        found: dict[str, tuple[str, list[tuple[str, str]], list[str], list[str]]] = {}
        for rollout in await store.query_rollouts():
            attempts = [(a.attempt_id, a.status) for a in await store.query_attempts(rollout.rollout_id)]
            spans = [span.span_id for span in await store.query_spans(rollout.rollout_id)]
            calls = [call.call_id for call in await store.query_llm_calls(rollout.rollout_id)]
            found[rollout.rollout_id] = (rollout.status, attempts, spans, calls)
        return found
    finally:
        await store.close()


@pytest.mark.timeout(600)
def test_agl_train_on_postgresql_with_two_store_servers_survives_one_killed(
    agl_postgres: PostgresServer, tmp_path: Path
) -> None:
    from agentlightning.store import StoreClient

    dsn = agl_postgres.new_schema()
    out = tmp_path / "run"
    trainer = subprocess.Popen(
        _train_cmd(out, dsn, 3), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    readers = [threading.Thread(target=lambda: lines.extend(trainer.stderr), daemon=True)]  # type: ignore[arg-type]
    stdout: list[str] = []
    readers.append(threading.Thread(target=lambda: stdout.extend(trainer.stdout), daemon=True))  # type: ignore[arg-type]
    for reader in readers:
        reader.start()
    try:
        _poll(
            trainer, lines, lambda: len(SERVER.findall("".join(lines))) == 2 and bool(DASHBOARD.search("".join(lines)))
        )
        servers = {int(i): (url, int(pid)) for i, url, pid in SERVER.findall("".join(lines))}
        dashboard = DASHBOARD.search("".join(lines))
        assert dashboard is not None and dashboard.group(1) == servers[0][0]
        # the event: a rollout of the first iteration claimed and finished through the store servers
        _poll(trainer, lines, lambda: any(i.startswith("it1-") and s == "succeeded" for i, s in _statuses(dsn)))
        os.kill(servers[1][1], signal.SIGKILL)  # runner 1's server: no flush, no goodbye
        # the dashboard (server 0's /ui) keeps showing the run, read from the database
        with urllib.request.urlopen(f"{dashboard.group(1)}/ui", timeout=30) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        seen = asyncio.run(_run_stats(StoreClient(dashboard.group(1), token=dashboard.group(2))))
        assert seen >= 1
        trainer.wait(timeout=480)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    for reader in readers:
        reader.join(timeout=30)
    log = "".join(lines)
    assert trainer.returncode == 0, log[-3000:]
    summary = json.loads(stdout[-1])
    assert summary["iterations"] == 3 and summary["store"].startswith("postgresql://agl@127.0.0.1:"), summary
    assert f"store at {servers[1][0]} failed: switching to {servers[0][0]}" in log, log[-3000:]
    records = asyncio.run(_records(dsn))
    assert len(records) == 3 * 2 * 4  # 3 iterations of 2 tasks x 4 samples, all in PostgreSQL
    for rollout_id, (status, attempts, spans, calls) in records.items():
        assert status == "succeeded", (rollout_id, attempts)
        assert [s for _, s in attempts].count("succeeded") == 1, (rollout_id, attempts)  # succeeded exactly once
        assert len({a for a, _ in attempts}) == len(attempts), rollout_id
        assert spans and len(set(spans)) == len(spans), rollout_id  # no span recorded twice
        assert calls and len(set(calls)) == len(calls), rollout_id
    for _, pid in servers.values():  # the surviving server stopped with the run
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def _statuses(dsn: str) -> list[tuple[str, str]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT rollout_id, status FROM agl_rollouts").fetchall()


async def _run_stats(client: object) -> int:
    from agentlightning.store import StoreClient

    assert isinstance(client, StoreClient)
    try:
        stats = await client.run_stats()
        return sum(stats.rollouts.values())
    finally:
        await client.close()


def _poll(trainer: subprocess.Popen[str], lines: list[str], done: Callable[[], bool]) -> None:
    """Wait until ``done()`` (polled every 0.1 s; bounded at 300 s), the trainer still running."""
    deadline = time.monotonic() + 300
    while not done():
        assert trainer.poll() is None, "".join(lines)[-3000:]
        assert time.monotonic() < deadline, f"waited 300 s in vain; the trainer's log ends: {''.join(lines)[-2000:]}"
        threading.Event().wait(0.1)
