"""In-memory store: the reference backend for tests and single-process runs."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, NoReturn

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
from agentlightning.store._base import RELEASED, RolloutRequest
from agentlightning.store._common import wait_until_finished
from agentlightning.store._lifecycle import (
    RELEASE,
    after_attempt,
    attempt_deadline,
    cancel_is_repeat,
    finish_is_repeat,
    not_running,
    start_attempt,
    timed_out_status,
)
from agentlightning.store._memory_records import MemoryRecords

__all__ = ["MemoryStore"]


class MemoryStore(MemoryRecords):
    """A `LightningStore` that keeps everything in this process's memory.

    Safe to share between asyncio tasks and threads of one process; nothing survives the process and it
    cannot be shared with other processes (use `SqliteStore` or a served store for that).

    Args:
        retry_policy: When failed or silent attempts are retried; defaults to `RetryPolicy()`.
    """

    def reopen_spec(self) -> NoReturn:
        """Not available: an in-memory store lives in one process and cannot be reopened elsewhere."""
        raise TypeError(
            "MemoryStore cannot be shared across processes; use SqliteStore(path) or a served store "
            "(`agl store serve`) for multi-process runners"
        )

    # ----------------------------------------------------------------- rollouts

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Queue rollouts (batched); returns them in request order."""
        reqs = requests  # validated at the boundary (StoreBoundary), as every argument below
        out: list[Rollout] = []
        with self._lock:
            for req in reqs:
                rollout_id = req.rollout_id or new_id("ro")
                existing = self._rollouts.get(rollout_id)
                if existing is not None:
                    out.append(existing)
                    continue
                t = now()
                rollout = Rollout(
                    rollout_id=rollout_id,
                    input=req.input,
                    mode=req.mode,
                    group_id=req.group_id,
                    resources_id=req.resources_id,
                    metadata=req.metadata,
                    created_at=t,
                    updated_at=t,
                )
                self._seq += 1
                self._rollouts[rollout_id] = rollout
                self._order[rollout_id] = self._seq
                self._attempts[rollout_id] = []
                heapq.heappush(self._queue, (self._seq, rollout_id))
                out.append(rollout)
        return out

    async def dequeue_rollout(self, worker_id: str | None = None, *, request_id: str | None = None) -> Claim | None:
        """Claim the oldest queuing rollout and start an attempt for it, or ``None`` when the queue is empty.

        A retried request with the same ``request_id`` gets the same claim back (answers are kept in memory).
        """
        key = None if request_id is None else "dequeue:" + request_id
        with self._lock:
            if key is not None and key in self._requests:
                ids = self._requests[key]
                if ids is None:
                    return None
                rollout_id, attempt_id = ids
                return Claim(
                    rollout=self._rollouts[rollout_id], attempt=self._get_attempt_locked(rollout_id, attempt_id)[1]
                )
            claim = self._dequeue_locked(worker_id)
            if key is not None:
                self._remember(key, None if claim is None else (claim.rollout.rollout_id, claim.attempt.attempt_id))
            return claim

    async def dequeue_many(self, worker_ids: Sequence[str | None], *, request_id: str | None = None) -> list[Claim]:
        """Claim up to ``len(worker_ids)`` queuing rollouts at once, the i-th for ``worker_ids[i]`` (oldest first).

        A retried request with the same ``request_id`` gets the same claims back (answers are kept in memory).
        """
        workers = worker_ids  # checked at the boundary (StoreBoundary)
        key = None if request_id is None else "dequeue_many:" + request_id
        with self._lock:
            if key is not None and key in self._requests:
                return [
                    Claim(rollout=self._rollouts[r], attempt=self._get_attempt_locked(r, a)[1])
                    for r, a in self._requests[key]
                ]
            claims: list[Claim] = []
            for worker_id in workers:
                claim = self._dequeue_locked(worker_id)
                if claim is None:
                    break
                claims.append(claim)
            if key is not None:
                self._remember(key, [(c.rollout.rollout_id, c.attempt.attempt_id) for c in claims])
            return claims

    def _dequeue_locked(self, worker_id: str | None) -> Claim | None:
        self._check_timeouts_locked()
        while self._queue:
            _, rollout_id = heapq.heappop(self._queue)
            rollout = self._rollouts[rollout_id]
            if rollout.status != "queuing":
                continue
            t = now()
            attempts = self._attempts[rollout_id]
            attempt = start_attempt(rollout_id, len(attempts) + 1, worker_id, t)
            attempts.append(attempt)
            self._attempt_rollout[attempt.attempt_id] = rollout_id
            self._running[attempt.attempt_id] = rollout_id
            self._next_deadline = min(self._next_deadline, self._deadline(attempt))
            rollout = fast_replace(rollout, status="running", updated_at=t)
            self._rollouts[rollout_id] = rollout
            return Claim(rollout=rollout, attempt=attempt)
        return None

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record a sign of life; raises `ConflictError` if the attempt is no longer running."""
        with self._lock:
            index, attempt = self._get_attempt_locked(rollout_id, attempt_id)
            if attempt.status != "running":
                raise not_running(attempt)
            attempt = fast_replace(attempt, last_heartbeat=now())
            self._attempts[rollout_id][index] = attempt
            return attempt

    async def heartbeat_many(self, attempts: Sequence[tuple[str, str]]) -> list[Attempt]:
        """Record a sign of life for several attempts; those no longer running come back unchanged."""
        refs = list(attempts)  # checked by the store boundary
        with self._lock:
            found = [self._get_attempt_locked(rollout_id, attempt_id) for rollout_id, attempt_id in refs]
            t = now()
            out: list[Attempt] = []
            for index, attempt in found:
                if attempt.status == "running":
                    attempt = fast_replace(attempt, last_heartbeat=max(t, attempt.last_heartbeat))
                    self._attempts[attempt.rollout_id][index] = attempt
                out.append(attempt)
            return out

    def _end_attempt_locked(
        self, index: int, attempt: Attempt, status: AttemptStatus, error: str | None, t: float
    ) -> tuple[Attempt, Rollout]:
        """End a running attempt and move its rollout on; the caller holds the lock."""
        rollout_id = attempt.rollout_id
        ended = fast_replace(attempt, status=status, end_time=t, error=error)
        self._attempts[rollout_id][index] = ended
        self._running.pop(attempt.attempt_id, None)
        rollout = self._rollouts[rollout_id]
        move = after_attempt(self.retry_policy, status, attempt.sequence)
        update: dict[str, Any] = {"status": move.status, "updated_at": t}
        if move.retries:
            update["retry_count"] = rollout.retry_count + move.retries
            heapq.heappush(self._queue, (self._order[rollout_id], rollout_id))
        rollout = fast_replace(rollout, **update)
        self._rollouts[rollout_id] = rollout
        return ended, rollout

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None = None
    ) -> Rollout:
        """End an attempt and move its rollout on according to the retry policy."""
        with self._lock:
            index, attempt = self._get_attempt_locked(rollout_id, attempt_id)
            if finish_is_repeat(attempt, status):
                return self._rollouts[rollout_id]
            _, rollout = self._end_attempt_locked(index, attempt, status, error, now())
        if rollout.status in TERMINAL_ROLLOUT_STATUSES:
            self._notifier.notify()
        return rollout

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""
        with self._lock:
            index, attempt = self._get_attempt_locked(rollout_id, attempt_id)
            rollout = self._rollouts[rollout_id]
            if attempt.status != "running":
                return rollout
            t = now()
            self._attempts[rollout_id][index] = fast_replace(attempt, status="cancelled", end_time=t, error=RELEASED)
            self._running.pop(attempt_id, None)
            rollout = fast_replace(
                rollout, status=RELEASE.status, updated_at=t, retry_count=rollout.retry_count + RELEASE.retries
            )
            self._rollouts[rollout_id] = rollout
            heapq.heappush(self._queue, (self._order[rollout_id], rollout_id))
            return rollout

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished (its running attempt is cancelled too)."""
        with self._lock:
            rollout = self._get_rollout_locked(rollout_id)
            if cancel_is_repeat(rollout):
                return rollout
            t = now()
            attempts = self._attempts[rollout_id]
            for index, attempt in enumerate(attempts):
                if attempt.status == "running":
                    attempts[index] = fast_replace(attempt, status="cancelled", end_time=t)
                    self._running.pop(attempt.attempt_id, None)
            rollout = fast_replace(rollout, status="cancelled", updated_at=t)
            self._rollouts[rollout_id] = rollout
        self._notifier.notify()
        return rollout

    def _deadline(self, attempt: Attempt) -> float:
        return attempt_deadline(self.retry_policy, attempt.start_time, attempt.last_heartbeat)

    def _check_timeouts_locked(self) -> list[Attempt]:
        t = now()
        ended: list[Attempt] = []
        if t <= self._next_deadline:
            return ended
        next_deadline = float("inf")
        for attempt_id, rollout_id in list(self._running.items()):
            index, attempt = self._get_attempt_locked(rollout_id, attempt_id)
            status = timed_out_status(self.retry_policy, attempt.start_time, attempt.last_heartbeat, t)
            if status is None:
                next_deadline = min(next_deadline, self._deadline(attempt))
            else:
                done, _ = self._end_attempt_locked(index, attempt, status, None, t)
                ended.append(done)
        self._next_deadline = next_deadline
        return ended

    async def check_timeouts(self) -> list[Attempt]:
        """Apply heartbeat/rollout timeouts now; returns the attempts that were ended."""
        with self._lock:
            ended = self._check_timeouts_locked()
        if ended:
            self._notifier.notify()
        return ended

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; raises `NotFoundError`."""
        with self._lock:
            return self._get_rollout_locked(rollout_id)

    async def query_rollouts(
        self, status: Sequence[RolloutStatus] | None = None, rollout_ids: Sequence[str] | None = None
    ) -> list[Rollout]:
        """Rollouts filtered by status and/or ids, in enqueue order."""
        statuses = status
        ids = None if rollout_ids is None else set(rollout_ids)
        with self._lock:
            rollouts = [
                r
                for r in self._rollouts.values()  # dicts keep insertion (= enqueue) order
                if (statuses is None or r.status in statuses) and (ids is None or r.rollout_id in ids)
            ]
        return rollouts

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout in order."""
        with self._lock:
            self._get_rollout_locked(rollout_id)
            return list(self._attempts[rollout_id])

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until the rollouts reach a terminal status or ``timeout`` seconds pass; returns the finished ones."""
        ids = rollout_ids
        with self._lock:
            for rollout_id in ids:
                self._get_rollout_locked(rollout_id)

        async def poll() -> tuple[list[Rollout], bool]:
            await self.check_timeouts()
            with self._lock:
                finished = [self._rollouts[i] for i in ids if self._rollouts[i].status in TERMINAL_ROLLOUT_STATUSES]
            return finished, len(finished) == len(ids)

        # timeouts are the only change not announced by the notifier, so polling can be lazy
        poll_interval = min(0.5, self.retry_policy.heartbeat_timeout / 2)
        return await wait_until_finished(self._notifier, poll, timeout, poll_interval)
