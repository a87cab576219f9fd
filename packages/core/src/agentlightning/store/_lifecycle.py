"""The rollout lifecycle's decisions, once for every store backend (memory, SQLite, PostgreSQL).

What an attempt's end does to its rollout (retry policy), when a running attempt has timed out, how long no attempt
can time out, what a repeated finish or cancel answers, and how a claim starts an attempt: pure functions of the
records and the `RetryPolicy`. The backends only read and write the rows these decisions name (the SQL ones through
`agentlightning.store._sql_lifecycle`).
"""

from __future__ import annotations

from typing import NamedTuple

from agentlightning._models import TERMINAL_ROLLOUT_STATUSES, Attempt, AttemptStatus, Rollout, RolloutStatus, new_id
from agentlightning.store._base import ConflictError, RetryPolicy

__all__ = [
    "CANCEL",
    "RELEASE",
    "RolloutMove",
    "after_attempt",
    "attempt_deadline",
    "cancel_is_repeat",
    "finish_is_repeat",
    "no_timeout_before",
    "not_running",
    "rollout_status_after",
    "start_attempt",
    "timed_out_status",
]


class RolloutMove(NamedTuple):
    """Where a rollout goes when its attempt ends: its new ``status`` and how many ``retries`` it adds (0 or 1)."""

    status: RolloutStatus
    retries: int


RELEASE = RolloutMove("queuing", 1)
"""A released claim: the rollout is queued again at once, whatever the retry policy (one more retry)."""
CANCEL = RolloutMove("cancelled", 0)
"""A cancelled rollout: it ends ``cancelled``, adding no retry."""


def rollout_status_after(policy: RetryPolicy, attempt_status: AttemptStatus, attempt_sequence: int) -> RolloutStatus:
    """What a rollout becomes when its attempt number ``attempt_sequence`` ends with ``attempt_status``.

    ``queuing`` means the rollout goes back to the queue for another attempt.
    """
    if attempt_status == "succeeded":
        return "succeeded"
    if attempt_status in policy.retry_on and attempt_sequence < policy.max_attempts:
        return "queuing"
    if attempt_status == "cancelled":
        return "cancelled"
    return "failed"


def after_attempt(policy: RetryPolicy, attempt_status: AttemptStatus, attempt_sequence: int) -> RolloutMove:
    """The `RolloutMove` when attempt number ``attempt_sequence`` ends with ``attempt_status`` (requeued: a retry)."""
    status = rollout_status_after(policy, attempt_status, attempt_sequence)
    return RolloutMove(status, 1 if status == "queuing" else 0)


def timed_out_status(policy: RetryPolicy, start_time: float, last_heartbeat: float, at: float) -> AttemptStatus | None:
    """``timeout`` or ``unresponsive`` if a running attempt has run or stayed silent too long, else ``None``."""
    if policy.rollout_timeout is not None and at - start_time > policy.rollout_timeout:
        return "timeout"
    if at - last_heartbeat > policy.heartbeat_timeout:
        return "unresponsive"
    return None


def attempt_deadline(policy: RetryPolicy, start_time: float, last_heartbeat: float) -> float:
    """The moment a running attempt (started at ``start_time``, last heard of at ``last_heartbeat``) times out."""
    deadline = last_heartbeat + policy.heartbeat_timeout
    if policy.rollout_timeout is not None:
        deadline = min(deadline, start_time + policy.rollout_timeout)
    return deadline


def no_timeout_before(policy: RetryPolicy, t: float, min_heartbeat: float | None, min_start: float | None) -> float:
    """A moment before which no running attempt can time out, seen at time ``t``.

    ``min_heartbeat`` and ``min_start`` are the earliest last heartbeat and start time among the running attempts
    (``None``: none runs). Heartbeats only push deadlines later and an attempt started after ``t`` cannot expire
    before ``t + timeout``, so the bound stays valid for every process sharing the store (and the policy): until
    it passes, a backend need not look for expired attempts.
    """
    bound = t + min(policy.heartbeat_timeout, policy.rollout_timeout or policy.heartbeat_timeout)
    if min_heartbeat is not None:
        bound = min(bound, min_heartbeat + policy.heartbeat_timeout)
    if min_start is not None and policy.rollout_timeout is not None:
        bound = min(bound, min_start + policy.rollout_timeout)
    return bound


def finish_is_repeat(attempt: Attempt, status: AttemptStatus) -> bool:
    """Whether finishing ``attempt`` as ``status`` repeats its end (answered with the rollout as it is).

    Raises:
        ConflictError: The attempt already ended with another status.
    """
    if attempt.status == "running":
        return False
    if attempt.status == status:
        return True
    raise ConflictError(
        f"attempt {attempt.attempt_id!r} already ended as {attempt.status}; cannot finish it as {status}"
    )


def cancel_is_repeat(rollout: Rollout) -> bool:
    """Whether cancelling ``rollout`` repeats its cancellation (answered with the rollout as it is).

    Raises:
        ConflictError: The rollout already finished otherwise.
    """
    if rollout.status == "cancelled":
        return True
    if rollout.status in TERMINAL_ROLLOUT_STATUSES:
        raise ConflictError(f"rollout {rollout.rollout_id!r} already {rollout.status}; cannot cancel it")
    return False


def not_running(attempt: Attempt) -> ConflictError:
    """The error for a heartbeat of an attempt that no longer runs."""
    return ConflictError(f"attempt {attempt.attempt_id!r} is {attempt.status}, not running")


def start_attempt(
    rollout_id: str, sequence: int, worker_id: str | None, t: float, attempt_id: str | None = None
) -> Attempt:
    """The running attempt number ``sequence`` of a rollout claimed at ``t`` (a new id unless ``attempt_id``)."""
    return Attempt(
        rollout_id=rollout_id,
        attempt_id=attempt_id or new_id("at"),
        sequence=sequence,
        worker_id=worker_id,
        start_time=t,
        last_heartbeat=t,
    )
