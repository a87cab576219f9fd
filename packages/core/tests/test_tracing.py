"""Tracing: OpenTelemetry spans recorded in a rollout context land in that rollout's store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from agentlightning import semconv
from agentlightning._models import Span
from agentlightning.store import MemoryStore, SqliteStore, StoreError
from agentlightning.tracing import (
    LightningSpanProcessor,
    SpanWriteError,
    aflush,
    attach_to,
    current_rollout,
    flush,
    get_span_processor,
    get_tracer,
    rollout_context,
)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        yield MemoryStore()
    else:
        s = SqliteStore(tmp_path / "store.db")
        yield s
        asyncio.run(s.close())


async def _start(store, n: int = 1) -> list[tuple[str, str]]:
    """Enqueue and claim ``n`` rollouts; returns their (rollout_id, attempt_id)."""
    ids = []
    for i in range(n):
        await store.enqueue_rollout({"i": i})
        claim = await store.dequeue_rollout("test")
        ids.append((claim.rollout.rollout_id, claim.attempt.attempt_id))
    return ids


async def test_spans_land_with_ids_tree_and_fields(store) -> None:
    [(rid, aid)] = await _start(store)
    tracer = get_tracer("test")
    with rollout_context(store, rid, aid) as ctx:
        assert current_rollout() is ctx
        with tracer.start_as_current_span("root", attributes={"k": [1, 2, 3]}) as root:
            with tracer.start_as_current_span("child") as child:
                child.add_event("hello", {"n": 1})
                child.set_status(Status(StatusCode.ERROR, "bad"))
            root.set_attribute("after", "yes")
    assert current_rollout() is None
    await aflush(10)

    spans = await store.query_spans(rid, aid)
    assert [s.name for s in spans] == ["root", "child"]  # ordered by sequence_id (start order)
    root_span, child_span = spans
    assert [s.sequence_id for s in spans] == [0, 1]
    for s in spans:
        assert (s.rollout_id, s.attempt_id) == (rid, aid)
        assert s.attributes[semconv.ROLLOUT_ID] == rid
        assert s.attributes[semconv.ATTEMPT_ID] == aid
        assert s.trace_id == root_span.trace_id
        assert s.end_time >= s.start_time > 1.5e9  # seconds since the epoch, not nanoseconds
    assert root_span.parent_id is None
    assert child_span.parent_id == root_span.span_id
    assert root_span.attributes["k"] == [1, 2, 3]
    assert root_span.attributes["after"] == "yes"
    assert child_span.events[0].name == "hello" and child_span.events[0].attributes == {"n": 1}
    assert child_span.status.code == "error" and child_span.status.description == "bad"


def test_get_tracer_reuses_one_tracer_per_scope() -> None:
    first = get_tracer("scope-a")
    assert get_tracer("scope-a") is first
    assert get_tracer("scope-a", "1.0") is not first
    assert get_tracer("scope-a", "1.0") is get_tracer("scope-a", "1.0")
    versioned = get_tracer("scope-a", "1.0").start_span("s")
    plain = first.start_span("s")
    assert versioned.instrumentation_scope.version == "1.0"  # pyright: ignore[reportAttributeAccessIssue]
    assert plain.instrumentation_scope.name == "scope-a"  # pyright: ignore[reportAttributeAccessIssue]
    versioned.end()
    plain.end()


async def test_spans_outside_rollout_are_dropped_and_counted(store) -> None:
    processor = get_span_processor()
    before = processor.stats()
    with get_tracer().start_as_current_span("nowhere"):
        pass
    await aflush(10)
    after = processor.stats()
    assert after["dropped_outside_rollout"] == before["dropped_outside_rollout"] + 1
    assert after["spans_written"] == before["spans_written"]
    assert (await store.stats()).spans == 0


async def test_sequence_ids_are_unique_and_follow_start_order(store) -> None:
    [(rid, aid)] = await _start(store)
    tracer = get_tracer()
    with rollout_context(store, rid, aid):
        outer = tracer.start_span("outer")  # started first, ended last
        for i in range(20):
            tracer.start_span(f"s{i}").end()
        outer.end()
    await aflush(10)
    spans = await store.query_spans(rid, aid)
    assert [s.sequence_id for s in spans] == list(range(21))
    assert [s.name for s in spans] == ["outer"] + [f"s{i}" for i in range(20)]


async def test_64_concurrent_asyncio_rollouts_never_mix(store) -> None:
    ids = await _start(store, 64)
    tracer = get_tracer()

    async def one(rid: str, aid: str) -> None:
        with rollout_context(store, rid, aid):
            for step in range(5):
                with tracer.start_as_current_span(f"step{step}", attributes={"owner": rid}):
                    await asyncio.sleep(0)  # interleave with the other 63 tasks inside each span

    await asyncio.gather(*(one(rid, aid) for rid, aid in ids))
    await aflush(30)
    for rid, aid in ids:
        spans = await store.query_spans(rid)
        assert len(spans) == 5
        assert {s.attributes["owner"] for s in spans} == {rid}
        assert {s.attempt_id for s in spans} == {aid}
        assert sorted(s.sequence_id for s in spans) == list(range(5))


async def test_16_threads_never_mix(store) -> None:
    ids = await _start(store, 16)
    tracer = get_tracer()
    barrier = threading.Barrier(16)

    def one(rid: str, aid: str) -> None:
        with rollout_context(store, rid, aid):
            barrier.wait()  # all 16 contexts are live at once
            for step in range(10):
                with tracer.start_as_current_span(f"step{step}", attributes={"owner": rid}):
                    pass
        flush(30)

    threads = [threading.Thread(target=one, args=ids[i]) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rid, aid in ids:
        spans = await store.query_spans(rid)
        assert len(spans) == 10
        assert {(s.attributes["owner"], s.attempt_id) for s in spans} == {(rid, aid)}


async def test_child_span_on_a_thread_without_the_context_follows_its_parent() -> None:
    store = MemoryStore()
    [(rid, aid)] = await _start(store)
    tracer = get_tracer()
    with rollout_context(store, rid, aid), tracer.start_as_current_span("parent") as parent:
        parent_ctx = trace.set_span_in_context(parent)

        def pool_callback() -> None:  # a plain thread: the context variable did not follow
            assert current_rollout() is None
            tracer.start_span("from-pool", context=parent_ctx).end()

        t = threading.Thread(target=pool_callback)
        t.start()
        t.join()
    await aflush(10)
    names = {s.name: s for s in await store.query_spans(rid, aid)}
    assert set(names) == {"parent", "from-pool"}
    assert names["from-pool"].parent_id == names["parent"].span_id


async def test_flush_inside_a_running_loop_points_to_aflush() -> None:
    with pytest.raises(RuntimeError, match="aflush"):
        flush(1)


class _RecordingStore(MemoryStore):
    """A real MemoryStore that records each add_spans batch and the loop it ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.loops: list[asyncio.AbstractEventLoop] = []

    async def add_spans(self, spans: Sequence[Span]) -> int:
        self.batches.append(len(spans))
        self.loops.append(asyncio.get_running_loop())
        return await super().add_spans(spans)


