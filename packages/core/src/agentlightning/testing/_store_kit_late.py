"""The late-record part of the store test kit: records of an attempt that no longer runs are refused.

Mixed into `StoreConformanceTests` (which provides the ``store`` and ``store_factory`` fixtures), so every backend
(and a served store through its client) refuses a span or an LLM call of an attempt that ended, whichever way it
ended: finished through the API, timed out by its heartbeat, cancelled with its rollout, released by its runner.
A refused batch stores nothing, and a record racing its attempt's end either lands before the end or is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agentlightning import semconv
from agentlightning._models import LLMCall, Span
from agentlightning.store import AttemptEndedError, ConflictError, LightningStore, NotFoundError, RetryPolicy

__all__ = ["LateRecordConformanceTests"]

StoreFactory = Callable[[RetryPolicy | None], Awaitable[LightningStore]]
Ender = Callable[[LightningStore, str, str], Awaitable[None]]


def _span(rollout_id: str, attempt_id: str, sequence_id: int) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id=f"{sequence_id + 1:016x}",
        name=f"late-{sequence_id}",
        start_time=1_700_000_000.0 + sequence_id,
        end_time=1_700_000_000.5 + sequence_id,
    )


def _call(rollout_id: str, attempt_id: str, index: int) -> LLMCall:
    return LLMCall(
        call_id=f"call-{attempt_id}-{index}",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        request={"messages": [{"role": "user", "content": "late?"}]},
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        start_time=1_700_000_000.0 + index,
    )


async def _finish_succeeded(store: LightningStore, rollout_id: str, attempt_id: str) -> None:
    await store.finish_attempt(rollout_id, attempt_id, "succeeded")


async def _finish_failed(store: LightningStore, rollout_id: str, attempt_id: str) -> None:
    await store.finish_attempt(rollout_id, attempt_id, "failed", "the agent raised")


async def _cancel(store: LightningStore, rollout_id: str, attempt_id: str) -> None:
    await store.cancel_rollout(rollout_id)


async def _release(store: LightningStore, rollout_id: str, attempt_id: str) -> None:
    await store.release_claim(rollout_id, attempt_id)


_ENDS: dict[str, Ender] = {
    "finished-succeeded": _finish_succeeded,
    "finished-failed": _finish_failed,
    "cancelled": _cancel,
    "released": _release,
}


async def _time_out(store: LightningStore, attempt_id: str) -> None:
    """Wait (on the store's own answer, not a clock) until ``check_timeouts`` has ended the attempt."""
    while attempt_id not in [a.attempt_id for a in await store.check_timeouts()]:
        await asyncio.sleep(0.02)


class LateRecordConformanceTests:
    """Records only join running attempts (`StoreConformanceTests` mixes this in)."""

    async def _claim(self, store: LightningStore) -> tuple[str, str]:
        await store.enqueue_rollout("late records")
        claim = await store.dequeue_rollout()
        assert claim is not None
        return claim.rollout.rollout_id, claim.attempt.attempt_id

    async def _assert_refused(self, store: LightningStore, rollout_id: str, attempt_id: str, status: str) -> None:
        spans, calls = len(await store.query_spans(rollout_id)), len(await store.query_llm_calls(rollout_id))
        with pytest.raises(AttemptEndedError, match=f"already ended \\({status}\\)") as refused:
            await store.add_spans([_span(rollout_id, attempt_id, 7)])
        assert isinstance(refused.value, ConflictError)  # a served store answers 409
        with pytest.raises(AttemptEndedError, match=attempt_id):
            await store.add_llm_calls([_call(rollout_id, attempt_id, 7)])
        with pytest.raises(AttemptEndedError):  # with a request id too (a fresh request is no retry)
            await store.add_spans([_span(rollout_id, attempt_id, 8)], request_id="late-request")
        assert len(await store.query_spans(rollout_id)) == spans
        assert len(await store.query_llm_calls(rollout_id)) == calls

    @pytest.mark.parametrize("end", sorted(_ENDS))
    async def test_records_of_an_ended_attempt_are_refused(self, store: LightningStore, end: str) -> None:
        rollout_id, attempt_id = await self._claim(store)
        assert await store.add_spans([_span(rollout_id, attempt_id, 0)]) == 1
        assert await store.add_llm_calls([_call(rollout_id, attempt_id, 0)]) == 1
        await _ENDS[end](store, rollout_id, attempt_id)
        (attempt,) = [a for a in await store.query_attempts(rollout_id) if a.attempt_id == attempt_id]
        await self._assert_refused(store, rollout_id, attempt_id, attempt.status)
        assert [s.sequence_id for s in await store.query_spans(rollout_id)] == [0]
        assert len(await store.query_llm_calls(rollout_id)) == 1

    @pytest.mark.parametrize("end", sorted(_ENDS))
    async def test_judge_verdicts_join_an_ended_attempt_alone(self, store: LightningStore, end: str) -> None:
        """A batch of judge verdicts (kind ``judge``) annotates an ended attempt; one with any other span is refused."""
        rollout_id, attempt_id = await self._claim(store)
        await _ENDS[end](store, rollout_id, attempt_id)
        verdict = _span(rollout_id, attempt_id, 3).model_copy(
            update={"attributes": {semconv.SPAN_KIND: semconv.KIND_JUDGE, "agentlightning.judge.score": 0.5}}
        )
        with pytest.raises(AttemptEndedError):
            await store.add_spans([verdict, _span(rollout_id, attempt_id, 4)])
        assert await store.add_spans([verdict]) == 1
        assert [s.sequence_id for s in await store.query_spans(rollout_id)] == [3]
        with pytest.raises(NotFoundError):  # still only for an attempt the store started
            await store.add_spans([verdict.model_copy(update={"attempt_id": "never-started"})])

    async def test_records_after_a_heartbeat_timeout_are_refused_while_the_retry_runs(
        self, store_factory: StoreFactory
    ) -> None:
        store = await store_factory(RetryPolicy(max_attempts=2, heartbeat_timeout=0.05))
        rollout_id, first = await self._claim(store)
        await _time_out(store, first)
        retry = await store.dequeue_rollout()
        assert retry is not None and retry.rollout.rollout_id == rollout_id
        second = retry.attempt.attempt_id
        await self._assert_refused(store, rollout_id, first, "unresponsive")
        # the retry's own records are taken: the rule is per attempt, not per rollout
        assert await store.add_spans([_span(rollout_id, second, 0)]) == 1
        assert await store.add_llm_calls([_call(rollout_id, second, 0)]) == 1
        assert {s.attempt_id for s in await store.query_spans(rollout_id)} == {second}

    async def test_a_batch_with_one_late_record_stores_nothing(self, store: LightningStore) -> None:
        ended_rollout, ended = await self._claim(store)
        running_rollout, running = await self._claim(store)
        await store.finish_attempt(ended_rollout, ended, "succeeded")
        with pytest.raises(AttemptEndedError, match=ended):
            await store.add_spans([_span(running_rollout, running, 0), _span(ended_rollout, ended, 0)])
        with pytest.raises(AttemptEndedError, match=ended):
            await store.add_llm_calls([_call(running_rollout, running, 0), _call(ended_rollout, ended, 0)])
        assert await store.query_spans(running_rollout) == []
        assert await store.query_llm_calls(running_rollout) == []

    async def test_a_retried_request_stored_before_the_end_gets_its_first_answer(self, store: LightningStore) -> None:
        rollout_id, attempt_id = await self._claim(store)
        assert await store.add_spans([_span(rollout_id, attempt_id, 0)], request_id="req-spans") == 1
        assert await store.add_llm_calls([_call(rollout_id, attempt_id, 0)], request_id="req-calls") == 1
        await store.finish_attempt(rollout_id, attempt_id, "succeeded")
        # the answer of the first request was lost, its retry comes after the end: the same answer, nothing more
        assert await store.add_spans([_span(rollout_id, attempt_id, 0)], request_id="req-spans") == 1
        assert await store.add_llm_calls([_call(rollout_id, attempt_id, 0)], request_id="req-calls") == 1
        assert len(await store.query_spans(rollout_id)) == 1

    async def test_records_racing_the_end_land_before_it_or_are_refused(self, store: LightningStore) -> None:
        rollout_id, attempt_id = await self._claim(store)

        async def add(index: int) -> int | None:
            try:
                if index % 2:
                    return index if await store.add_llm_calls([_call(rollout_id, attempt_id, index)]) else None
                return index if await store.add_spans([_span(rollout_id, attempt_id, index)]) else None
            except AttemptEndedError:
                return None

        writes = [asyncio.ensure_future(add(i)) for i in range(40)]
        await asyncio.sleep(0)  # some writes start before the end, the rest race it or follow it
        await store.finish_attempt(rollout_id, attempt_id, "succeeded")
        stored = {i for i in await asyncio.gather(*writes) if i is not None}
        kept = {s.sequence_id for s in await store.query_spans(rollout_id)}
        kept |= {int(c.call_id.rsplit("-", 1)[1]) for c in await store.query_llm_calls(rollout_id)}
        assert kept == stored  # every record the store took was answered as stored; nothing else landed
        with pytest.raises(AttemptEndedError):
            await store.add_spans([_span(rollout_id, attempt_id, 99)])
