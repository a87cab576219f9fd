"""The rollout lifecycle in SQL, once for the SQLite and PostgreSQL stores: end, release, cancel, time out, enqueue.

`SqlLifecycle` runs the decisions of `agentlightning.store._lifecycle` on a connection, inside a transaction the
store opened (SQLite: ``BEGIN IMMEDIATE``, its single writer; PostgreSQL: one transaction per call). The dialects
differ only in statement text (`LifecycleSql`, built from the store's `SqlDialect`) and in a few hooks: how a
rollout is locked for a change, and how running attempts past a timeout are found and claimed for ending.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic_core import from_json

from agentlightning._fast import fast_replace
from agentlightning._models import TERMINAL_ROLLOUT_STATUSES, Attempt, AttemptStatus, Claim, Rollout, new_id, now
from agentlightning.store._base import RELEASED, RetryPolicy, RolloutRequest
from agentlightning.store._lifecycle import (
    CANCEL,
    RELEASE,
    RolloutMove,
    after_attempt,
    cancel_is_repeat,
    finish_is_repeat,
    no_timeout_before,
    timed_out_status,
)
from agentlightning.store._sql_dashboard import SqlDialect
from agentlightning.store._sql_rows import ROLLOUT_COLUMNS, dump_json, rollout_from_row

__all__ = ["LifecycleSql", "SqlLifecycle", "enqueue_values"]


@dataclass(frozen=True)
class LifecycleSql:
    """The lifecycle's statements in one dialect (built once: drivers cache statements by their text).

    Attributes:
        end_attempt: Parameters ``(status, end_time, error, attempt_id)``.
        move_rollout: Parameters ``(status, updated_at, retries, rollout_id)``; returns the row's `ROLLOUT_COLUMNS`.
        cancel_attempts: Parameters ``(end_time, rollout_id)``: every running attempt of the rollout ends cancelled.
    """

    end_attempt: str
    move_rollout: str
    cancel_attempts: str

    @classmethod
    def of(cls, d: SqlDialect) -> LifecycleSql:
        """The statements with ``d``'s parameter marker and table names."""
        p, attempts, rollouts = d.param, f"{d.prefix}attempts", f"{d.prefix}rollouts"
        return cls(
            end_attempt=f"UPDATE {attempts} SET status = {p}, end_time = {p}, error = {p} WHERE attempt_id = {p}",
            move_rollout=(
                f"UPDATE {rollouts} SET status = {p}, updated_at = {p}, retry_count = retry_count + {p} "
                f"WHERE rollout_id = {p} RETURNING {ROLLOUT_COLUMNS}"
            ),
            cancel_attempts=(
                f"UPDATE {attempts} SET status = 'cancelled', end_time = {p} "
                f"WHERE rollout_id = {p} AND status = 'running'"
            ),
        )


