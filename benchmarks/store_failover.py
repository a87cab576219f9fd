"""Two ``agl store serve`` processes over one PostgreSQL database, one SIGKILLed mid-run (issue 25's full size).

Run: ``.venv/bin/python benchmarks/store_failover.py [--rollouts 2000] [--runners 16] [--db postgresql://...]``
(without ``--db`` a throwaway PostgreSQL server is started here). Runners are split between the two servers
through a TCP load balancer (`agentlightning.testing.run_failover`), each rollout is claimed, gets four spans in two
batches and is finished; a third of the way through, the first server is killed with SIGKILL. Prints the checks
(each rollout claimed exactly once, every acknowledged span and finish stored once, the killed server's runners
carried on) and rollouts/s, then one JSON line. ``tests/test_store_postgres_servers.py`` runs the same, smaller.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator

from agentlightning.testing import FailoverReport, PostgresServer, run_failover


@contextlib.contextmanager
def _schema(db: str | None) -> Iterator[str]:
    if db is not None:
        import uuid

        import psycopg
        from psycopg import sql

        name = f"agl_failover_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        if "options=" in db:  # keep the DSN's own settings (e.g. -csynchronous_commit=off)
            yield db.replace("options=", f"options=-csearch_path%3D{name}%20", 1)
        else:
            yield f"{db}{'&' if '?' in db else '?'}options=-csearch_path%3D{name}"
        return
    with PostgresServer() as server:
        yield server.new_schema()


def _checks(report: FailoverReport, rollouts: int) -> dict[str, bool]:
    return {
        "every rollout succeeded": len(report.rollouts) == rollouts
        and all(r.status == "succeeded" for r in report.rollouts),
        "each rollout claimed exactly once (one attempt, the acknowledged one)": all(
            [a.attempt_id for a in report.attempts[r.rollout_id]] == [report.claims.get(r.rollout_id)]
            for r in report.rollouts
        ),
        "every acknowledged span stored once": all(
            report.spans[r.rollout_id] == report.acked_spans.get(r.rollout_id) == 4 for r in report.rollouts
        ),
        "every acknowledged finish stored": report.finished <= {r.rollout_id for r in report.rollouts},
        "the killed server's runners carried on": bool(report.answered_after_kill)
        and all(n > 0 for n in report.answered_after_kill.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=16)
    parser.add_argument("--db", default=None, help="a PostgreSQL database (default: start a throwaway server)")
    args = parser.parse_args(argv)
    with _schema(args.db) as dsn:
        report = asyncio.run(run_failover(dsn, args.rollouts, args.runners, token="failover-bench-token-0123"))
    checks = _checks(report, args.rollouts)
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    rate = args.rollouts / report.seconds
    print(f"  {args.rollouts} rollouts, {args.runners} runners, server killed after {report.killed_after} finished: "
          f"{report.seconds:.1f} s, {rate:.0f} rollouts/s")  # fmt: skip
    print(json.dumps({"rollouts": args.rollouts, "runners": args.runners, "seconds": round(report.seconds, 2),
                      "rollouts_per_s": round(rate, 1), "killed_after": report.killed_after,
                      "checks_passed": all(checks.values())}))  # fmt: skip
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
