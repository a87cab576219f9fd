"""How runners claim rollouts from a served store: rollouts per second and store requests per rollout, by route.

Run: ``.venv/bin/python benchmarks/claim_bench.py [--rollouts 2000] [--workers 64] [--runners 2]``.

A SQLite store is served over loopback (``agl store serve``, token, access log on); ``--runners`` async runners,
each with ``--workers`` slots, run in one process over `StoreClient`\\ s and drain ``--rollouts`` queued rollouts
with an agent that does nothing but return a reward (the framework's own claim → run → report cycle, no model).
Every request the server answered is counted from its access log, so "requests per rollout" is what a real
network would carry. Ends with one JSON line of every figure. Compare two checkouts by running the same command in
each, one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agentlightning as agl

_REQUEST = re.compile(r'"(GET|POST) (/[^ ?]*)[^"]*" (\d{3})')


@agl.rollout
async def reward_only(task: Any) -> float:
    """The cheapest agent: no model call, one final reward."""
    return float(task["i"] % 2)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _drain(url: str, token: str, args: argparse.Namespace) -> float:
    clients = [agl.StoreClient(url, token=token) for _ in range(args.runners)]
    try:
        runners = [
            agl.Runner(reward_only, client, n_workers=args.workers, stop_when_idle=True, poll_interval=0.05)
            for client in clients
        ]
        start = time.perf_counter()
        await asyncio.gather(*(runner.arun() for runner in runners))
        return time.perf_counter() - start
    finally:
        for client in clients:
            await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=64, help="slots per runner")
    parser.add_argument("--runners", type=int, default=2, help="async runners (one StoreClient each)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agl-claim-bench-") as tmp:
        db, log = Path(tmp) / "store.db", Path(tmp) / "access.log"
        policy = agl.RetryPolicy(max_attempts=1)
        port = _free_port()
        with agl.StoreServerProcess(db, "127.0.0.1", port, retry_policy=policy, access_log=True, log_file=log) as srv:
            trainer = agl.SqliteStore(db, retry_policy=policy)
            requests = [agl.RolloutRequest(input={"i": i}) for i in range(args.rollouts)]
            asyncio.run(trainer.enqueue_rollouts(requests))
            assert srv._proc is not None
            pid = srv._proc.pid
            cpu0, client0 = _cpu_seconds(pid), time.process_time()
            seconds = asyncio.run(_drain(srv.url, srv.token, args))
            server_cpu, client_cpu = _cpu_seconds(pid) - cpu0, time.process_time() - client0
            stats = asyncio.run(trainer.stats())
            asyncio.run(trainer.close())
        routes: collections.Counter[str] = collections.Counter()
        for match in _REQUEST.finditer(log.read_text(errors="replace")):
            routes[match.group(2)] += 1
    done = stats.rollouts.get("succeeded", 0)
    if done != args.rollouts:
        print(f"only {done} of {args.rollouts} rollouts succeeded: {stats.rollouts}", file=sys.stderr)
        return 1
    total = sum(routes.values())
    figures: dict[str, Any] = {
        "rollouts": done,
        "runners": args.runners,
        "workers_per_runner": args.workers,
        "rollouts_per_s": round(done / seconds, 1),
        "requests_per_rollout": round(total / done, 3),
        "claim_requests_per_rollout": round(
            (routes["/v1/rollouts/dequeue"] + routes["/v1/rollouts/dequeue_many"]) / done, 3
        ),
        "server_cpu_ms_per_rollout": round(1000 * server_cpu / done, 3),
        "client_cpu_ms_per_rollout": round(1000 * client_cpu / done, 3),
        "requests_by_route_per_rollout": {route: round(n / done, 3) for route, n in routes.most_common()},
    }
    print(f"{done} rollouts, {args.runners} runners x {args.workers} workers, in {seconds:.2f} s")
    for name in ("rollouts_per_s", "requests_per_rollout", "claim_requests_per_rollout"):
        print(f"  {name:30} {figures[name]}")
    print(f"  {'server / client CPU ms/rollout':30} {figures['server_cpu_ms_per_rollout']} / "
          f"{figures['client_cpu_ms_per_rollout']}")  # fmt: skip
    for route, per in figures["requests_by_route_per_rollout"].items():
        print(f"    {route:40} {per}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
