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
    new_id,
    now,
)
from agentlightning.store._base import (
    RELEASED,
    ConflictError,
    RolloutRequest,
)
from agentlightning.store._common import (
    rollout_status_after,
    timed_out_status,
    wait_until_finished,
)
from agentlightning.store._sqlite_records import REQUEST_MEMORY_SECONDS, SqliteRecords
from agentlightning.store._sqlite_schema import (
    ATTEMPT_COLUMNS,
    ROLLOUT_COLUMNS,
    attempt_from_row,
    dump_json,
    rollout_from_row,
)

__all__ = ["REQUEST_MEMORY_SECONDS", "SqliteStore"]

logger = logging.getLogger(__name__)

# Hot statements as constants: one string object each, so sqlite3's statement cache finds them without rebuilding.
_INSERT_ROLLOUT = (
    f"INSERT OR IGNORE INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
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


class SqliteStore(SqliteRecords):
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

    def reopen_spec(self) -> tuple[type[SqliteStore], dict[str, Any]]:
        """A picklable ``(cls, kwargs)`` with which another process opens this store: ``cls(**kwargs)``."""
        return SqliteStore, {
            "path": str(self.path),
            "retry_policy": self.retry_policy,
            "synchronous": self.synchronous,
            "busy_timeout": self._busy_timeout,
            "poll_interval": self._poll_interval,
        }

    def _replay_claim(self, conn: sqlite3.Connection, result: str) -> Claim | None:
        ids = from_json(result)
        return None if ids is None else self._claim_of(conn, ids[0], ids[1])

    def _claim_of(self, conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> Claim:
        rollout = self._get_rollout(conn, rollout_id)
        return Claim(rollout=rollout, attempt=self._get_attempt(conn, rollout_id, attempt_id))

    def _end_attempt(
        self, conn: sqlite3.Connection, attempt: Attempt, status: AttemptStatus, error: str | None, t: float
    ) -> tuple[Attempt, Rollout]:
        conn.execute(
            "UPDATE attempts SET status = ?, end_time = ?, error = ? WHERE attempt_id = ?",
            (status, t, error, attempt.attempt_id),
        )
        next_status = rollout_status_after(self.retry_policy, status, attempt.sequence)
        row = conn.execute(
            "UPDATE rollouts SET status = ?, updated_at = ?, retry_count = retry_count + ? WHERE rollout_id = ? "
            f"RETURNING {ROLLOUT_COLUMNS}",
            (next_status, t, 1 if next_status == "queuing" else 0, attempt.rollout_id),
        ).fetchone()
        return fast_replace(attempt, status=status, end_time=t, error=error), rollout_from_row(row)

    def _expired(self, conn: sqlite3.Connection, t: float) -> list[Attempt]:
        """Running attempts (of any process) past a timeout at time ``t``.

        Heartbeats only push deadlines later and an attempt started after ``t0`` cannot expire before
        ``t0 + timeout``, so the earliest deadline seen now is a lower bound that stays valid across
        processes (sharing one policy); until it passes, dequeues skip this query.
        """
        if t <= self._no_timeout_before:
            return []
        policy = self.retry_policy
        min_heartbeat, min_start = conn.execute(
            "SELECT (SELECT MIN(last_heartbeat) FROM attempts WHERE status = 'running'), "
            "(SELECT MIN(start_time) FROM attempts WHERE status = 'running')"
        ).fetchone()
        bound = t + min(policy.heartbeat_timeout, policy.rollout_timeout or policy.heartbeat_timeout)
        if min_heartbeat is not None:
            bound = min(bound, min_heartbeat + policy.heartbeat_timeout)
        if min_start is not None and policy.rollout_timeout is not None:
            bound = min(bound, min_start + policy.rollout_timeout)
        if t <= bound:
            self._no_timeout_before = bound
            return []
        self._no_timeout_before = 0.0
        rows = conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE status = 'running' AND last_heartbeat < ?",
            (t - policy.heartbeat_timeout,),
        ).fetchall()
        if policy.rollout_timeout is not None:
            rows += conn.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE status = 'running' AND start_time < ?",
                (t - policy.rollout_timeout,),
            ).fetchall()
        unique = {row[1]: row for row in rows}
        return [attempt_from_row(row) for row in unique.values()]

    def _apply_timeouts(self, conn: sqlite3.Connection, t: float) -> tuple[list[Attempt], bool]:
        """Inside a write transaction: end expired attempts. Returns them and whether a rollout finished."""
        ended: list[Attempt] = []
        finished = False
        for attempt in self._expired(conn, t):
            status = timed_out_status(self.retry_policy, attempt.start_time, attempt.last_heartbeat, t)
            if status is None:
                continue
            done, rollout = self._end_attempt(conn, attempt, status, None, t)
            ended.append(done)
            finished = finished or rollout.status in TERMINAL_ROLLOUT_STATUSES
        return ended, finished

    # ----------------------------------------------------------------- rollouts

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Queue rollouts (batched, one transaction); returns them in request order."""
        reqs = requests  # validated at the boundary (StoreBoundary), as every argument below
        t = now()
        rows = [
            (
                req.rollout_id or new_id("ro"),
                "queuing",
                dump_json(req.input, "rollout input"),
                req.mode,
                req.group_id,
                req.resources_id,
                0,
                t,
                t,
                dump_json(req.metadata, "rollout metadata"),
            )
            for req in reqs
        ]
        stored: dict[str, Any] = {}
        with self._write as conn:
            # RETURNING hands back each new row in the same statement; only ids that were already stored
            # (a repeated enqueue) need a second read.
            for row in rows:
                if row[0] not in stored:
                    stored[row[0]] = conn.execute(_INSERT_ROLLOUT, row).fetchone()
            known = [rollout_id for rollout_id, got in stored.items() if got is None]
            if known:
                where = "rollout_id IN (SELECT value FROM json_each(?))"
                for rollout in self._select_rollouts(conn, where, (dump_json(known, "ids"),)):
                    stored[rollout.rollout_id] = rollout
        for rollout_id, got in stored.items():
            if not isinstance(got, Rollout):
                stored[rollout_id] = rollout_from_row(got)
        return [stored[row[0]] for row in rows]

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
        attempt = Attempt(
            rollout_id=rollout.rollout_id,
            attempt_id=new_id("at"),
            sequence=sequence,
            worker_id=worker_id,
            start_time=t,
            last_heartbeat=t,
        )
        row = (attempt.rollout_id, attempt.attempt_id, sequence, worker_id, "running", t, None, t, None, rollout.mode)
        conn.execute(_INSERT_ATTEMPT, row)
        return Claim(rollout=rollout, attempt=attempt)

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record a sign of life; raises `ConflictError` if the attempt is no longer running."""
        with self._write as conn:
            attempt = self._get_attempt(conn, rollout_id, attempt_id)
            if attempt.status != "running":
                raise ConflictError(f"attempt {attempt_id!r} is {attempt.status}, not running")
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
            attempt = self._get_attempt(conn, rollout_id, attempt_id)
            if attempt.status != "running":
                if attempt.status == status:
                    return self._get_rollout(conn, rollout_id)
                raise ConflictError(
                    f"attempt {attempt_id!r} already ended as {attempt.status}; cannot finish it as {status}"
                )
            _, rollout = self._end_attempt(conn, attempt, status, error, now())
        if rollout.status in TERMINAL_ROLLOUT_STATUSES:
            self._notifier.notify()
        return rollout

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""
        with self._write as conn:
            attempt = self._get_attempt(conn, rollout_id, attempt_id)
            if attempt.status != "running":
                return self._get_rollout(conn, rollout_id)
            t = now()
            conn.execute(
                "UPDATE attempts SET status = 'cancelled', end_time = ?, error = ? WHERE attempt_id = ?",
                (t, RELEASED, attempt_id),
            )
            row = conn.execute(
                "UPDATE rollouts SET status = 'queuing', updated_at = ?, retry_count = retry_count + 1 "
                f"WHERE rollout_id = ? RETURNING {ROLLOUT_COLUMNS}",
                (t, rollout_id),
            ).fetchone()
        return rollout_from_row(row)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished (its running attempt is cancelled too)."""
        with self._write as conn:
            rollout = self._get_rollout(conn, rollout_id)
            if rollout.status == "cancelled":
                return rollout
            if rollout.status in TERMINAL_ROLLOUT_STATUSES:
                raise ConflictError(f"rollout {rollout_id!r} already {rollout.status}; cannot cancel it")
            t = now()
            conn.execute(
                "UPDATE attempts SET status = 'cancelled', end_time = ? WHERE rollout_id = ? AND status = 'running'",
                (t, rollout_id),
            )
            conn.execute(
                "UPDATE rollouts SET status = 'cancelled', updated_at = ? WHERE rollout_id = ?", (t, rollout_id)
            )
            rollout = fast_replace(rollout, status="cancelled", updated_at=t)
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
