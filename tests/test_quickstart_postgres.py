"""The quickstart runs unchanged against a store served over PostgreSQL (`agl store serve --db postgresql://...`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentlightning.testing import PostgresServer, StoreServerProcessForTests

pytest.importorskip("psycopg", reason='the PostgreSQL driver: pip install "agentlightning-core[postgres]"')

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"


@pytest.mark.timeout(1200)
def test_quickstart_trains_through_a_postgresql_backed_store(agl_postgres: PostgresServer, tmp_path: Path) -> None:
    from agentlightning.store import PostgresStore

    dsn = agl_postgres.new_schema()
    with StoreServerProcessForTests(db=dsn) as served:
        cmd = [
            sys.executable, str(CALC / "train.py"), "--quiet", "--store-url", served.url, "--store-token", served.token,
            "--iterations", "1", "--tasks-per-iteration", "2", "--samples-per-task", "4", "--eval-size", "2",
            "--workers", "8", "--minutes", "600", "--rollout-timeout", "3600", "--output", str(tmp_path / "run"),
        ]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1100, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["iterations"] == 1

    async def stored() -> tuple[int, int]:
        store = PostgresStore(dsn)
        try:
            rollouts = await store.query_rollouts(status=["succeeded"])
            calls = [call for r in rollouts for call in await store.query_llm_calls(r.rollout_id)]
            assert all(call.prompt_token_ids and call.response_token_ids for call in calls)
            return len(rollouts), len(calls)
        finally:
            await store.close()

    rollouts, calls = asyncio.run(stored())
    # the training rollouts (2 tasks x 4 samples) and the greedy evaluations before and after, all in PostgreSQL
    assert rollouts >= 8 and calls >= rollouts