def enqueue_values(requests: Sequence[RolloutRequest]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The rollout id of each request (a new one where it has none), and the values to insert for each new id.

    Values are ``(rollout_id, input, mode, group_id, resources_id, metadata)`` (JSON text for input and metadata),
    once per id: the first request with an id wins, as in one transaction of single inserts.
    """
    order: list[str] = []
    values: dict[str, tuple[Any, ...]] = {}
    for req in requests:
        rollout_id = req.rollout_id or new_id("ro")
        order.append(rollout_id)
        if rollout_id not in values:
            values[rollout_id] = (
                rollout_id,
                dump_json(req.input, "rollout input"),
                req.mode,
                req.group_id,
                req.resources_id,
                dump_json(req.metadata, "rollout metadata"),
            )
    return order, list(values.values())


class SqlLifecycle:
    """The attempt and rollout state changes of a SQL store (a base class of `SqliteStore` and `PostgresStore`).

    Every method takes the connection of a write transaction the store opened. The store supplies the statements
    (``_lifecycle_sql``), its `retry_policy`, the reads ``_get_rollout`` / ``_get_attempt`` and the hooks below.
    """

    _lifecycle_sql: ClassVar[LifecycleSql]
    retry_policy: RetryPolicy
    # No running attempt (of any process or server) can time out before this moment; see `_expired`.
    _no_timeout_before: float

    def _get_rollout(self, conn: Any, rollout_id: str) -> Rollout:
        raise NotImplementedError

    def _get_attempt(self, conn: Any, rollout_id: str, attempt_id: str) -> Attempt:
        raise NotImplementedError

    def _lock_rollout(self, conn: Any, rollout_id: str) -> Rollout | None:
        """Lock the rollout's row for a change and return it, or ``None`` where the transaction already excludes
        every other writer (the row is then read only when needed)."""
        raise NotImplementedError

    def _running_bounds(self, conn: Any) -> tuple[float | None, float | None]:
        """The earliest last heartbeat and start time among running attempts (``None``: no attempt runs)."""
        raise NotImplementedError

    def _expired_attempts(self, conn: Any, heartbeat_before: float, started_before: float | None) -> list[Attempt]:
        """Running attempts silent since before ``heartbeat_before`` or started before ``started_before``."""
        raise NotImplementedError

    def _claim_expired(self, conn: Any, candidate: Attempt) -> Attempt | None:
        """The expired ``candidate`` as this transaction may end it, or ``None`` to leave it (another writer has it)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- claims

    def _claim_of(self, conn: Any, rollout_id: str, attempt_id: str) -> Claim:
        """A claim as stored now (the answer to a retried request)."""
        rollout = self._get_rollout(conn, rollout_id)
        return Claim(rollout=rollout, attempt=self._get_attempt(conn, rollout_id, attempt_id))

    def _replay_claim(self, conn: Any, result: str) -> Claim | None:
        """The claim a remembered dequeue answered (``result``: its JSON ``[rollout_id, attempt_id]`` or ``null``)."""
        ids = from_json(result)
        return None if ids is None else self._claim_of(conn, ids[0], ids[1])

    # ----------------------------------------------------------------- state changes

    def _move(
        self, conn: Any, attempt: Attempt, status: AttemptStatus, error: str | None, move: RolloutMove, t: float
    ) -> Rollout:
        """End ``attempt`` with ``status`` and move its rollout as ``move`` says; returns the rollout."""
        sql = self._lifecycle_sql
        conn.execute(sql.end_attempt, (status, t, error, attempt.attempt_id))
        row = conn.execute(sql.move_rollout, (move.status, t, move.retries, attempt.rollout_id)).fetchone()
        return rollout_from_row(row)

    def _end_attempt(
        self, conn: Any, attempt: Attempt, status: AttemptStatus, error: str | None, t: float
    ) -> tuple[Attempt, Rollout]:
        """End a running attempt (its rollout locked) and move its rollout on according to the retry policy."""
        rollout = self._move(
            conn, attempt, status, error, after_attempt(self.retry_policy, status, attempt.sequence), t
        )
        return fast_replace(attempt, status=status, end_time=t, error=error), rollout

    def _finish(self, conn: Any, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None) -> Rollout:
        """`finish_attempt` in the caller's transaction."""
        current = self._lock_rollout(conn, rollout_id)
        attempt = self._get_attempt(conn, rollout_id, attempt_id)
        if finish_is_repeat(attempt, status):
            return current or self._get_rollout(conn, rollout_id)
        return self._end_attempt(conn, attempt, status, error, now())[1]

    def _release(self, conn: Any, rollout_id: str, attempt_id: str) -> Rollout:
        """`release_claim` in the caller's transaction."""
        current = self._lock_rollout(conn, rollout_id)
        attempt = self._get_attempt(conn, rollout_id, attempt_id)
        if attempt.status != "running":
            return current or self._get_rollout(conn, rollout_id)
        return self._move(conn, attempt, "cancelled", RELEASED, RELEASE, now())

    def _cancel(self, conn: Any, rollout_id: str) -> Rollout:
        """`cancel_rollout` in the caller's transaction."""
        rollout = self._lock_rollout(conn, rollout_id) or self._get_rollout(conn, rollout_id)
        if cancel_is_repeat(rollout):
            return rollout
        t = now()
        sql = self._lifecycle_sql
        conn.execute(sql.cancel_attempts, (t, rollout_id))
        return rollout_from_row(
            conn.execute(sql.move_rollout, (CANCEL.status, t, CANCEL.retries, rollout_id)).fetchone()
        )

    # ----------------------------------------------------------------- timeouts

    def _expired(self, conn: Any, t: float) -> list[Attempt]:
        """Running attempts (of any process) past a timeout at time ``t``; none while `no_timeout_before` holds."""
        if t <= self._no_timeout_before:
            return []
        policy = self.retry_policy
        bound = no_timeout_before(policy, t, *self._running_bounds(conn))
        if t <= bound:
            self._no_timeout_before = bound
            return []
        self._no_timeout_before = 0.0
        started_before = None if policy.rollout_timeout is None else t - policy.rollout_timeout
        return self._expired_attempts(conn, t - policy.heartbeat_timeout, started_before)

    def _apply_timeouts(self, conn: Any, t: float) -> tuple[list[Attempt], bool]:
        """End expired attempts (in the caller's transaction). Returns them and whether a rollout finished."""
        ended: list[Attempt] = []
        finished = False
        for candidate in self._expired(conn, t):
            attempt = self._claim_expired(conn, candidate)
            if attempt is None or attempt.status != "running":
                continue
            status = timed_out_status(self.retry_policy, attempt.start_time, attempt.last_heartbeat, t)
            if status is None:
                continue
            done, rollout = self._end_attempt(conn, attempt, status, None, t)
            ended.append(done)
            finished = finished or rollout.status in TERMINAL_ROLLOUT_STATUSES
        return ended, finished
