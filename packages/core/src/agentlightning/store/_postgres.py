"""PostgreSQL store: several stateless store servers over one database, for runs beyond one machine.

Every decision the SQLite store takes under its single write lock is taken here in the database, so any number
of processes (``agl store serve --db postgresql://...`` behind a load balancer, trainers, runners) can share one
database: a dequeue claims the oldest queuing rollout with ``FOR UPDATE SKIP LOCKED`` (two servers never claim
the same rollout, and neither waits for the other's claim), finishing, releasing, cancelling and timing out an
attempt lock its rollout's row first, and a request id is remembered in the claim's own transaction, so a client
whose server died mid-request gets the same answer from another one. What a rollout or attempt becomes is
decided by the shared rules of `agentlightning.store._lifecycle`, as for every backend, and run by the SQL
lifecycle it shares with the SQLite store (`agentlightning.store._sql_lifecycle`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

from pydantic_core import from_json

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
from agentlightning.store._base import NotFoundError, RolloutRequest
from agentlightning.store._common import wait_until_finished
from agentlightning.store._lifecycle import not_running, start_attempt
from agentlightning.store._postgres_records import REQUEST_MEMORY_SECONDS, PostgresRecords
from agentlightning.store._postgres_statements import (
    CLAIM_MANY,
    DEQUEUE,
    INSERT_ATTEMPT,
    INSERT_ROLLOUTS,
)
from agentlightning.store._sql_dashboard import POSTGRES
from agentlightning.store._sql_lifecycle import LifecycleSql, SqlLifecycle, enqueue_values
from agentlightning.store._sql_rows import (
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


class PostgresStore(PostgresRecords, SqlLifecycle):
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

    _lifecycle_sql = LifecycleSql.of(POSTGRES)

    def _lock_rollout(self, conn: Any, rollout_id: str) -> Rollout | None:
        return self._get_rollout(conn, rollout_id, lock=True)

    def _running_bounds(self, conn: Any) -> tuple[float | None, float | None]:
        return conn.execute(
            "SELECT MIN(last_heartbeat), MIN(start_time) FROM agl_attempts WHERE status = 'running'"
        ).fetchone()

    def _expired_attempts(self, conn: Any, heartbeat_before: float, started_before: float | None) -> list[Attempt]:
        rows = conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM agl_attempts WHERE status = 'running' "
            "AND (last_heartbeat < %s OR start_time < %s) ORDER BY rollout_id",
            (heartbeat_before, -1.0 if started_before is None else started_before),
        ).fetchall()
        return [attempt_from_row(row) for row in rows]

    def _claim_expired(self, conn: Any, candidate: Attempt) -> Attempt | None:
        """Lock the rollout without waiting (another server busy with it ends or keeps it) and read the attempt again
        under the lock, so an attempt is timed out once even when several servers look at once."""
        locked = conn.execute(
            "SELECT 1 FROM agl_rollouts WHERE rollout_id = %s FOR UPDATE SKIP LOCKED", (candidate.rollout_id,)
        ).fetchone()
        return None if locked is None else self._get_attempt(conn, candidate.rollout_id, candidate.attempt_id)

    # ----------------------------------------------------------------- rollouts

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Queue rollouts (batched, one transaction); returns them in request order."""
        order, values = enqueue_values(requests)  # validated at the boundary (StoreBoundary), as every argument below
        columns: tuple[list[Any], ...] = tuple(map(list, zip(*values, strict=True))) if values else ([],) * 6
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
            attempt = start_attempt(rollout.rollout_id, rollout.retry_count + 1, worker_id, t, attempt_id)
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
            attempt = start_attempt(rollout.rollout_id, rollout.retry_count + 1, worker_id, t)
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
            raise not_running(self._get_attempt(conn, rollout_id, attempt_id))

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
        rollout = await self._write(self._finish, rollout_id, attempt_id, status, error)
        if rollout.status in TERMINAL_ROLLOUT_STATUSES:
            self._notifier.notify()
        return rollout

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""
        return await self._write(self._release, rollout_id, attempt_id)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished (its running attempt is cancelled too)."""
        rollout = await self._write(self._cancel, rollout_id)
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