async def test_batches_are_cut_by_size() -> None:
    processor = LightningSpanProcessor(max_batch_size=100, max_delay=60.0)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("batch-test")
    store = _RecordingStore()
    [(rid, aid)] = await _start(store)
    with rollout_context(store, rid, aid):
        for i in range(250):
            tracer.start_span(f"s{i}").end()
    await processor.aflush(10)
    assert store.batches == [100, 100, 50]
    assert len(await store.query_spans(rid)) == 250
    processor.shutdown()


async def test_rollouts_that_end_together_flush_in_one_write_and_each_finds_its_spans_stored() -> None:
    processor = LightningSpanProcessor(max_batch_size=1000, max_delay=60.0)  # only the flushes send
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("flush-test")
    store = _RecordingStore()
    started = await _start(store, 8)

    async def rollout(rid: str, aid: str) -> list[str]:
        with rollout_context(store, rid, aid), tracer.start_as_current_span("root"):
            tracer.start_span("llm").end()
        await processor.aflush(10, aid)
        return [s.name for s in await store.query_spans(rid, aid)]  # stored by the time its flush returned

    names = await asyncio.gather(*(rollout(rid, aid) for rid, aid in started))
    assert names == [["root", "llm"]] * 8
    assert store.batches == [16]  # one write for the eight flushes
    with rollout_context(store, *started[0]):
        tracer.start_span("late").end()
    await processor.aflush(10)  # a later flush sends what ended since
    assert store.batches == [16, 1]
    processor.shutdown()


async def test_batches_are_cut_by_time() -> None:
    processor = LightningSpanProcessor(max_batch_size=10_000, max_delay=0.01)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    store = _RecordingStore()
    [(rid, aid)] = await _start(store)
    with rollout_context(store, rid, aid):
        provider.get_tracer("t").start_span("one").end()
    # no flush: the delay alone must get the span written
    for _ in range(500):
        if store.batches:
            break
        await asyncio.sleep(0.01)
    assert store.batches == [1]
    processor.shutdown()


async def test_async_contexts_write_on_their_own_loop_sync_ones_on_the_writer_loop() -> None:
    store = _RecordingStore()
    [(rid1, aid1), (rid2, aid2)] = await _start(store, 2)
    tracer = get_tracer()
    with rollout_context(store, rid1, aid1):  # entered in a running loop: that loop owns the store
        tracer.start_span("async-side").end()
    await aflush(10)
    assert store.loops == [asyncio.get_running_loop()]

    def sync_side() -> None:
        with rollout_context(store, rid2, aid2):
            tracer.start_span("sync-side").end()
        flush(10)

    await asyncio.to_thread(sync_side)
    assert len(store.loops) == 2 and store.loops[1] is not asyncio.get_running_loop()
    assert len(await store.query_spans(rid2)) == 1


