"""The loop's rollouts in the store: groups enqueued for tasks, and those left unfinished cancelled."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agentlightning.store._base import ConflictError, LightningStore, RolloutRequest

__all__ = ["cancel_unfinished", "group_requests"]

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
