"""A PostgreSQL outage under a served store (issue 38): one log line when it starts, one when it ends, however many
requests fail in between; ``/healthz`` answers 503 with a one-line reason while the database is down; nothing the
clients sent is lost (they retry the 503s)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import aiohttp
import pytest

from agentlightning._models import Span
from agentlightning.store import StoreClient
from agentlightning.testing import PostgresServer, StoreServerProcessForTests, find_pg_bin, wait_until

pytest.importorskip("psycopg", reason='the PostgreSQL driver: pip install "agentlightning-core[postgres]"')
pytestmark = pytest.mark.skipif(find_pg_bin() is None, reason="PostgreSQL's server programs are not installed")

TOKEN = "outage-token-0123456789"
FAILED_REQUESTS = 8  # requests answered 503 during the outage, each of which used to print a traceback


def _health(url: str) -> tuple[int, dict[str, str]]:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _span(rollout_id: str, attempt_id: str, index: int) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=index,
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id=f"{index + 1:016x}",
        name=f"step-{index}",
        start_time=1_700_000_000.0 + index,
        end_time=1_700_000_000.5 + index,
    )


async def _answers_503(url: str, rollout_id: str, attempt_id: str, count: int) -> list[str]:
    """Send ``count`` writes straight to the server (no client retries) and return the 503 answers' messages."""
    body = {"spans": [_span(rollout_id, attempt_id, 100).model_dump(mode="json")]}
    messages: list[str] = []
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        while len(messages) < count:
            async with http.post(f"{url}/v1/spans", json=body) as resp:
                assert resp.status == 503, await resp.text()
                messages.append((await resp.json())["message"])
    return messages


async def test_a_database_outage_is_one_line_each_way_and_healthz_tells_the_truth() -> None:
    with PostgresServer() as database, StoreServerProcessForTests(database.new_schema(), token=TOKEN) as served:
        client = StoreClient(served.url, token=TOKEN, retry_for=300)
        try:
            rollout = await client.enqueue_rollout("through the outage")
            claim = await client.dequeue_rollout()
            assert claim is not None
            rid, aid = rollout.rollout_id, claim.attempt.attempt_id
            assert _health(served.url) == (200, {"status": "ok"})

            database.pause()
            status, health = await asyncio.to_thread(_health, served.url)  # asked now, not after a failed request
            assert status == 503 and health["status"] == "failing"
            assert "is unreachable" in health["message"] and "\n" not in health["message"]
            # writes from a client that retries, and writes answered 503 straight away
            retried = [asyncio.ensure_future(client.add_spans([_span(rid, aid, i)])) for i in range(3)]
            refused = await _answers_503(served.url, rid, aid, FAILED_REQUESTS)
            assert all("is unreachable" in m and "\n" not in m for m in refused)

            database.resume()
            await asyncio.to_thread(wait_until, lambda: _health(served.url)[0] == 200, "healthz 200 again")
            assert await asyncio.gather(*retried) == [1, 1, 1]  # nothing the client sent was lost
            assert [s.sequence_id for s in await client.query_spans(rid)] == [0, 1, 2]
        finally:
            await client.close()
        output = served.output()
    lines = [line for line in output.splitlines() if line.strip()]
    down = [line for line in lines if "is unreachable" in line]
    back = [line for line in lines if "reachable again" in line]
    assert len(down) == 1 and len(back) == 1, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    # the outage is all the server said between its start line and its end line
    assert lines.index(back[0]) == lines.index(down[0]) + 1, output[-5000:]