class _FlakyStore(MemoryStore):
    def __init__(self, failures: int, error: type[Exception]) -> None:
        super().__init__()
        self.failures = failures
        self.error = error
        self.calls = 0

    async def add_spans(self, spans: Sequence[Span]) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error("store unavailable")
        return await super().add_spans(spans)


async def test_transient_write_errors_are_retried() -> None:
    store = _FlakyStore(failures=1, error=ConnectionError)
    [(rid, aid)] = await _start(store)
    with rollout_context(store, rid, aid):
        get_tracer().start_span("kept").end()
    await aflush(10)
    assert store.calls == 2
    assert [s.name for s in await store.query_spans(rid)] == ["kept"]


async def test_refused_writes_make_flush_fail() -> None:
    store = _FlakyStore(failures=100, error=StoreError)
    [(rid, aid)] = await _start(store)
    with rollout_context(store, rid, aid):
        get_tracer().start_span("refused").end()
    with pytest.raises(SpanWriteError, match="store unavailable"):
        await aflush(10, attempt_id=aid)
    assert store.calls == 1  # a refusal by the store is not retried
    await aflush(10, attempt_id=aid)  # the error was reported once; the next flush is clean


async def test_a_failed_write_is_reported_to_its_own_attempt_only() -> None:
    bad = _FlakyStore(failures=100, error=StoreError)
    good = MemoryStore()
    [(bad_rid, bad_aid)] = await _start(bad)
    [(rid, aid)] = await _start(good)
    with rollout_context(bad, bad_rid, bad_aid):
        get_tracer().start_span("lost").end()
    await asyncio.sleep(0.2)  # the bad batch fails on its own (time-triggered), before the next flush
    with rollout_context(good, rid, aid):
        get_tracer().start_span("kept").end()
        await aflush(10)  # inside the good rollout: only its own spans' fate counts
    with pytest.raises(SpanWriteError):
        await aflush(10, attempt_id=bad_aid)


async def test_attach_to_another_sdk_provider() -> None:
    store = MemoryStore()
    [(rid, aid)] = await _start(store)
    other = TracerProvider()
    attach_to(other)
    attach_to(other)  # idempotent: spans are not written twice
    with rollout_context(store, rid, aid):
        other.get_tracer("library").start_span("from-library").end()
    await aflush(10)
    assert [s.name for s in await store.query_spans(rid)] == ["from-library"]


def test_rollout_context_rejects_empty_ids() -> None:
    with pytest.raises(ValueError, match="rollout_id"), rollout_context(MemoryStore(), "", "a"):
        pass


def test_set_as_global_routes_the_global_tracer_into_rollouts() -> None:
    """In a fresh interpreter (the global provider can be set once per process)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import asyncio
        from opentelemetry import trace
        from agentlightning.store import MemoryStore
        from agentlightning.tracing import flush, get_tracer_provider, rollout_context, set_as_global

        assert set_as_global() is get_tracer_provider()
        store = MemoryStore()
        async def claim():
            await store.enqueue_rollout({})
            return await store.dequeue_rollout("w")
        c = asyncio.run(claim())
        with rollout_context(store, c.rollout.rollout_id, c.attempt.attempt_id):
            trace.get_tracer("some.library").start_span("library-span").end()
        flush(10)
        print([s.name for s in asyncio.run(store.query_spans(c.rollout.rollout_id))])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "['library-span']"


@pytest.mark.parametrize("app_provider", ["none", "after"])
def test_a_waiting_instrumentor_gets_the_global_provider_at_the_first_rollout(app_provider: str) -> None:
    """`when_global_provider` sets nothing; entering the first rollout routes the global provider (ours if the app
    set none, else the app's, which stays global and keeps its own exporter) and runs the waiting callback once."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import asyncio, sys
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from agentlightning.store import MemoryStore
        from agentlightning.tracing import flush, get_tracer_provider, rollout_context, when_global_provider

        seen = []
        when_global_provider(seen.append)
        assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider" and not seen
        exporter = InMemorySpanExporter()
        app = TracerProvider()
        app.add_span_processor(SimpleSpanProcessor(exporter))
        if sys.argv[1] == "after":
            trace.set_tracer_provider(app)
        store = MemoryStore()
        async def claim():
            await store.enqueue_rollout({})
            return await store.dequeue_rollout("w")
        c = asyncio.run(claim())
        for _ in range(2):
            with rollout_context(store, c.rollout.rollout_id, c.attempt.attempt_id):
                trace.get_tracer("autogen-core").start_span("framework-span").end()
        flush(10)
        expected = app if sys.argv[1] == "after" else get_tracer_provider()
        assert seen == [expected] and trace.get_tracer_provider() is expected
        stored = asyncio.run(store.query_spans(c.rollout.rollout_id))
        print([s.name for s in stored], len(exporter.get_finished_spans()))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, app_provider], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    exported = 2 if app_provider == "after" else 0
    assert out.stdout.strip() == f"['framework-span', 'framework-span'] {exported}"
