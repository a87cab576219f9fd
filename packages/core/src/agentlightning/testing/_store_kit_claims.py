"""The bulk part of the store test kit: `LightningStore.dequeue_many` and `LightningStore.heartbeat_many`.

Mixed into `StoreConformanceTests` (which provides the ``store`` fixture), so every backend claims several rollouts
in one request the same way: oldest first, one per worker, never one rollout twice, a retried request id answered
with the same claims, bad input refused before anything is claimed; and beats several attempts in one request, those
no longer running given back as they are, an unknown id refusing the whole request.
"""

from __future__ import annotations

import asyncio

import pytest

from agentlightning.store import MAX_DEQUEUE_MANY, InvalidRequestError, LightningStore, NotFoundError

__all__ = ["ClaimConformanceTests"]


class ClaimConformanceTests:
    """How a store claims rollouts in bulk (`StoreConformanceTests` mixes this in)."""

    async def test_dequeue_many_oldest_first_one_per_worker(self, store: LightningStore) -> None:
        for i in range(5):
            await store.enqueue_rollout({"i": i}, rollout_id=f"bulk-{i}")
        claims = await store.dequeue_many(["w1", "w2", None])
        assert [c.rollout.rollout_id for c in claims] == ["bulk-0", "bulk-1", "bulk-2"]
        assert [c.attempt.worker_id for c in claims] == ["w1", "w2", None]
        for claim in claims:
            assert claim.rollout.status == "running" and claim.attempt.status == "running"
            assert claim.attempt.sequence == 1
            (stored,) = await store.query_attempts(claim.rollout.rollout_id)
            assert stored.attempt_id == claim.attempt.attempt_id and stored.worker_id == claim.attempt.worker_id
        rest = await store.dequeue_many(["a", "b", "c"])  # the queue runs short: fewer claims, no error
        assert [(c.rollout.rollout_id, c.attempt.worker_id) for c in rest] == [("bulk-3", "a"), ("bulk-4", "b")]
        assert await store.dequeue_many(["a"]) == []
        assert await store.dequeue_many([]) == []
        assert await store.dequeue_rollout() is None

    async def test_dequeue_many_request_id_answers_a_retry_with_the_same_claims(self, store: LightningStore) -> None:
        for i in range(3):
            await store.enqueue_rollout(i, rollout_id=f"retry-{i}")
        first = await store.dequeue_many(["w1", "w2"], request_id="bulk-req-1")
        again = await store.dequeue_many(["w1", "w2"], request_id="bulk-req-1")
        assert [(c.rollout.rollout_id, c.attempt.attempt_id) for c in again] == [
            (c.rollout.rollout_id, c.attempt.attempt_id) for c in first
        ]
        assert len(first) == 2
        for claim in first:  # the retry started no second attempt
            assert len(await store.query_attempts(claim.rollout.rollout_id)) == 1
        last = await store.dequeue_rollout()
        assert last is not None and last.rollout.rollout_id == "retry-2"
        assert await store.dequeue_many(["w"], request_id="bulk-req-2") == []
        assert await store.dequeue_many(["w"], request_id="bulk-req-2") == []

    @pytest.mark.parametrize(
        "worker_ids",
        [["ok", ""], ["ok", 3], "w1", ["w"] * (MAX_DEQUEUE_MANY + 1)],
        ids=["empty-id", "not-a-string", "a-string", "too-many"],
    )
    async def test_dequeue_many_bad_input_claims_nothing(self, store: LightningStore, worker_ids: object) -> None:
        await store.enqueue_rollout("task", rollout_id="untouched")
        with pytest.raises(InvalidRequestError):
            await store.dequeue_many(worker_ids)  # type: ignore[arg-type]
        assert (await store.get_rollout("untouched")).status == "queuing"
        assert await store.query_attempts("untouched") == []

    async def test_dequeue_many_concurrent_never_share_a_rollout(self, store: LightningStore) -> None:
        for i in range(20):
            await store.enqueue_rollout(i, rollout_id=f"race-{i:02d}")

        async def bulk(n: int) -> list[str]:
            return [c.rollout.rollout_id for c in await store.dequeue_many([f"w{n}-{k}" for k in range(4)])]

        async def one() -> list[str]:
            claim = await store.dequeue_rollout("single")
            return [] if claim is None else [claim.rollout.rollout_id]

        got = await asyncio.gather(*(bulk(n) for n in range(5)), one(), one())
        claimed = [rollout_id for ids in got for rollout_id in ids]
        assert len(claimed) == len(set(claimed)) == 20
        assert await store.dequeue_many(["late"]) == []

    async def test_heartbeat_many_beats_running_and_returns_the_others_as_they_are(self, store: LightningStore) -> None:
        for i in range(3):
            await store.enqueue_rollout(i, rollout_id=f"beat-{i}")
        claims = await store.dequeue_many(["w1", "w2", "w3"])
        refs = [(c.rollout.rollout_id, c.attempt.attempt_id) for c in claims]
        await store.finish_attempt(*refs[1], "failed")
        beaten = await store.heartbeat_many(refs)
        assert [(a.rollout_id, a.attempt_id) for a in beaten] == refs
        assert [a.status for a in beaten] == ["running", "failed", "running"]
        for claim, attempt in zip(claims, beaten, strict=True):
            assert attempt.last_heartbeat >= claim.attempt.last_heartbeat
        stored = {a.attempt_id: a for r, _ in refs for a in await store.query_attempts(r)}
        assert stored[refs[0][1]].last_heartbeat == beaten[0].last_heartbeat
        assert await store.heartbeat_many([]) == []

    async def test_heartbeat_many_unknown_id_records_nothing(self, store: LightningStore) -> None:
        await store.enqueue_rollout("task", rollout_id="beat-known")
        claim = await store.dequeue_rollout()
        assert claim is not None
        before = claim.attempt.last_heartbeat
        with pytest.raises(NotFoundError, match="missing-attempt"):
            await store.heartbeat_many([("beat-known", claim.attempt.attempt_id), ("beat-known", "missing-attempt")])
        (attempt,) = await store.query_attempts("beat-known")
        assert attempt.last_heartbeat == before
        with pytest.raises(InvalidRequestError):
            await store.heartbeat_many([("beat-known", "")])
