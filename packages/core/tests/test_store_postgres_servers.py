"""Two ``agl store serve`` processes over one PostgreSQL database, runners split between them, one server
SIGKILLed mid-run: every rollout is claimed exactly once, every acknowledged span and finish is stored once, and
the killed server's runners carry on through the other one (see `agentlightning.testing.run_failover`)."""

from __future__ import annotations

import pytest

from agentlightning.testing import PostgresServer, run_failover

pytest.importorskip("psycopg", reason='the PostgreSQL driver: pip install "agentlightning-core[postgres]"')

ROLLOUTS = 2000  # the size: ~11 s on a quiet 2-core machine
RUNNERS = 16


async def test_two_servers_one_killed_lose_nothing_acknowledged(agl_postgres: PostgresServer) -> None:
    report = await run_failover(agl_postgres.new_schema(), ROLLOUTS, RUNNERS, token="failover-token-0123456789")

    assert 0 < report.killed_after < ROLLOUTS  # the server died mid-run
    assert len(report.rollouts) == ROLLOUTS
    assert {r.status for r in report.rollouts} == {"succeeded"}
    for rollout in report.rollouts:
        rid = rollout.rollout_id
        attempts = report.attempts[rid]
        # claimed exactly once: one attempt, the one a runner was told about (a claim whose answer was lost with
        # the killed server was given again, by request id, through the other one)
        assert [a.attempt_id for a in attempts] == [report.claims[rid]], rid
        assert attempts[0].status == "succeeded"
        assert report.spans[rid] == report.acked_spans[rid] == 4, rid  # every span stored once
    assert report.finished == {r.rollout_id for r in report.rollouts}
    # each runner of the killed server had requests answered after the kill (through the other server)
    assert set(report.answered_after_kill) == {f"runner-{n}" for n in range(0, RUNNERS, 2)}
    assert all(count > 0 for count in report.answered_after_kill.values())
    # and no request failed inside a server on the way (claims never collide: they skip each other's locked rows)
    for output in report.server_output:
        assert "Traceback" not in output and "failed" not in output, output[-3000:]
