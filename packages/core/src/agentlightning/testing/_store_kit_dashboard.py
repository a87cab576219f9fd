"""The dashboard part of the store test kit: `list_rollouts`, `run_stats` and `query_resources`.

Mixed into `StoreConformanceTests`, so every backend (memory, SQLite, a served store through its client)
answers the same queries with the same numbers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from agentlightning import semconv
from agentlightning._models import LLMCall, Resources, Span
from agentlightning.store import (
    InvalidRequestError,
    LightningStore,
    RetryPolicy,
    RolloutQuery,
    RolloutRequest,
    RunStatsQuery,
    runner_totals,
)

__all__ = ["DashboardConformanceTests", "make_reward_span"]

StoreFactory = Callable[[RetryPolicy | None], Awaitable[LightningStore]]
_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def make_reward_span(rollout_id: str, attempt_id: str, sequence_id: int, value: float, final: bool = True) -> Span:
    """A reward span as `agentlightning.emit_reward` writes it."""
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id=_TRACE,
        span_id=f"{sequence_id + 1:016x}",
        name="agentlightning.reward",
        start_time=1_700_000_000.0 + sequence_id,
        end_time=1_700_000_000.0 + sequence_id,
        attributes={semconv.SPAN_KIND: semconv.KIND_REWARD, semconv.REWARD_VALUE: value, semconv.REWARD_FINAL: final},
    )


def _call(
    rollout_id: str, attempt_id: str, index: int, version: int | None,
    agent: str | None = None, policy: str | None = None,
) -> LLMCall:  # fmt: skip
    return LLMCall(
        call_id=f"dash-{rollout_id}-{attempt_id}-{index}",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        prompt_token_ids=[1],
        response_token_ids=[2],
        model_version=version,
        agent_name=agent,
        policy=policy,
    )


class DashboardConformanceTests:
    """Dashboard queries every backend answers the same way (mixed into `StoreConformanceTests`)."""

    async def _run(
        self,
        store: LightningStore,
        status: str,
        reward: float | None = None,
        version: int | None = None,
        error: str | None = None,
    ) -> str:
        claim = await store.dequeue_rollout(worker_id="dash")
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        if reward is not None:
            await store.add_spans([make_reward_span(rid, aid, 0, reward)])
        if version is not None:
            await store.add_llm_calls([_call(rid, aid, 0, version)])
        await store.finish_attempt(rid, aid, status, error)  # pyright: ignore[reportArgumentType]
        return rid

    async def test_list_rollouts_summaries_filters_and_pages(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=2, retry_on=frozenset({"failed"})))
        requests = [
            RolloutRequest(rollout_id=f"dash-{i}", mode="train" if i < 4 else "val", group_id=f"g{i % 2}")
            for i in range(6)
        ]
        await store.enqueue_rollouts(requests)
        # a retried rollout goes back to the head of the queue, so its retry is the next dequeue
        await self._run(store, "succeeded", reward=1.0, version=3)  # dash-0
        await self._run(store, "failed", error="ValueError: boom")  # dash-1, retried ...
        await self._run(store, "failed", error="ValueError: again")  # ... and failed again: rollout failed
        await self._run(store, "succeeded", reward=0.0, version=4)  # dash-2
        await self._run(store, "succeeded", reward=0.5, version=4)  # dash-3
        await self._run(store, "succeeded", reward=1.0, version=4)  # dash-4
        await self._run(store, "failed", error="x" * 2000)  # dash-5: queuing again, its retry not started

        page = await store.list_rollouts()
        assert page.total == 6 and page.offset == 0 and page.limit == 50
        assert [r.rollout_id for r in page.rollouts] == [f"dash-{i}" for i in range(5, -1, -1)]  # newest first
        rows = {r.rollout_id: r for r in page.rollouts}
        assert rows["dash-0"].status == "succeeded" and rows["dash-0"].reward == 1.0
        assert rows["dash-0"].model_version == 3 and rows["dash-0"].attempts == 1
        assert rows["dash-0"].attempt_status == "succeeded" and rows["dash-0"].mode == "train"
        assert rows["dash-0"].duration is not None and rows["dash-0"].duration >= 0
        assert rows["dash-1"].status == "failed" and rows["dash-1"].attempts == 2
        assert rows["dash-1"].error == "ValueError: again" and rows["dash-1"].reward is None
        assert rows["dash-5"].status == "queuing" and rows["dash-5"].attempts == 1
        assert rows["dash-5"].attempt_status == "failed"
        assert rows["dash-5"].error is not None and len(rows["dash-5"].error) == 500
        assert rows["dash-4"].group_id == "g0" and rows["dash-4"].mode == "val"

        second = await store.list_rollouts(RolloutQuery(limit=4, offset=4))
        assert second.total == 6 and [r.rollout_id for r in second.rollouts] == ["dash-1", "dash-0"]

        async def ids(**filters: object) -> list[str]:
            return [r.rollout_id for r in (await store.list_rollouts(RolloutQuery.model_validate(filters))).rollouts]

        assert await ids(status=["failed"]) == ["dash-1"]
        assert await ids(status=["succeeded"], mode=["train"]) == ["dash-3", "dash-2", "dash-0"]
        assert await ids(group_id="g1") == ["dash-5", "dash-3", "dash-1"]
        assert await ids(model_version=4) == ["dash-4", "dash-3", "dash-2"]
        assert await ids(search="h-5") == ["dash-5"]
        assert await ids(status=[]) == []
        counted = await store.list_rollouts(RolloutQuery(status=["succeeded"], limit=1))
        assert counted.total == 4 and len(counted.rollouts) == 1

    async def test_list_rollouts_rejects_bad_queries(self, store: LightningStore) -> None:
        with pytest.raises(InvalidRequestError):
            await store.list_rollouts({"limit": 0})  # pyright: ignore[reportArgumentType]
        with pytest.raises(InvalidRequestError):
            await store.list_rollouts({"status": ["nonsense"]})  # pyright: ignore[reportArgumentType]
        with pytest.raises(InvalidRequestError):
            await store.list_rollouts({"unknown": 1})  # pyright: ignore[reportArgumentType]

    async def test_final_reward_is_the_last_final_reward_span(self, store: LightningStore) -> None:
        await store.enqueue_rollout("t", rollout_id="rw")
        claim = await store.dequeue_rollout()
        assert claim is not None
        aid = claim.attempt.attempt_id
        await store.add_spans([make_reward_span("rw", aid, 5, 0.25)])
        await store.add_spans([make_reward_span("rw", aid, 3, 0.75), make_reward_span("rw", aid, 7, 9.0, final=False)])
        await store.add_llm_calls([_call("rw", aid, 0, 2), _call("rw", aid, 1, 6), _call("rw", aid, 2, None)])
        await store.add_llm_calls([_call("rw", aid, 3, 5)])
        (row,) = (await store.list_rollouts(RolloutQuery(search="rw"))).rollouts
        assert row.reward == 0.25, "the final reward with the highest sequence id wins, whatever the arrival order"
        assert row.model_version == 6, "the newest model version that served a call"
        assert row.attempt_status == "running" and row.duration is not None

    async def test_run_stats(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=1))
        empty = await store.run_stats()
        assert empty.versions == [] and sum(b.finished for b in empty.throughput) == 0
        await store.enqueue_rollouts(
            [RolloutRequest(rollout_id=f"st-{i}", mode="val" if i == 5 else "train") for i in range(7)]
        )
        await self._run(store, "succeeded", reward=1.0, version=1)
        await self._run(store, "succeeded", reward=0.0, version=1)
        await self._run(store, "succeeded", reward=1.0, version=2)
        await self._run(store, "succeeded", reward=0.5, version=2)
        await self._run(store, "failed", error="boom", version=2)
        await self._run(store, "succeeded", reward=1.0, version=2)  # the val rollout
        running = await store.dequeue_rollout()
        assert running is not None
        stats = await store.run_stats(RunStatsQuery(success_reward=0.5, window=600, bucket=60))
        assert stats.rollouts["succeeded"] == 5 and stats.rollouts["running"] == 1
        assert stats.rollouts["queuing"] == 0
        assert stats.attempts.get("running") == 1 and stats.attempts.get("failed") == 1
        assert stats.success_reward == 0.5 and stats.bucket == 60
        keys = [(v.model_version, v.mode) for v in stats.versions]
        assert keys == [(1, "train"), (2, "train"), (2, "val")]
        v1, v2, v2val = stats.versions
        assert (v1.attempts, v1.succeeded, v1.rewarded, v1.successes) == (2, 2, 2, 1)
        assert v1.reward_mean == pytest.approx(0.5) and v1.success_rate == pytest.approx(0.5)
        assert (v2.attempts, v2.succeeded, v2.failed, v2.rewarded, v2.successes) == (3, 2, 1, 2, 2)
        assert v2.reward_mean == pytest.approx(0.75) and v2.success_rate == pytest.approx(1.0)
        assert v2.first_end is not None and v2.last_end is not None and v2.first_end <= v2.last_end
        assert (v2val.attempts, v2val.reward_mean) == (1, pytest.approx(1.0))
        assert len(stats.throughput) == 10
        assert sum(b.finished for b in stats.throughput) == 6 and sum(b.failed for b in stats.throughput) == 1
        assert stats.throughput[-1].start <= stats.now < stats.throughput[-1].start + 60

    async def test_run_stats_per_policy(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=1))
        assert (await store.run_stats()).policies == []
        await store.enqueue_rollouts(
            [RolloutRequest(rollout_id=f"pol-{i}", mode="val" if i == 3 else "train") for i in range(5)]
        )
        # (agent, policy, version) of each attempt's calls; the writer's twice in pol-0 (its reward counts once)
        plans: list[tuple[list[tuple[str | None, str | None, int | None]], float | None, str]] = [
            ([("writer", "writer", 1), ("writer", "writer", 1), ("checker", "frozen", 0)], 1.0, "succeeded"),
            ([("writer", "writer", 1), ("rewriter", "rewriter", 0), ("checker", "frozen", 0)], 0.5, "succeeded"),
            ([("writer", "writer", 2), (None, None, None)], None, "failed"),
            ([("writer", "writer", 2)], 0.25, "succeeded"),  # the val rollout
        ]
        for plan, reward, status in plans:
            claim = await store.dequeue_rollout(worker_id="dash")
            assert claim is not None
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            if reward is not None:
                await store.add_spans([make_reward_span(rid, aid, 0, reward)])
            await store.add_llm_calls([_call(rid, aid, i, v, a, policy) for i, (a, policy, v) in enumerate(plan)])
            await store.finish_attempt(rid, aid, status)  # pyright: ignore[reportArgumentType]
        running = await store.dequeue_rollout(worker_id="dash")  # a running attempt's calls are not counted yet
        assert running is not None
        rid, aid = running.rollout.rollout_id, running.attempt.attempt_id
        await store.add_llm_calls([_call(rid, aid, 0, 2, "writer", "writer")])
        rows = [
            (p.policy, p.agent_name, p.model_version, p.mode, p.calls, p.attempts, p.rewarded, p.reward_mean)
            for p in (await store.run_stats()).policies
        ]
        assert rows == [
            (None, None, None, "train", 1, 1, 0, None),
            ("frozen", "checker", 0, "train", 2, 2, 2, 0.75),
            ("rewriter", "rewriter", 0, "train", 1, 1, 1, 0.5),
            ("writer", "writer", 1, "train", 3, 2, 2, 0.75),
            ("writer", "writer", 2, "train", 1, 1, 0, None),
            ("writer", "writer", 2, "val", 1, 1, 1, 0.25),
        ]

    async def test_run_stats_per_worker(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=1))
        assert (await store.run_stats()).workers == []
        await store.enqueue_rollouts([RolloutRequest(rollout_id=f"wk-{i}") for i in range(7)])
        # (worker id, how the attempt ends; None: still running); an attempt without a worker id is not counted
        plans: list[tuple[str | None, str | None]] = [
            ("h1:10:0", "succeeded"), ("h1:10:1", "failed"), ("h1:10:0", "timeout"), ("h2:20:0", "cancelled"),
            ("h2:20:0", None), ("slot", "succeeded"), (None, "succeeded"),
        ]  # fmt: skip
        for worker_id, status in plans:
            claim = await store.dequeue_rollout(worker_id=worker_id)
            assert claim is not None
            if status is not None:
                await store.finish_attempt(claim.rollout.rollout_id, claim.attempt.attempt_id, status)  # pyright: ignore[reportArgumentType]
        workers = (await store.run_stats()).workers
        rows = [(w.worker_id, w.attempts, w.running, w.succeeded, w.failed, w.timed_out, w.cancelled) for w in workers]
        assert rows == [
            ("h1:10:0", 2, 0, 1, 0, 1, 0),
            ("h1:10:1", 1, 0, 0, 1, 0, 0),
            ("h2:20:0", 2, 1, 0, 0, 0, 1),
            ("slot", 1, 0, 1, 0, 0, 0),
        ]
        first = workers[0]
        assert first.first_start is not None and first.last_start is not None
        assert first.first_start <= first.last_start
        assert runner_totals(workers) == {
            "h1:10": {"claimed": 3, "running": 0, "finished": 1, "failed": 2, "workers": 2},
            "h2:20": {"claimed": 2, "running": 1, "finished": 0, "failed": 1, "workers": 1},
            "slot": {"claimed": 1, "running": 0, "finished": 1, "failed": 0, "workers": 1},
        }

    async def test_query_resources(self, store: LightningStore) -> None:
        assert await store.query_resources() == []
        first = await store.add_resources(Resources(resources_id="res-a"))
        second = await store.add_resources(Resources(resources_id="res-b"))
        await store.add_resources(Resources(resources_id="res-a"))
        assert await store.query_resources() == [first, second]
