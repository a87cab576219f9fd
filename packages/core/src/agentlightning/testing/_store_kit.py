"""`StoreConformanceTests`: the class-based pytest suite every `LightningStore` backend must pass.

Subclass it in a test module and provide a ``store_factory`` fixture::

    class TestMyStore(StoreConformanceTests):
        supports_reopen = True

        @pytest.fixture
        async def store_factory(self, tmp_path):
            stores = []

            async def make(retry_policy=None):
                store = MyStore(tmp_path / "s.db", retry_policy=retry_policy)
                stores.append(store)
                return store

            yield make
            for store in stores:
                await store.close()

``store_factory(retry_policy)`` returns a fresh, empty store that applies ``retry_policy`` (``None``: the
default policy). Backends that keep data across ``close()`` set ``supports_reopen`` and provide a
``store_reopener`` fixture (``await reopen(store)`` -> a new handle on the same data, after ``store`` was
closed). Backends that several processes can share set ``supports_processes`` and implement
``reopen_spec() -> (cls, kwargs)`` so a worker process can open the same store with ``cls(**kwargs)``.

The suite uses only the public protocol, so the same tests run against an HTTP client and a server.
Its tests come in parts: this module (queue, records, queries, resources, waiting, reopening), the attempt
lifecycle (`AttemptConformanceTests`), the refusal of records for attempts that ended (`LateRecordConformanceTests`),
the dashboard queries (`DashboardConformanceTests`), the exact round trip
of every field of spans and LLM calls (`RecordRoundTripTests`) and the refusal of bad input, the same on every
backend (`RefusalConformanceTests`).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest

from agentlightning._models import LLMCall, Resources, Span, ValueResource
from agentlightning.store import (
    InvalidRequestError,
    LightningStore,
    NotFoundError,
    RetryPolicy,
    RolloutQuery,
    RolloutRequest,
)
from agentlightning.testing._guard import KitGuard
from agentlightning.testing._store_kit_attempts import AttemptConformanceTests
from agentlightning.testing._store_kit_claims import ClaimConformanceTests
from agentlightning.testing._store_kit_dashboard import DashboardConformanceTests
from agentlightning.testing._store_kit_late import LateRecordConformanceTests
from agentlightning.testing._store_kit_records import RecordRoundTripTests
from agentlightning.testing._store_kit_refusals import RefusalConformanceTests

__all__ = ["StoreConformanceTests", "StoreFactory", "make_call", "make_span"]

StoreFactory = Callable[[RetryPolicy | None], Awaitable[LightningStore]]

_TRACE = "0af7651916cd43dd8448eb211c80319c"


def make_span(rollout_id: str, attempt_id: str, sequence_id: int, *, parent_id: str | None = None) -> Span:
    """A realistic, deterministic span for store tests (span id derived from ``sequence_id``)."""
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id=_TRACE,
        span_id=f"{sequence_id + 1:016x}",
        parent_id=parent_id,
        name=f"step-{sequence_id}",
        start_time=1_700_000_000.0 + sequence_id,
        end_time=1_700_000_000.5 + sequence_id,
        attributes={"gen_ai.system": "openai", "gen_ai.request.model": "toy", "agentlightning.reward": 0.5},
    )


def make_call(rollout_id: str, attempt_id: str, index: int, start_time: float) -> LLMCall:
    """A small LLM proxy record for store tests."""
    return LLMCall(
        call_id=f"call-{rollout_id}-{attempt_id}-{index}",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        response_id=f"chatcmpl-{index}",
        request={"messages": [{"role": "user", "content": "hi"}]},
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        response_logprobs=[-0.1, -0.2],
        start_time=start_time,
    )


def _process_dequeue_worker(spec: tuple[type, dict[str, Any]], results: Any) -> None:
    """Runs in a child process: open the shared store from its spec and dequeue until it is empty."""

    async def main() -> list[str]:
        cls, kwargs = spec
        store: Any = cls(**kwargs)
        got: list[str] = []
        try:
            while True:
                claim = await store.dequeue_rollout(worker_id=f"proc-{multiprocessing.current_process().pid}")
                if claim is None:
                    return got
                got.append(claim.rollout.rollout_id)
                await store.finish_attempt(claim.rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
        finally:
            await store.close()

    results.put(asyncio.run(main()))


class StoreConformanceTests(
    AttemptConformanceTests,
    ClaimConformanceTests,
    DashboardConformanceTests,
    LateRecordConformanceTests,
    RecordRoundTripTests,
    RefusalConformanceTests,
    KitGuard,
):
    """Shared semantics of `LightningStore`; subclass and provide ``store_factory``."""

    supports_reopen: ClassVar[bool] = False
    """The data survives ``close()``; requires a ``store_reopener`` fixture."""
    supports_processes: ClassVar[bool] = False
    """Several processes can share the store; requires ``reopen_spec()`` on the store."""

    @pytest.fixture
    async def store_factory(self) -> StoreFactory:
        raise NotImplementedError("subclasses of StoreConformanceTests must provide a `store_factory` fixture")

    @pytest.fixture
    async def store(self, store_factory: StoreFactory) -> LightningStore:
        return await store_factory(None)

    @pytest.fixture
    async def store_reopener(self) -> Callable[[LightningStore], Awaitable[LightningStore]]:
        pytest.skip("backend provides no store_reopener")

    # ---------------------------------------------------------------- queue

    async def test_satisfies_protocol(self, store: LightningStore) -> None:
        assert isinstance(store, LightningStore)
        assert isinstance(store.retry_policy, RetryPolicy)

    async def test_enqueue_dequeue_fifo(self, store: LightningStore) -> None:
        rollouts = await store.enqueue_rollouts([RolloutRequest(input={"i": i}) for i in range(5)])
        assert [r.input for r in rollouts] == [{"i": i} for i in range(5)]
        assert all(r.status == "queuing" and r.retry_count == 0 for r in rollouts)
        assert len({r.rollout_id for r in rollouts}) == 5
        seen: list[str] = []
        for _ in range(5):
            claim = await store.dequeue_rollout(worker_id="w1")
            assert claim is not None
            assert claim.rollout.status == "running"
            assert claim.attempt.status == "running"
            assert claim.attempt.sequence == 1
            assert claim.attempt.worker_id == "w1"
            assert claim.attempt.rollout_id == claim.rollout.rollout_id
            seen.append(claim.rollout.rollout_id)
        assert seen == [r.rollout_id for r in rollouts]
        assert await store.dequeue_rollout() is None

    async def test_dequeue_empty(self, store: LightningStore) -> None:
        assert await store.dequeue_rollout() is None
        assert await store.dequeue_rollout(worker_id="w") is None

    async def test_enqueue_is_idempotent(self, store: LightningStore) -> None:
        first = await store.enqueue_rollout(
            {"q": 1}, rollout_id="task-1", mode="train", group_id="g", metadata={"a": 1}
        )
        again = await store.enqueue_rollout({"q": "different"}, rollout_id="task-1")
        assert again == first
        batch = await store.enqueue_rollouts(
            [
                RolloutRequest(rollout_id="task-1"),
                RolloutRequest(rollout_id="task-2"),
                RolloutRequest(rollout_id="task-2"),
            ]
        )
        assert batch[0] == first
        assert batch[1] == batch[2]
        stored = await store.query_rollouts()
        assert [r.rollout_id for r in stored] == ["task-1", "task-2"]
        assert stored[0].input == {"q": 1} and stored[0].mode == "train" and stored[0].metadata == {"a": 1}

    async def test_get_rollout(self, store: LightningStore) -> None:
        rollout = await store.enqueue_rollout([1, "two", {"three": 3.0}], rollout_id="r-get")
        assert await store.get_rollout("r-get") == rollout
        with pytest.raises(NotFoundError, match="no-such-rollout"):
            await store.get_rollout("no-such-rollout")

    async def test_bad_enqueue_request_changes_nothing(self, store: LightningStore) -> None:
        with pytest.raises(InvalidRequestError, match="mode"):
            await store.enqueue_rollouts(
                [RolloutRequest(rollout_id="ok-1"), {"rollout_id": "bad", "mode": "nonsense"}]  # pyright: ignore[reportArgumentType]
            )
        assert await store.query_rollouts() == []

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("rollout_id", "."),
            ("rollout_id", ".."),
            ("rollout_id", "r" * 257),
            ("group_id", ".."),
            ("group_id", "g" * 257),
            ("group_id", ""),
            ("group_id", "a\x00b"),
            ("resources_id", "."),
            ("resources_id", "x" * 257),
        ],
        ids=[
            "dot",
            "dotdot",
            "long-rollout",
            "dotdot-group",
            "long-group",
            "empty-group",
            "nul-group",
            "dot-res",
            "long-res",
        ],
    )
    async def test_unroutable_id_refused_at_enqueue(self, store: LightningStore, field: str, value: str) -> None:
        """One rule for every id a store keeps: what no URL or dashboard filter can name never gets in."""
        with pytest.raises(InvalidRequestError, match=field):
            await store.enqueue_rollouts([RolloutRequest(rollout_id="ok-1"), {"rollout_id": "ok-2", field: value}])  # pyright: ignore[reportArgumentType]
        with pytest.raises(InvalidRequestError, match=field):
            await store.enqueue_rollout("task", **{"rollout_id": "ok-3", field: value})
        assert await store.query_rollouts() == []
        if field == "resources_id":
            with pytest.raises(InvalidRequestError, match=field):
                await store.add_resources({"resources_id": value, "items": {}})  # pyright: ignore[reportArgumentType]
            assert await store.get_resources() is None

    async def test_ids_at_the_limits_are_kept_and_found(self, store: LightningStore) -> None:
        group = "g" * 256
        odd = ["...", "a/../b", "./x", "task/7#2?q=1 %2F", "r" * 256]
        await store.enqueue_rollouts([RolloutRequest(rollout_id=rid, group_id=group) for rid in odd])
        for rid in odd:  # a served store reaches each by its URL
            assert (await store.get_rollout(rid)).group_id == group
        page = await store.list_rollouts(RolloutQuery(group_id=group))
        assert sorted(r.rollout_id for r in page.rollouts) == sorted(odd)

    # ---------------------------------------------------------------- spans and calls

    async def _running(self, store: LightningStore) -> tuple[str, str]:
        await store.enqueue_rollout("with spans")
        claim = await store.dequeue_rollout()
        assert claim is not None
        return claim.rollout.rollout_id, claim.attempt.attempt_id

    async def test_spans_idempotent_and_ordered(self, store: LightningStore) -> None:
        rid, aid = await self._running(store)
        spans = [make_span(rid, aid, i) for i in (3, 0, 2, 1)]
        assert await store.add_spans(spans) == 4
        assert await store.add_spans(spans[:2]) == 0
        assert await store.add_spans([*spans[:1], make_span(rid, aid, 4), make_span(rid, aid, 4)]) == 1
        stored = await store.query_spans(rid)
        assert [s.sequence_id for s in stored] == [0, 1, 2, 3, 4]
        assert stored[0] == make_span(rid, aid, 0)
        assert await store.query_spans(rid, aid) == stored
        assert await store.query_spans(rid, "other-attempt") == []
        assert (await store.stats()).spans == 5

    async def test_spans_ordered_by_attempt(self, store_factory: StoreFactory) -> None:
        store = await store_factory(RetryPolicy(max_attempts=2))
        rid, first = await self._running(store)
        await store.add_spans([make_span(rid, first, 1), make_span(rid, first, 0)])
        await store.finish_attempt(rid, first, "failed")
        claim = await store.dequeue_rollout()
        assert claim is not None
        second = claim.attempt.attempt_id
        await store.add_spans([make_span(rid, second, 0), make_span(rid, second, 1)])
        stored = await store.query_spans(rid)
        assert [(s.attempt_id, s.sequence_id) for s in stored] == [(first, 0), (first, 1), (second, 0), (second, 1)]
        assert [s.attempt_id for s in await store.query_spans(rid, second)] == [second, second]

    async def test_span_batch_all_or_nothing(self, store: LightningStore) -> None:
        rid, aid = await self._running(store)
        good = [make_span(rid, aid, i).model_dump() for i in range(3)]
        bad = make_span(rid, aid, 3).model_dump()
        bad["span_id"] = "not-hex"
        with pytest.raises(InvalidRequestError, match="span_id"):
            await store.add_spans([*good, bad])  # pyright: ignore[reportArgumentType]
        assert await store.query_spans(rid) == []
        assert (await store.stats()).spans == 0
        assert await store.add_spans(good) == 3  # pyright: ignore[reportArgumentType]  # dicts are validated

    async def test_llm_calls(self, store: LightningStore) -> None:
        rid, aid = await self._running(store)
        calls = [make_call(rid, aid, i, start_time=100.0 - i) for i in range(3)]
        assert await store.add_llm_calls(calls) == 3
        assert await store.add_llm_calls(calls) == 0
        stored = await store.query_llm_calls(rid)
        assert [c.call_id for c in stored] == [c.call_id for c in reversed(calls)]
        assert stored[-1] == calls[0]
        assert await store.query_llm_calls(rid, aid) == stored
        assert await store.query_llm_calls(rid, "nope") == []
        bad = make_call(rid, aid, 9, 1.0).model_dump()
        bad["response_logprobs"] = [0.0]
        with pytest.raises(InvalidRequestError, match="response_logprobs"):
            await store.add_llm_calls([make_call(rid, aid, 8, 1.0), bad])  # pyright: ignore[reportArgumentType]
        assert len(await store.query_llm_calls(rid)) == 3

    # ---------------------------------------------------------------- queries

    async def test_query_rollouts(self, store: LightningStore) -> None:
        rollouts = await store.enqueue_rollouts([RolloutRequest(rollout_id=f"q-{i}") for i in range(4)])
        claim = await store.dequeue_rollout()
        assert claim is not None
        await store.finish_attempt(claim.rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
        await store.dequeue_rollout()
        assert [r.rollout_id for r in await store.query_rollouts()] == [r.rollout_id for r in rollouts]
        assert [r.rollout_id for r in await store.query_rollouts(status=["queuing"])] == ["q-2", "q-3"]
        assert [r.rollout_id for r in await store.query_rollouts(status=["succeeded", "running"])] == ["q-0", "q-1"]
        picked = await store.query_rollouts(rollout_ids=["q-3", "q-0", "unknown"])
        assert [r.rollout_id for r in picked] == ["q-0", "q-3"]
        assert await store.query_rollouts(status=["queuing"], rollout_ids=["q-0"]) == []
        with pytest.raises(InvalidRequestError):
            await store.query_rollouts(status=["sleeping"])  # pyright: ignore[reportArgumentType]

    # ---------------------------------------------------------------- resources

    async def test_resources_versioning(self, store: LightningStore) -> None:
        assert await store.get_resources() is None
        first = await store.add_resources(Resources(resources_id="res-a", items={"v": ValueResource(value=1)}))
        second = await store.add_resources(Resources(resources_id="res-b", items={"v": ValueResource(value=2)}))
        assert first.version >= 1
        assert second.version > first.version
        again = await store.add_resources(Resources(resources_id="res-a", items={"v": ValueResource(value=99)}))
        assert again == first
        latest = await store.get_resources()
        assert latest == second
        assert await store.get_resources("res-a") == first
        assert (await store.stats()).resources == 2

    # ---------------------------------------------------------------- waiting

    async def test_wait_for_rollouts(self, store: LightningStore) -> None:
        a = await store.enqueue_rollout("a")
        b = await store.enqueue_rollout("b")

        async def work() -> None:
            for _ in range(2):
                claim = await store.dequeue_rollout()
                assert claim is not None
                await asyncio.sleep(0.02)
                await store.finish_attempt(claim.rollout.rollout_id, claim.attempt.attempt_id, "succeeded")

        worker = asyncio.create_task(work())
        finished = await store.wait_for_rollouts([a.rollout_id, b.rollout_id], timeout=30)
        await worker
        assert [r.rollout_id for r in finished] == [a.rollout_id, b.rollout_id]
        assert all(r.status == "succeeded" for r in finished)

    async def test_wait_for_rollouts_timeout(self, store: LightningStore) -> None:
        done = await store.enqueue_rollout("done")
        pending = await store.enqueue_rollout("pending")
        claim = await store.dequeue_rollout()
        assert claim is not None
        await store.finish_attempt(done.rollout_id, claim.attempt.attempt_id, "succeeded")
        finished = await store.wait_for_rollouts([done.rollout_id, pending.rollout_id], timeout=0.1)
        assert [r.rollout_id for r in finished] == [done.rollout_id]
        assert await store.wait_for_rollouts([pending.rollout_id], timeout=0) == []

    # ---------------------------------------------------------------- stats and lifecycle

    async def test_stats(self, store: LightningStore) -> None:
        empty = await store.stats()
        assert sum(empty.rollouts.values()) == 0 and empty.attempts == 0 and empty.spans == 0
        await store.enqueue_rollouts([RolloutRequest() for _ in range(3)])
        claim = await store.dequeue_rollout()
        assert claim is not None
        await store.add_llm_calls([make_call(claim.rollout.rollout_id, claim.attempt.attempt_id, 0, 1.0)])
        stats = await store.stats()
        assert stats.rollouts["queuing"] == 2 and stats.rollouts["running"] == 1
        assert stats.rollouts.get("succeeded", 0) == 0
        assert stats.attempts == 1 and stats.llm_calls == 1 and stats.resources == 0

    async def test_reopen_keeps_everything(
        self,
        store: LightningStore,
        store_reopener: Callable[[LightningStore], Awaitable[LightningStore]],
    ) -> None:
        if not self.supports_reopen:
            pytest.skip("backend does not keep data across close()")
        rid, aid = await self._running(store)
        await store.add_spans([make_span(rid, aid, i) for i in range(3)])
        await store.add_llm_calls([make_call(rid, aid, 0, 5.0)])
        res = await store.add_resources(Resources(resources_id="r1"))
        queued = await store.enqueue_rollout("later")
        await store.close()
        reopened = await store_reopener(store)
        try:
            assert (await reopened.get_rollout(rid)).status == "running"
            assert [s.sequence_id for s in await reopened.query_spans(rid)] == [0, 1, 2]
            assert len(await reopened.query_llm_calls(rid)) == 1
            assert await reopened.get_resources() == res
            nxt = await reopened.add_resources(Resources(resources_id="r2"))
            assert nxt.version > res.version
            claim = await reopened.dequeue_rollout()
            assert claim is not None and claim.rollout.rollout_id == queued.rollout_id
        finally:
            await reopened.close()

    async def test_processes_share_the_queue(self, store: LightningStore) -> None:
        if not self.supports_processes:
            pytest.skip("backend cannot be shared across processes")
        reopen_spec: Callable[[], tuple[type, dict[str, Any]]] = store.reopen_spec  # pyright: ignore[reportAttributeAccessIssue]
        ids = [f"mp-{uuid.uuid4().hex[:8]}-{i}" for i in range(60)]
        await store.enqueue_rollouts([RolloutRequest(rollout_id=i) for i in ids])
        ctx = multiprocessing.get_context("spawn")
        results: Any = ctx.Queue()
        procs = [ctx.Process(target=_process_dequeue_worker, args=(reopen_spec(), results)) for _ in range(3)]
        for proc in procs:
            proc.start()
        loop = asyncio.get_running_loop()
        per_process: list[list[str]] = [await loop.run_in_executor(None, results.get, True, 120) for _ in procs]
        for proc in procs:
            await loop.run_in_executor(None, proc.join, 30)
            assert proc.exitcode == 0
        got = [rid for chunk in per_process for rid in chunk]
        assert sorted(got) == sorted(ids), "every rollout must be claimed by exactly one process"
        stats = await store.stats()
        assert stats.rollouts["succeeded"] == len(ids) and stats.attempts == len(ids)
