"""`start_attempts`: real rollouts and attempts for tests that write spans or LLM calls under chosen rollout ids."""

from __future__ import annotations

from collections.abc import Sequence

from agentlightning.store import LightningStore, RolloutRequest

__all__ = ["start_attempts"]


async def start_attempts(store: LightningStore, rollout_ids: Sequence[str]) -> dict[str, str]:
    """Enqueue a rollout per id and claim each one, so spans and LLM calls can be written for it.

    Stores refuse records of attempts they never started; tests that record under fixed rollout ids (through the
    proxy, say) start them here first. The queue must hold no other rollout.

    Returns:
        Rollout id -> the id of the attempt started for it.
    """
    ids = list(dict.fromkeys(rollout_ids))
    await store.enqueue_rollouts([RolloutRequest(rollout_id=rollout_id) for rollout_id in ids])
    started: dict[str, str] = {}
    for _ in ids:
        claim = await store.dequeue_rollout(worker_id="test")
        if claim is None:
            break
        started[claim.rollout.rollout_id] = claim.attempt.attempt_id
    missing = [rollout_id for rollout_id in ids if rollout_id not in started]
    if missing:
        raise RuntimeError(f"could not start attempts for {missing} (other rollouts were queued first?)")
    return started
