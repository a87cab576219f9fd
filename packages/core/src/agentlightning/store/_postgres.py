"""PostgreSQL store: several stateless store servers over one database, for runs beyond one machine.

Every decision the SQLite store takes under its single write lock is taken here in the database, so any number
of processes (``agl store serve --db postgresql://...`` behind a load balancer, trainers, runners) can share one
database: a dequeue claims the oldest queuing rollout with ``FOR UPDATE SKIP LOCKED`` (two servers never claim
the same rollout, and neither waits for the other's claim), finishing, releasing, cancelling and timing out an
attempt lock its rollout's row first, and a request id is remembered in the claim's own transaction, so a client
whose server died mid-request gets the same answer from another one. What a rollout or attempt becomes is
decided by the shared rules of `agentlightning.store._common`, as for every backend.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

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
from agentlightning.store._base import RELEASED, ConflictError, NotFoundError, RolloutRequest
from agentlightning.store._common import (
    rollout_status_after,
    timed_out_status,
    wait_until_finished,
)
from agentlightning.store._postgres_records import REQUEST_MEMORY_SECONDS, PostgresRecords
from agentlightning.store._postgres_statements import (
    CLAIM_MANY,
    DEQUEUE,
    INSERT_ATTEMPT,
    INSERT_ROLLOUTS,
    UPDATE_ROLLOUT,
)
from agentlightning.store._sqlite_schema import (
    ATTEMPT_COLUMNS,
    ROLLOUT_COLUMNS,
    attempt_from_row,
    dump_json,
    rollout_from_row,
)

__all__ = ["REQUEST_MEMORY_SECONDS", "PostgresStore"]

logger = logging.getLogger(__name__)


class _AnsweredMeanwhile(Exception):
    """A `PostgresStore.dequeue_many` whose request id another try remembered first (its transaction is undone)."""


class PostgresStore(PostgresRecords):
    """A `LightningStore` in a PostgreSQL database; any number of processes and servers may share it.

    Needs the driver: ``pip install "agentlightning-core[postgres]"``. The schema (tables prefixed ``agl_``) is
    created in the connection's schema (its ``search_path``) on first open and migrated when an older version of
    this code made it.

    Args:
        dsn: Where the database is, e.g. ``postgresql://user:password@host:5432/dbname`` (libpq's URL or
            ``key=value`` form; its ``options`` may set a ``search_path`` to keep several stores in one database).
        retry_policy: When failed or silent attempts are retried; defaults to `RetryPolicy()`. Processes
            sharing a database should use the same policy.
        pool_size: Most connections this process holds (and calls it runs at once).
        connect_timeout: Seconds to wait for the database when opening and for a pooled connection.
        poll_interval: Seconds between checks in `wait_for_rollouts` for changes made by other processes.

    Raises:
        ImportError: The driver is not installed (the message is the pip command).
        StoreError: The DSN is malformed, the database cannot be reached or logged in to, or its schema is newer
            than this code (one line, without the password).
    """

    def _end_attempt(
        self, conn: Any, attempt: Attempt, status: AttemptStatus, error: str | None, t: float
    ) -> tuple[Attempt, Rollout]:
        """End a running attempt whose rollout row this transaction has locked; move the rollout on."""
        conn.execute(
            "UPDATE agl_attempts SET status = %s, end_time = %s, error = %s WHERE attempt_id = %s",
            (status, t, error, attempt.attempt_id),
        )
        next_status = rollout_status_after(self.retry_policy, status, attempt.sequence)
        row = conn.execute(
            UPDATE_ROLLOUT, (next_status, t, 1 if next_status == "queuing" else 0, attempt.rollout_id)
        ).fetchone()
        return fast_replace(attempt, status=status, end_time=t, error=error), rollout_from_row(row)

    def _expired(self, conn: Any, t: float) -> list[Attempt]:
        """Running attempts (of any server) past a timeout at time ``t`` (see `SqliteStore._expired`)."""
        if t <= self._no_timeout_before:
            return []
        policy = self.retry_policy
        min_heartbeat, min_start = conn.execute(
            "SELECT MIN(last_heartbeat), MIN(start_time) FROM agl_attempts WHERE status = 'running'"
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
        late_start = -1.0 if policy.rollout_timeout is None else t - policy.rollout_timeout
        rows = conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM agl_attempts WHERE status = 'running' "
            "AND (last_heartbeat < %s OR start_time < %s) ORDER BY rollout_id",
            (t - policy.heartbeat_timeout, late_start),
        ).fetchall()
        return [attempt_from_row(row) for row in rows]

    def _apply_timeouts(self, conn: Any, t: float) -> tuple[list[Attempt], bool]:
        """Inside a write transaction: end expired attempts. Returns them and whether a rollout finished.

        Each rollout is locked without waiting (another server busy with it ends or keeps it) and its attempt
        read again under the lock, so an attempt is timed out once even when several servers look at once.
        """
        ended: list[Attempt] = []
        finished = False
        for candidate in self._expired(conn, t):
            locked = conn.execute(
                "SELECT 1 FROM agl_rollouts WHERE rollout_id = %s FOR UPDATE SKIP LOCKED", (candidate.rollout_id,)
            ).fetchone()
            if locked is None:
                continue
            attempt = self._get_attempt(conn, candidate.rollout_id, candidate.attempt_id)
            if attempt.status != "running":
                continue
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
        columns: tuple[list[Any], ...] = ([], [], [], [], [], [])
        order: list[str] = []
        for req in reqs:
            rollout_id = req.rollout_id or new_id("ro")
            order.append(rollout_id)
            if rollout_id in columns[0]:
                continue  # the first request with an id wins, as in one transaction of single inserts
            values = (
                rollout_id,
                dump_json(req.input, "rollout input"),
                req.mode,
                req.group_id,
                req.resources_id,
                dump_json(req.metadata, "rollout metadata"),
            )
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        t = now()

        def write(conn: Any) -> dict[str, Rollout]:
            stored = {row[0]: rollout_from_row(row) for row in conn.execute(INSERT_ROLLOUTS, (t, t, *columns))}
            known = [rollout_id for rollout_id in columns[0] if rollout_id not in stored]
            if known:
                for rollout in self._select_rollouts(conn, "rollout_id = ANY(%s)", (known,)):
                    stored[rollout.rollout_id] = rollout
            return stored

        if not order:
            return []
        stored = await self._write(write)
        return [stored[rollout_id] for rollout_id in order]

    @staticmethod
    def _select_rollouts(conn: Any, where: str, params: Sequence[Any]) -> list[Rollout]:
        cursor = conn.execute(f"SELECT {ROLLOUT_COLUMNS} FROM agl_rollouts WHERE {where} ORDER BY seq", params)
        return [rollout_from_row(row) for row in cursor]

    async def dequeue_rollout(self, worker_id: str | None = None, *, request_id: str | None = None) -> Claim | None:
        """Claim the oldest queuing rollout and start an attempt for it, or ``None`` when the queue is empty.

        With a ``request_id``, the claim is remembered in the database in the same statement: a retried
        request (same id) gets the same rollout and attempt back, through any server sharing the database.
        """
        key = None if request_id is None else "dequeue:" + request_id
        if now() > self._no_timeout_before:  # an attempt may have timed out (of any server): end it first
            await self.check_timeouts()
        unique_violation = self._psycopg.errors.UniqueViolation

        def claim(conn: Any) -> Claim | None:
            t = now()
            attempt_id = new_id("at")
            params = {"t": t, "key": key, "attempt_id": attempt_id, "worker": worker_id}
            try:
                row = conn.execute(DEQUEUE, params).fetchone()
            except unique_violation:  # another try of this request won the race: read its answer
                row = conn.execute(DEQUEUE, {**params, "t": now()}).fetchone()
            if row is None:
                if key is not None:
                    self._count_request(conn, t)
                return None
            if row[0] is None:  # a request answered before: the same answer
                return self._replay_claim(conn, row[10])
            rollout = rollout_from_row(row)
            attempt = Attempt(
                rollout_id=rollout.rollout_id,
                attempt_id=attempt_id,
                sequence=rollout.retry_count + 1,
                worker_id=worker_id,
                start_time=t,
                last_heartbeat=t,
            )
            if key is not None:
                self._count_request(conn, t)
            return Claim(rollout=rollout, attempt=attempt)

        return await self._write_statement(claim)

    async def dequeue_many(self, worker_ids: Sequence[str | None], *, request_id: str | None = None) -> list[Claim]:
        """Claim up to ``len(worker_ids)`` queuing rollouts in one transaction, the i-th for ``worker_ids[i]``.

        With a ``request_id``, the claims are remembered in the same transaction: a retried request gets the same
        claims back through any server sharing the database (two tries racing: the second one replays the first).
        """
        workers = worker_ids  # checked at the boundary (StoreBoundary)
        key = None if request_id is None else "dequeue_many:" + request_id
        if not workers:
            return []
        if now() > self._no_timeout_before:
            await self.check_timeouts()
        try:
            return await self._write(self._claim_many, workers, key)
        except _AnsweredMeanwhile:
            return await self._write(self._claim_many, workers, key)

    def _claim_many(self, conn: Any, workers: list[str | None], key: str | None) -> list[Claim]:
        if key is not None:
            seen = conn.execute("SELECT result FROM agl_requests WHERE request_id = %s", (key,)).fetchone()
            if seen is not None:
                return [self._claim_of(conn, rollout_id, attempt_id) for rollout_id, attempt_id in from_json(seen[0])]
        t = now()
        rows = sorted(conn.execute(CLAIM_MANY, {"t": t, "n": len(workers)}).fetchall(), key=lambda row: row[-1])
        claims: list[Claim] = []
        for row, worker_id in zip(rows, workers, strict=False):
            rollout = rollout_from_row(row)
            attempt = Attempt(
                rollout_id=rollout.rollout_id,
                attempt_id=new_id("at"),
                sequence=rollout.retry_count + 1,
                worker_id=worker_id,
                start_time=t,
                last_heartbeat=t,
            )
            claims.append(Claim(rollout=rollout, attempt=attempt))
        if claims:
            conn.cursor().executemany(
                INSERT_ATTEMPT,
                [(a.rollout_id, a.attempt_id, a.sequence, a.worker_id, t, t, c.rollout.mode) for c in claims
                 for a in (c.attempt,)],
            )  # fmt: skip
        if key is not None:
            ids = dump_json([[c.rollout.rollout_id, c.attempt.attempt_id] for c in claims], "claims")
            inserted = conn.execute(
                "INSERT INTO agl_requests (request_id, result, created_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (request_id) DO NOTHING RETURNING request_id",
                (key, ids, t),
            ).fetchone()
            if inserted is None:  # another try of this request committed first: roll this one back, replay it
                raise _AnsweredMeanwhile
            self._count_request(conn, t)
        return claims

    def _claim_of(self, conn: Any, rollout_id: str, attempt_id: str) -> Claim:
        rollout = self._get_rollout(conn, rollout_id)
        return Claim(rollout=rollout, attempt=self._get_attempt(conn, rollout_id, attempt_id))

    def _replay_claim(self, conn: Any, result: str) -> Claim | None:
        ids = from_json(result)
        if ids is None:
            return None
        return Claim(rollout=self._get_rollout(conn, ids[0]), attempt=self._get_attempt(conn, ids[0], ids[1]))

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record a sign of life; raises `ConflictError` if the attempt is no longer running."""

        def write(conn: Any) -> Attempt:
            row = conn.execute(
                "UPDATE agl_attempts SET last_heartbeat = GREATEST(last_heartbeat, %s) "
                f"WHERE attempt_id = %s AND rollout_id = %s AND status = 'running' RETURNING {ATTEMPT_COLUMNS}",
                (now(), attempt_id, rollout_id),
            ).fetchone()
            if row is not None:
                return attempt_from_row(row)
            attempt = self._get_attempt(conn, rollout_id, attempt_id)
            raise ConflictError(f"attempt {attempt_id!r} is {attempt.status}, not running")

        return await self._write(write)

    async def heartbeat_many(self, attempts: Sequence[tuple[str, str]]) -> list[Attempt]:
        """Record a sign of life for several attempts in one transaction; those not running come back unchanged."""
        refs = list(attempts)  # checked by the store boundary

        def write(conn: Any) -> list[Attempt]:
            t = now()
            out: list[Attempt] = []
            for rollout_id, attempt_id in refs:
                row = conn.execute(
                    "UPDATE agl_attempts SET last_heartbeat = GREATEST(last_heartbeat, %s) "
                    f"WHERE attempt_id = %s AND rollout_id = %s AND status = 'running' RETURNING {ATTEMPT_COLUMNS}",
                    (t, attempt_id, rollout_id),
                ).fetchone()
                # not running: as stored (an unknown id raises, and the transaction is undone)
                out.append(self._get_attempt(conn, rollout_id, attempt_id) if row is None else attempt_from_row(row))
            return out

        return await self._write(write) if refs else []

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None = None
    ) -> Rollout:
        """End an attempt and move its rollout on according to the retry policy."""
        if error is not None and not isinstance(cast(Any, error), str):
            raise ValueError(f"error must be a string or None, got {type(error).__name__}")

        def write(conn: Any) -> Rollout:
            current = self._get_rollout(conn, rollout_id, lock=True)
            attempt = self._get_attempt(conn, rollout_id, attempt_id)
            if attempt.status != "running":
                if attempt.status == status:
                    return current
                raise ConflictError(
                    f"attempt {attempt_id!r} already ended as {attempt.status}; cannot finish it as {status}"
                )
            return self._end_attempt(conn, attempt, status, error, now())[1]

        rollout = await self._write(write)
        if rollout.status in TERMINAL_ROLLOUT_STATUSES:
            self._notifier.notify()
        return rollout

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""

        def write(conn: Any) -> Rollout:
            current = self._get_rollout(conn, rollout_id, lock=True)
            attempt = self._get_attempt(conn, rollout_id, attempt_id)
            if attempt.status != "running":
                return current
            t = now()
            conn.execute(
                "UPDATE agl_attempts SET status = 'cancelled', end_time = %s, error = %s WHERE attempt_id = %s",
                (t, RELEASED, attempt_id),
            )
            return rollout_from_row(conn.execute(UPDATE_ROLLOUT, ("queuing", t, 1, rollout_id)).fetchone())

        return await self._write(write)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished (its running attempt is cancelled too)."""

        def write(conn: Any) -> Rollout:
            rollout = self._get_rollout(conn, rollout_id, lock=True)
            if rollout.status == "cancelled":
                return rollout
            if rollout.status in TERMINAL_ROLLOUT_STATUSES:
                raise ConflictError(f"rollout {rollout_id!r} already {rollout.status}; cannot cancel it")
            t = now()
            conn.execute(
                "UPDATE agl_attempts SET status = 'cancelled', end_time = %s "
                "WHERE rollout_id = %s AND status = 'running'",
                (t, rollout_id),
            )
            return rollout_from_row(conn.execute(UPDATE_ROLLOUT, ("cancelled", t, 0, rollout_id)).fetchone())

        rollout = await self._write(write)
        self._notifier.notify()
        return rollout

    async def check_timeouts(self) -> list[Attempt]:
        """Apply heartbeat/rollout timeouts now; returns the attempts that were ended."""
        if not await self._read(self._expired, now()):  # the common case: nothing to do, no transaction
            return []
        ended, finished = await self._write(self._apply_timeouts, now())
        if finished:
            self._notifier.notify()
        return ended

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; raises `NotFoundError`."""
        return await self._read(self._get_rollout, rollout_id)

    async def query_rollouts(
        self, status: Sequence[RolloutStatus] | None = None, rollout_ids: Sequence[str] | None = None
    ) -> list[Rollout]:
        """Rollouts filtered by status and/or ids, in enqueue order."""
        statuses, ids = status, rollout_ids
        clauses: list[str] = []
        params: list[Any] = []
        if statuses is not None:
            clauses.append("status = ANY(%s)")
            params.append(statuses)
        if ids is not None:
            clauses.append("rollout_id = ANY(%s)")
            params.append(ids)
        return await self._read(self._select_rollouts, " AND ".join(clauses) or "TRUE", params)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout in order."""

        def read(conn: Any) -> list[Attempt]:
            self._get_rollout(conn, rollout_id)
            cursor = conn.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM agl_attempts WHERE rollout_id = %s ORDER BY sequence", (rollout_id,)
            )
            return [attempt_from_row(row) for row in cursor]

        return await self._read(read)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until the rollouts reach a terminal status or ``timeout`` seconds pass; returns the finished ones.

        Changes made through this object wake the waiter at once; changes made through other servers are seen
        within ``poll_interval``.
        """
        ids = rollout_ids

        def check_known(conn: Any) -> None:
            cursor = conn.execute("SELECT rollout_id FROM agl_rollouts WHERE rollout_id = ANY(%s)", (ids,))
            found = {row[0] for row in cursor}
            for rollout_id in ids:
                if rollout_id not in found:
                    raise NotFoundError(f"rollout {rollout_id!r} not found")

        await self._read(check_known)
        terminal = sorted(TERMINAL_ROLLOUT_STATUSES)

        def finished_among(conn: Any) -> set[str]:
            cursor = conn.execute(
                "SELECT rollout_id FROM agl_rollouts WHERE rollout_id = ANY(%s) AND status = ANY(%s)", (ids, terminal)
            )
            return {row[0] for row in cursor}

        async def poll() -> tuple[list[str], bool]:
            await self.check_timeouts()
            done = await self._read(finished_among)
            finished = [i for i in ids if i in done]
            return finished, len(finished) == len(ids)

        finished_ids = await wait_until_finished(self._notifier, poll, timeout, self._poll_interval)
        if not finished_ids:
            return []
        by_id = {r.rollout_id: r for r in await self.query_rollouts(rollout_ids=finished_ids)}
        return [by_id[i] for i in finished_ids]
