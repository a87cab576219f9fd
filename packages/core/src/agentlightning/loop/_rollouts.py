"""The loop's rollouts in the store: groups enqueued for tasks, those left unfinished cancelled, why some failed."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agentlightning._models import Rollout
from agentlightning.store import ConflictError, LightningStore, RolloutRequest

__all__ = ["cancel_unfinished", "failure_reasons", "first_failure", "group_requests"]

logger = logging.getLogger(__name__)


def group_requests(
    tasks: Sequence[Any], n: int, resources_id: str, prefix: str, mode: str = "train"
) -> list[RolloutRequest]:
    """``n`` rollouts of each task, one group per task (``{prefix}-t{task}``), pinned to ``resources_id``."""
    return [
        RolloutRequest(
            input=task,
            rollout_id=f"{prefix}-t{t}-s{s}",
            group_id=f"{prefix}-t{t}",
            mode="train" if mode == "train" else "val",
            resources_id=resources_id,
        )
        for t, task in enumerate(tasks)
        for s in range(n)
    ]


async def cancel_unfinished(store: LightningStore, rollout_ids: list[str]) -> list[str]:
    """Cancel those of ``rollout_ids`` still queued or running; returns the ids found so (a rollout that finishes
    while being cancelled is too late all the same)."""
    late = await store.query_rollouts(status=["queuing", "running"], rollout_ids=rollout_ids)
    for rollout in late:
        try:
            await store.cancel_rollout(rollout.rollout_id)
        except ConflictError:
            logger.debug("rollout %s finished while being cancelled", rollout.rollout_id)
    return [r.rollout_id for r in late]


async def first_failure(store: LightningStore, rollouts: Sequence[Rollout]) -> str | None:
    """Why the first failed one of ``rollouts`` failed: its last attempt's error (``None``: none failed).

    The runner stores the agent's exception with the attempt; the trainer shows one of them, so a failure that hits
    every rollout (a refused key, a token budget the model's context cannot hold) is named where training stops,
    not only in a runner's log on another machine.
    """
    failed = next((rollout for rollout in rollouts if rollout.status == "failed"), None)
    if failed is None:
        return None
    errors = [attempt.error for attempt in await store.query_attempts(failed.rollout_id) if attempt.error]
    return f"rollout {failed.rollout_id}: {errors[-1] if errors else 'no error was recorded (its worker died?)'}"


_NUMBER = re.compile(r"\d+(\.\d+)?")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)?): ")


def _reason(status: str, error: str | None) -> str:
    """A failure's kind, alike for alike failures: the exception's type, or the runner's sentence without its
    numbers and place (``timeout: the agent blocked its worker for N s``)."""
    if not error:
        return f"{status}: no error recorded"
    match = _EXCEPTION.match(error)
    if match and " " not in match.group(1):
        return f"{status}: {match.group(1)}"
    head = re.split(r" in | \(|: ", error, maxsplit=1)[0]
    return f"{status}: {_NUMBER.sub('N', head)[:80]}"


async def failure_reasons(store: LightningStore, rollouts: Sequence[Rollout]) -> Counter[str]:
    """How many of the failed ``rollouts`` failed for each reason (their last attempt's status and error kind)."""
    reasons: Counter[str] = Counter()
    for rollout in rollouts:
        if rollout.status != "failed":
            continue
        attempts = await store.query_attempts(rollout.rollout_id)
        last = attempts[-1] if attempts else None
        reasons[_reason(last.status, last.error) if last else "failed: no attempt"] += 1
    return reasons
