"""SQLite store: the embedded default. One file, WAL, safe to share between processes.

Every awaited write commits before it returns, so whatever a caller saw acknowledged survives the process
being killed. State changes that must be atomic across processes (dequeue, finish, timeouts, new resources
version) run in ``BEGIN IMMEDIATE`` transactions, which take SQLite's single write lock up front.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from agentlightning._fast import fast_replace
from agentlightning._models import (
    TERMINAL_ROLLOUT_STATUSES,
    Attempt,
    AttemptStatus,
    Claim,
    Rollout,
    RolloutStatus,
    now,
)
from agentlightning.store._base import RolloutRequest
from agentlightning.store._common import wait_until_finished
from agentlightning.store._lifecycle import not_running, start_attempt
from agentlightning.store._sql_dashboard import SQLITE
from agentlightning.store._sql_lifecycle import LifecycleSql, SqlLifecycle, enqueue_values
from agentlightning.store._sql_rows import (
    ATTEMPT_COLUMNS,
    ROLLOUT_COLUMNS,
    attempt_from_row,
    dump_json,
    rollout_from_row,
)
from agentlightning.store._sqlite_records import REQUEST_MEMORY_SECONDS, SqliteRecords

__all__ = ["REQUEST_MEMORY_SECONDS", "SqliteStore"]

logger = logging.getLogger(__name__)

# Hot statements as constants: one string object each, so sqlite3's statement cache finds them without rebuilding.
_INSERT_ROLLOUT = (
    f"INSERT OR IGNORE INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?, 'queuing', ?, ?, ?, ?, 0, ?, ?, ?) "
    f"RETURNING {ROLLOUT_COLUMNS}"
)
_CLAIM_OLDEST = (
    "UPDATE rollouts SET status = 'running', updated_at = ? WHERE seq = "
    f"(SELECT seq FROM rollouts WHERE status = 'queuing' ORDER BY seq LIMIT 1) RETURNING {ROLLOUT_COLUMNS}"
)
_FINISHED_AMONG = (
    "SELECT rollout_id FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?)) "
    "AND status IN (SELECT value FROM json_each(?))"
)
# an attempt keeps its rollout's mode, so dashboard statistics read one table
_INSERT_ATTEMPT = f"INSERT INTO attempts ({ATTEMPT_COLUMNS}, mode) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


class SqliteStore(SqliteRecords, SqlLifecycle):
    """A `LightningStore` in one SQLite file (WAL mode); several processes may open the same file.

    Args:
        path: Database file (created with its schema if missing).
        retry_policy: When failed or silent attempts are retried; defaults to `RetryPolicy()`. Processes
            sharing a file should use the same policy.
        synchronous: ``NORMAL`` (default) survives the process being killed; ``FULL`` also survives power
            loss, at the cost of an fsync per commit.
        busy_timeout: Seconds to wait for another process's write lock before failing.
        poll_interval: Seconds between checks in `wait_for_rollouts` for changes made by other processes.
    """

    _lifecycle_sql = LifecycleSql.of(SQLITE)

    def reopen_spec(self) -> tuple[type[SqliteStore], dict[str, Any]]:
        """A picklable ``(cls, kwargs)`` with which another process opens this store: ``cls(**kwargs)``."""
        return SqliteStore, {
            "path": str(self.path),
            "retry_policy": self.retry_policy,
            "synchronous": self.synchronous,
            "busy_timeout": self._busy_timeout,
            "poll_interval": self._poll_interval,
        }

    def _lock_rollout(self, conn: sqlite3.Connection, rollout_id: str) -> Rollout | None:
        return None  # the write transaction (BEGIN IMMEDIATE) already excludes every other writer

    def _running_bounds(self, conn: sqlite3.Connection) -> tuple[float | None, float | None]:
        # two subqueries: each a walk of one end of the partial index of running attempts
        return conn.execute(
            "SELECT (SELECT MIN(last_heartbeat) FROM attempts WHERE status = 'running'), "
            "(SELECT MIN(start_time) FROM attempts WHERE status = 'running')"
        ).fetchone()

    def _expired_attempts(
        self, conn: sqlite3.Connection, heartbeat_before: float, started_before: float | None
    ) -> list[Attempt]:
        rows = conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE status = 'running' AND last_heartbeat < ?",
            (heartbeat_before,),
        ).fetchall()
        if started_before is not None:
            rows += conn.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE status = 'running' AND start_time < ?",
                (started_before,),
            ).fetchall()
        unique = {row[1]: row for row in rows}
        return [attempt_from_row(row) for row in unique.values()]

    def _claim_expired(self, conn: sqlite3.Connection, candidate: Attempt) -> Attempt | None:
        return candidate  # read in this transaction, which no other writer can enter

    # ----------------------------------------------------------------- rollouts

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Queue rollouts (batched, one transaction); returns them in request order."""
        order, values = enqueue_values(requests)  # validated at the boundary (StoreBoundary), as every argument below
        t = now()
        stored: dict[str, Any] = {}
        with self._write as conn:
            # RETURNING hands back each new row in the same statement; only ids that were already stored
            # (a repeated enqueue) need a second read.
            for row in values:
                stored[row[0]] = conn.execute(_INSERT_ROLLOUT, (*row[:5], t, t, row[5])).fetchone()
            known = [rollout_id for rollout_id, got in stored.items() if got is None]
            if known:
                where = "rollout_id IN (SELECT value FROM json_each(?))"
                for rollout in self._select_rollouts(conn, where, (dump_json(known, "ids"),)):
                    stored[rollout.rollout_id] = rollout
        for rollout_id, got in stored.items():
            if not isinstance(got, Rollout):
                stored[rollout_id] = rollout_from_row(got)
        return [stored[rollout_id] for rollout_id in order]

    def _select_rollouts(self, conn: sqlite3.Connection, where: str, params: Sequence[Any]) -> list[Rollout]:
        cursor = conn.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE {where} ORDER BY seq", params)
        return [rollout_from_row(row) for row in cursor]

    async def dequeue_rollout(self, worker_id: str | None = None, *, request_id: str | None = None) -> Claim | None:
        """Claim the oldest queuing rollout and start an attempt for it, or ``None`` when the queue is empty.

        With a ``request_id``, the claim is remembered in the database in the same transaction: a retried
        request (same id) gets the same rollout and attempt back, even after the server restarted.
        """
        key = None if request_id is None else "dequeue:" + request_id
        finished = False
        claim: Claim | None = None
        with self._write as conn:
            if key is not None:
                seen = self._seen_request(conn, key)
                if seen is not None:
                    return self._replay_claim(conn, seen)
            t = now()  # taken under the write lock, so start times are in commit order across processes
            _, finished = self._apply_timeouts(conn, t)
            claim = self._claim_oldest(conn, worker_id, t)
            if key is not None:
                ids = None if claim is None else [claim.rollout.rollout_id, claim.attempt.attempt_id]
                self._remember_request(conn, key, dump_json(ids, "claim"), t)
        if finished:
            self._notifier.notify()
        return claim

    async def dequeue_many(self, worker_ids: Sequence[str | None], *, request_id: str | None = None) -> list[Claim]:
        """Claim up to ``len(worker_ids)`` queuing rollouts in one transaction, the i-th for ``worker_ids[i]``.

        With a ``request_id``, the claims are remembered in the same transaction (as in `dequeue_rollout`).
        """
        workers = worker_ids  # checked at the boundary (StoreBoundary)
        key = None if request_id is None else "dequeue_many:" + request_id
        finished = False
        claims: list[Claim] = []
        with self._write as conn:
            if key is not None:
                seen = self._seen_request(conn, key)
                if seen is not None:
                    return [self._claim_of(conn, rollout_id, attempt_id) for rollout_id, attempt_id in from_json(seen)]
            t = now()
            if workers:
                _, finished = self._apply_timeouts(conn, t)
            for worker_id in workers:
                claim = self._claim_oldest(conn, worker_id, t)
                if claim is None:
                    break
                claims.append(claim)
            if key is not None:
                ids = [[c.rollout.rollout_id, c.attempt.attempt_id] for c in claims]
                self._remember_request(conn, key, dump_json(ids, "claims"), t)
        if finished:
            self._notifier.notify()
        return claims

    def _claim_oldest(self, conn: sqlite3.Connection, worker_id: str | None, t: float) -> Claim | None:
        """Move the oldest queuing rollout to running and start its attempt (inside the caller's transaction)."""
        row = conn.execute(_CLAIM_OLDEST, (t,)).fetchone()
        if row is None:
            return None
        rollout = rollout_from_row(row)
        sequence = rollout.retry_count + 1  # every requeue adds one; the unique index guards it
        attempt = start_attempt(rollout.rollout_id, sequence, worker_id, t)
        row = (attempt.rollout_id, attempt.attempt_id, sequence, worker_id, "running", t, None, t, None, rollout.mode)
        conn.execute(_INSERT_ATTEMPT, row)
        return Claim(rollout=rollout, attempt=attempt)

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record a sign of life; raises `ConflictError` if the attempt is no longer running."""
        with self._write as conn:
            attempt = self._get_attempt(conn, rollout_id, attempt_id)
            if attempt.status != "running":
                raise not_running(attempt)
            t = max(now(), attempt.last_heartbeat)
            conn.execute("UPDATE attempts SET last_heartbeat = ? WHERE attempt_id = ?", (t, attempt_id))
        return fast_replace(attempt, last_heartbeat=t)

    async def heartbeat_many(self, attempts: Sequence[tuple[str, str]]) -> list[Attempt]:
        """Record a sign of life for several attempts in one transaction; those not running come back unchanged."""
        refs = list(attempts)  # checked by the store boundary
        out: list[Attempt] = []
        with self._write as conn:
            t = now()
            for rollout_id, attempt_id in refs:
                attempt = self._get_attempt(conn, rollout_id, attempt_id)  # unknown: raises, the transaction undone
                if attempt.status == "running":
                    beat = max(t, attempt.last_heartbeat)
                    conn.execute("UPDATE attempts SET last_heartbeat = ? WHERE attempt_id = ?", (beat, attempt_id))
                    attempt = fast_replace(attempt, last_heartbeat=beat)
                out.append(attempt)
        return out

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None = None
    ) -> Rollout:
        """End an attempt and move its rollout on according to the retry policy."""
        with self._write as conn:
            rollout = self._finish(conn, rollout_id, attempt_id, status, error)
        if rollout.status in TERMINAL_ROLLOUT_STATUSES:
            self._notifier.notify()
        return rollout

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""
        with self._write as conn:
            return self._release(conn, rollout_id, attempt_id)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished (its running attempt is cancelled too)."""
        with self._write as conn:
            rollout = self._cancel(conn, rollout_id)
        self._notifier.notify()
        return rollout

    async def check_timeouts(self) -> list[Attempt]:
        """Apply heartbeat/rollout timeouts now; returns the attempts that were ended."""
        with self._read as conn:
            if not self._expired(conn, now()):  # the common case: nothing to do, no write lock taken
                return []
        with self._write as conn:
            ended, finished = self._apply_timeouts(conn, now())
        if finished:
            self._notifier.notify()
        return ended

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; raises `NotFoundError`."""
        with self._read as conn:
            return self._get_rollout(conn, rollout_id)

    async def query_rollouts(
        self, status: Sequence[RolloutStatus] | None = None, rollout_ids: Sequence[str] | None = None
    ) -> list[Rollout]:
        """Rollouts filtered by status and/or ids, in enqueue order."""
        statuses, ids = status, rollout_ids
        clauses: list[str] = []
        params: list[Any] = []
        if statuses is not None:
            clauses.append("status IN (SELECT value FROM json_each(?))")
            params.append(dump_json(statuses, "status"))
        if ids is not None:
            clauses.append("rollout_id IN (SELECT value FROM json_each(?))")
            params.append(dump_json(ids, "rollout_ids"))
        with self._read as conn:
            return self._select_rollouts(conn, " AND ".join(clauses) or "1", params)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout in order."""
        with self._read as conn:
            self._get_rollout(conn, rollout_id)
            cursor = conn.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? ORDER BY sequence", (rollout_id,)
            )
            return [attempt_from_row(row) for row in cursor]

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until the rollouts reach a terminal status or ``timeout`` seconds pass; returns the finished ones.

        Changes made through this object wake the waiter at once; changes made by other processes are seen
        within ``poll_interval``.
        """
        ids = rollout_ids
        with self._read as conn:
            for rollout_id in ids:
                self._get_rollout(conn, rollout_id)

        # Each poll reads only the ids that finished (a trainer polls many times a second while runners work; building
        # every rollout's model each time cost it a sizeable share of a CPU the runners needed); full rows once done.
        params = (dump_json(ids, "rollout_ids"), dump_json(sorted(TERMINAL_ROLLOUT_STATUSES), "status"))

        async def poll() -> tuple[list[str], bool]:
            await self.check_timeouts()
            with self._read as conn:
                done = {row[0] for row in conn.execute(_FINISHED_AMONG, params)}
            finished = [i for i in ids if i in done]
            return finished, len(finished) == len(ids)

        finished_ids = await wait_until_finished(self._notifier, poll, timeout, self._poll_interval)
        if not finished_ids:
            return []
        by_id = {r.rollout_id: r for r in await self.query_rollouts(rollout_ids=finished_ids)}
        return [by_id[i] for i in finished_ids]
