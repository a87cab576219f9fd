"""Late spans in a shared batch (issue 38): the store refuses a batch holding a span of an attempt that ended, so the
span writer writes it again per attempt; only the late attempt's spans are lost, and only its flush reports it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import TracerProvider

from agentlightning._models import Span
from agentlightning.store import MemoryStore
from agentlightning.tracing import LightningSpanProcessor, SpanWriteError, rollout_context


class _RecordingStore(MemoryStore):
    """A real MemoryStore that records the size of each add_spans batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    async def add_spans(self, spans: Sequence[Span], *, request_id: str | None = None) -> int:
        self.batches.append(len(spans))
        return await super().add_spans(spans)


async def test_a_late_span_in_a_shared_batch_costs_only_its_own_attempt() -> None:
    processor = LightningSpanProcessor(max_batch_size=1000, max_delay=60.0)  # only the flushes send
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("late-test")
    store = _RecordingStore()
    started: list[tuple[str, str]] = []
    for name in ("running", "ended"):
        await store.enqueue_rollout(name)
        claim = await store.dequeue_rollout("test")
        assert claim is not None
        started.append((claim.rollout.rollout_id, claim.attempt.attempt_id))
    (running_rid, running), (ended_rid, ended) = started
    await store.finish_attempt(ended_rid, ended, "succeeded")  # ended elsewhere; its agent still runs
    for rid, aid in started:
        with rollout_context(store, rid, aid):
            tracer.start_span(f"step of {rid}").end()
    await processor.aflush(10, running)  # the running attempt's flush succeeds
    assert store.batches == [2, 1, 1]  # the shared batch was refused, then written per attempt
    assert [s.attempt_id for s in await store.query_spans(running_rid)] == [running]
    assert await store.query_spans(ended_rid) == []
    with pytest.raises(SpanWriteError, match="already ended"):  # the late attempt's flush says why
        await processor.aflush(10, ended)
    assert processor.stats()["spans_written"] == 1 and processor.stats()["spans_failed"] == 1
    processor.shutdown()
