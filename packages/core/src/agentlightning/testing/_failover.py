"""Several store servers over one PostgreSQL database, one of them killed mid-run: the scenario and its parts.

`TcpFailover` is a plain TCP load balancer (what a user puts in front of several ``agl store serve`` processes,
or what DNS with several addresses gives a client): each new connection goes to the first server in its list
that accepts one. `run_failover` starts two servers on one database, splits runners between them (each runner
prefers its own server and falls back to the other), ``kill -9``s one server once a third of the rollouts
finished, and reports what every runner was told (its acknowledged claims, spans and finishes) beside what the
database holds, for the caller to compare. Used by the tests (small) and ``benchmarks/store_failover.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from agentlightning._models import Attempt, Rollout
from agentlightning.store import PostgresStore, RetryPolicy, RolloutRequest, StoreClient
from agentlightning.testing._store_kit import make_span
from agentlightning.testing._store_server import StoreServerProcessForTests

__all__ = ["FailoverReport", "TcpFailover", "run_failover"]

_SPANS_PER_ROLLOUT = 4  # sent in two batches of two


class TcpFailover:
    """A TCP load balancer on 127.0.0.1: each connection is piped to the first of ``ports`` that accepts it."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpFailover:
        """Listen on a free port (``port``)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for port in self.ports:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue  # that server is down: the next one
            break
        else:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def close(self) -> None:
        """Stop listening (open connections end with their peers)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


@dataclass
class FailoverReport:
    """What the runners were told and what the database holds after a `run_failover`."""

    rollouts: list[Rollout]
    attempts: dict[str, list[Attempt]]
    spans: dict[str, int]
    claims: dict[str, str] = field(default_factory=dict)
    """Acknowledged claims: rollout id -> attempt id (a rollout acknowledged twice raises at once)."""
    acked_spans: dict[str, int] = field(default_factory=dict)
    """Spans whose ``add_spans`` was acknowledged, per rollout."""
    finished: set[str] = field(default_factory=set)
    """Rollouts whose ``finish_attempt`` was acknowledged."""
    answered_after_kill: dict[str, int] = field(default_factory=dict)
    """Per runner of the killed server: requests answered after the kill (through the other server)."""
    seconds: float = 0.0
    killed_after: int = 0
    server_output: list[str] = field(default_factory=list)
    """What each server printed (logged failures included)."""


async def run_failover(dsn: str, rollouts: int, runners: int, token: str) -> FailoverReport:
    """Serve ``dsn`` from two ``agl store serve`` processes, run ``rollouts`` with ``runners`` split between them
    through `TcpFailover`, SIGKILL the first server once a third finished, and report (see `FailoverReport`)."""
    policy = RetryPolicy(heartbeat_timeout=3600.0)  # no runner here heartbeats: nothing may time out
    trainer = PostgresStore(dsn, retry_policy=policy, pool_size=2)
    servers = [StoreServerProcessForTests(dsn, token=token, retry_policy=policy) for _ in range(2)]
    await asyncio.gather(*(asyncio.to_thread(server.start) for server in servers))
    balancers = [await TcpFailover([servers[i].port, servers[1 - i].port]).start() for i in (0, 1)]
    report = FailoverReport(rollouts=[], attempts={}, spans={})
    try:
        await trainer.enqueue_rollouts([RolloutRequest(rollout_id=f"fo-{i:05d}", input=i) for i in range(rollouts)])
        start = time.perf_counter()
        await _run_runners(servers, balancers, trainer, rollouts, runners, token, report)
        report.seconds = time.perf_counter() - start
        report.rollouts = await trainer.query_rollouts()
        for rollout in report.rollouts:
            report.attempts[rollout.rollout_id] = await trainer.query_attempts(rollout.rollout_id)
            report.spans[rollout.rollout_id] = len(await trainer.query_spans(rollout.rollout_id))
    finally:
        for balancer in balancers:
            await balancer.close()
        for server in servers:
            await asyncio.to_thread(server.stop)
            report.server_output.append(server.output())
        await trainer.close()
    return report


async def _run_runners(
    servers: list[StoreServerProcessForTests],
    balancers: list[TcpFailover],
    trainer: PostgresStore,
    total: int,
    runners: int,
    token: str,
    report: FailoverReport,
) -> None:
    kill_now = asyncio.Event()
    killed = asyncio.Event()
    stop = asyncio.Event()
    failed_over = {f"runner-{n}": asyncio.Event() for n in range(0, runners, 2)}  # even runners: server 0's

    async def runner(n: int) -> None:
        name = f"runner-{n}"
        client = StoreClient(f"http://127.0.0.1:{balancers[n % 2].port}", token=token, backoff=0.05)
        try:
            while not stop.is_set():
                claim = await client.dequeue_rollout(worker_id=name)
                _answered(name)
                if claim is None:
                    await asyncio.sleep(0.01)  # the queue is empty for now: ask again until the test says stop
                    continue
                rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
                if report.claims.setdefault(rid, aid) != aid:
                    raise AssertionError(f"rollout {rid} acknowledged to two claims")
                for first in range(0, _SPANS_PER_ROLLOUT, 2):
                    await client.add_spans([make_span(rid, aid, i) for i in range(first, first + 2)])
                    report.acked_spans[rid] = report.acked_spans.get(rid, 0) + 2
                    _answered(name)
                await client.finish_attempt(rid, aid, "succeeded")
                report.finished.add(rid)
                _answered(name)
                if len(report.finished) >= total // 3:
                    kill_now.set()
        finally:
            await client.close()

    def _answered(name: str) -> None:
        if killed.is_set() and name in failed_over:
            report.answered_after_kill[name] = report.answered_after_kill.get(name, 0) + 1
            failed_over[name].set()

    async def killer() -> None:
        await kill_now.wait()
        report.killed_after = len(report.finished)
        await asyncio.to_thread(servers[0].kill)  # SIGKILL: no flush, no goodbye
        killed.set()

    async def supervisor() -> None:
        await killed.wait()
        await trainer.wait_for_rollouts([f"fo-{i:05d}" for i in range(total)], timeout=None)
        for event in failed_over.values():  # every runner of the killed server carried on through the other one
            await event.wait()
        stop.set()

    async with asyncio.TaskGroup() as group:  # a failing runner cancels the rest instead of leaving them waiting
        group.create_task(killer())
        group.create_task(supervisor())
        for n in range(runners):
            group.create_task(runner(n))
