"""The attempt part of the store test kit: lifecycle, retries, timeouts, release, cancel, concurrent dequeues.

Mixed into `StoreConformanceTests` (which provides the ``store`` and ``store_factory`` fixtures), so every backend
moves attempts through the same states under the same `RetryPolicy`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agentlightning.store import (
    RELEASED,
    ConflictError,
    InvalidRequestError,
    LightningStore,
    NotFoundError,
    RetryPolicy,
    RolloutRequest,
)

__all__ = ["AttemptConformanceTests"]

StoreFactory = Callable[[RetryPolicy | None], Awaitable[LightningStore]]


class AttemptConformanceTests:
    """How a store runs attempts (`StoreConformanceTests` mixes this in)."""

    async def test_attempt_lifecycle_success(self, store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task")
        claim = await store.dequeue_rollout()
        assert claim is not None
        beat = await store.heartbeat(rollout.rollout_id, claim.attempt.attempt_id)
        assert beat.status == "running"
        assert beat.last_heartbeat >= claim.attempt.last_heartbeat
        done = await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
        assert done.status == "succeeded"
        assert (await store.get_rollout(rollout.rollout_id)).status == "succeeded"
        (attempt,) = await store.query_attempts(rollout.rollout_id)
        assert attempt.status == "succeeded"
        assert attempt.end_time is not None and attempt.end_time >= attempt.start_time
        # finishing again with the same status is a no-op, another status is a conflict
        again = await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
        assert again.status == "succeeded"
        with pytest.raises(ConflictError):
            await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "failed")
        with pytest.raises(ConflictError):
            await store.heartbeat(rollout.rollout_id, claim.attempt.attempt_id)
        assert await store.dequeue_rollout() is None

    async def test_unknown_ids(self, store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task", rollout_id="known")
        with pytest.raises(NotFoundError, match="missing-rollout"):
            await store.heartbeat("missing-rollout", "a")
        with pytest.raises(NotFoundError, match="missing-attempt"):
            await store.heartbeat(rollout.rollout_id, "missing-attempt")
        with pytest.raises(NotFoundError, match="missing-attempt"):
            await store.finish_attempt(rollout.rollout_id, "missing-attempt", "succeeded")
        with pytest.raises(NotFoundError, match="missing-rollout"):
            await store.cancel_rollout("missing-rollout")
        with pytest.raises(NotFoundError, match="missing-rollout"):
            await store.query_attempts("missing-rollout")
        with pytest.raises(NotFoundError, match="missing-resources"):
            await store.get_resources("missing-resources")
        with pytest.raises(NotFoundError, match="missing-rollout"):
            await store.wait_for_rollouts(["missing-rollout"], timeout=0)

    async def test_finish_with_running_status_rejected(self, store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task")
        claim = await store.dequeue_rollout()
        assert claim is not None
        with pytest.raises(InvalidRequestError):
            await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "running")
        assert (await store.get_rollout(rollout.rollout_id)).status == "running"

    async def test_retry_policy(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=3))
        rollout = await store.enqueue_rollout("flaky")
        attempt_ids: list[str] = []
        for sequence in (1, 2, 3):
            claim = await store.dequeue_rollout()
            assert claim is not None
            assert claim.rollout.rollout_id == rollout.rollout_id
            assert claim.attempt.sequence == sequence
            assert claim.rollout.retry_count == sequence - 1
            attempt_ids.append(claim.attempt.attempt_id)
            after = await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "failed", error="boom")
            assert after.status == ("queuing" if sequence < 3 else "failed")
        assert await store.dequeue_rollout() is None
        attempts = await store.query_attempts(rollout.rollout_id)
        assert [a.attempt_id for a in attempts] == attempt_ids
        assert [a.sequence for a in attempts] == [1, 2, 3]
        assert all(a.status == "failed" and a.error == "boom" for a in attempts)
        final = await store.get_rollout(rollout.rollout_id)
        assert final.status == "failed" and final.retry_count == 2

    async def test_no_retry_for_status_outside_retry_on(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=5, retry_on=frozenset({"timeout"})))
        rollout = await store.enqueue_rollout("x")
        claim = await store.dequeue_rollout()
        assert claim is not None
        after = await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "failed")
        assert after.status == "failed"

    async def test_requeued_rollout_keeps_its_place(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=2))
        first = await store.enqueue_rollout("first")
        second = await store.enqueue_rollout("second")
        claim = await store.dequeue_rollout()
        assert claim is not None and claim.rollout.rollout_id == first.rollout_id
        await store.finish_attempt(first.rollout_id, claim.attempt.attempt_id, "failed")
        retry = await store.dequeue_rollout()
        assert retry is not None and retry.rollout.rollout_id == first.rollout_id
        assert retry.attempt.sequence == 2
        nxt = await store.dequeue_rollout()
        assert nxt is not None and nxt.rollout.rollout_id == second.rollout_id

    async def test_heartbeat_timeout_makes_attempt_unresponsive(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=2, heartbeat_timeout=0.05))
        rollout = await store.enqueue_rollout("silent")
        claim = await store.dequeue_rollout()
        assert claim is not None
        await asyncio.sleep(0.15)
        ended = await store.check_timeouts()
        assert [(a.attempt_id, a.status) for a in ended] == [(claim.attempt.attempt_id, "unresponsive")]
        requeued = await store.get_rollout(rollout.rollout_id)
        assert requeued.status == "queuing" and requeued.retry_count == 1
        with pytest.raises(ConflictError):
            await store.heartbeat(rollout.rollout_id, claim.attempt.attempt_id)
        with pytest.raises(ConflictError):
            await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
        second = await store.dequeue_rollout()
        assert second is not None and second.attempt.sequence == 2
        await asyncio.sleep(0.15)
        # dequeue applies timeouts itself: the second silent attempt uses up the retries
        assert await store.dequeue_rollout() is None
        final = await store.get_rollout(rollout.rollout_id)
        assert final.status == "failed"
        assert [a.status for a in await store.query_attempts(rollout.rollout_id)] == ["unresponsive", "unresponsive"]

    async def test_heartbeats_keep_attempt_alive(self, store: LightningStore) -> None:
        # default heartbeat timeout (30 s) is far away: nothing times out
        rollout = await store.enqueue_rollout("alive")
        claim = await store.dequeue_rollout()
        assert claim is not None
        for _ in range(3):
            await store.heartbeat(rollout.rollout_id, claim.attempt.attempt_id)
        assert await store.check_timeouts() == []
        assert (await store.get_rollout(rollout.rollout_id)).status == "running"

    async def test_rollout_timeout(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=1, rollout_timeout=0.05, heartbeat_timeout=60))
        rollout = await store.enqueue_rollout("slow")
        claim = await store.dequeue_rollout()
        assert claim is not None
        await asyncio.sleep(0.15)
        ended = await store.check_timeouts()
        assert [a.status for a in ended] == ["timeout"]
        assert (await store.get_rollout(rollout.rollout_id)).status == "failed"
        assert await store.check_timeouts() == []

    async def test_release_claim_requeues_at_once(self, store_factory: StoreFactory) -> None:
        # max_attempts=1: a release sends the rollout back even where a failure would not be retried
        store = await store_factory(RetryPolicy(max_attempts=1))
        first = await store.enqueue_rollout("first")
        second = await store.enqueue_rollout("second")
        claim = await store.dequeue_rollout(worker_id="leaving")
        assert claim is not None and claim.rollout.rollout_id == first.rollout_id
        released = await store.release_claim(first.rollout_id, claim.attempt.attempt_id)
        assert released.status == "queuing" and released.retry_count == 1
        (attempt,) = await store.query_attempts(first.rollout_id)
        assert attempt.status == "cancelled" and attempt.error == RELEASED and attempt.end_time is not None
        # idempotent, and the attempt is over for its old worker
        assert (await store.release_claim(first.rollout_id, claim.attempt.attempt_id)).status == "queuing"
        with pytest.raises(ConflictError):
            await store.heartbeat(first.rollout_id, claim.attempt.attempt_id)
        retry = await store.dequeue_rollout(worker_id="staying")  # keeps its place ahead of `second`
        assert retry is not None and retry.rollout.rollout_id == first.rollout_id and retry.attempt.sequence == 2
        await store.finish_attempt(first.rollout_id, retry.attempt.attempt_id, "succeeded")
        assert (await store.get_rollout(first.rollout_id)).status == "succeeded"
        # releasing an attempt that already ended changes nothing
        assert (await store.release_claim(first.rollout_id, claim.attempt.attempt_id)).status == "succeeded"
        nxt = await store.dequeue_rollout()
        assert nxt is not None and nxt.rollout.rollout_id == second.rollout_id
        with pytest.raises(NotFoundError):
            await store.release_claim(second.rollout_id, "at-unknown")

    async def test_cancel(self, store: LightningStore) -> None:
        queued = await store.enqueue_rollout("queued")
        running = await store.enqueue_rollout("running")
        claim = await store.dequeue_rollout()
        assert claim is not None and claim.rollout.rollout_id == queued.rollout_id
        cancelled = await store.cancel_rollout(queued.rollout_id)
        assert cancelled.status == "cancelled"
        (attempt,) = await store.query_attempts(queued.rollout_id)
        assert attempt.status == "cancelled"
        assert (await store.cancel_rollout(queued.rollout_id)).status == "cancelled"  # idempotent
        assert (await store.cancel_rollout(running.rollout_id)).status == "cancelled"  # still queuing
        assert await store.dequeue_rollout() is None
        with pytest.raises(ConflictError):
            await store.finish_attempt(queued.rollout_id, claim.attempt.attempt_id, "succeeded")
        done = await store.enqueue_rollout("done")
        c2 = await store.dequeue_rollout()
        assert c2 is not None
        await store.finish_attempt(done.rollout_id, c2.attempt.attempt_id, "succeeded")
        with pytest.raises(ConflictError):
            await store.cancel_rollout(done.rollout_id)

    async def test_concurrent_dequeue_never_duplicates(self, store: LightningStore) -> None:
        rollouts = await store.enqueue_rollouts([RolloutRequest(input=i) for i in range(20)])
        claims = await asyncio.gather(*(store.dequeue_rollout(worker_id=f"w{i}") for i in range(40)))
        got = [c.rollout.rollout_id for c in claims if c is not None]
        assert len(got) == 20
        assert sorted(got) == sorted(r.rollout_id for r in rollouts)
        assert len({c.attempt.attempt_id for c in claims if c is not None}) == 20
