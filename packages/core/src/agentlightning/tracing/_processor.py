"""The span processor: tags spans with the current rollout and writes them to its store in batches.

Hot path (``on_start``/``on_end``, in the thread that runs the agent) does as little as it can: a context
variable read, two attributes, a dict entry and a deque append. The writer thread is woken only by the first
span of a batch (not by every span: waking a thread costs more than the span itself), converts finished spans
to `agentlightning.Span` records and writes them with one ``add_spans`` call per store per batch; a batch is
cut when it reaches ``max_batch_size`` spans or when its oldest span has waited ``max_delay`` seconds. A flush
sends what is pending itself, in the flushing thread (a runner flushes once per rollout: no writer wake for it).

Stores are async. A store bound to an event loop (an aiohttp client) must only be awaited on that loop, so
each rollout context remembers the loop that owns its store (``RolloutContext.store_loop``) and batches are
sent there with ``asyncio.run_coroutine_threadsafe``. Stores that do not care about loops (memory, SQLite)
are written on the processor's own loop thread when no owner loop is known or it no longer runs.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace import SpanProcessor

from agentlightning import semconv
from agentlightning._models import Span
from agentlightning.store import AttemptEndedError, LightningStore
from agentlightning.tracing import _genai
from agentlightning.tracing._context import _CURRENT, RolloutContext  # pyright: ignore[reportPrivateUsage]
from agentlightning.tracing._loop_thread import LoopThread
from agentlightning.tracing._records import FinishedSpan, to_span_model
from agentlightning.tracing._span_writes import PartlyWritten, SpanWriteError, write_batch

__all__ = ["LightningSpanProcessor", "SpanWriteError"]

logger = logging.getLogger(__name__)


@dataclass
class _Group:
    store: LightningStore
    loop: asyncio.AbstractEventLoop | None
    items: list[tuple[RolloutContext, int, FinishedSpan]] = field(default_factory=list)


_MAX_REMEMBERED_FAILURES = 10_000


def _error_of(future: concurrent.futures.Future[int]) -> BaseException | None:
    if future.cancelled():
        return SpanWriteError("writing spans was cancelled (the store's loop stopped?)")
    return future.exception()


class LightningSpanProcessor(SpanProcessor):
    """Tags spans with the current rollout/attempt and writes them, batched, to that rollout's store.

    Spans started outside any rollout (and not under a span of one) are dropped and counted in
    ``dropped_outside_rollout``.

    While the store is unreachable (`StoreUnavailableError`, e.g. a served store restarting) spans stay in memory
    and their batches are retried for ``retry_for`` seconds. At most ``max_buffered_spans`` spans wait at once;
    past that bound new spans are dropped with a warning, counted in ``spans_dropped_buffer_full``, and the flush
    of their attempt raises `SpanWriteError` (so the attempt is not reported as complete).

    Args:
        max_batch_size: Cut a batch at this many spans.
        max_delay: Cut a batch when its oldest span has waited this long (seconds).
        write_tries: Tries per batch when the store call fails with an unexpected (non-store) error.
        retry_for: Seconds a batch is retried while the store is unavailable (a minute by default).
        max_buffered_spans: Most spans kept in memory, waiting to be written.
    """

    def __init__(
        self,
        max_batch_size: int = 256,
        max_delay: float = 0.05,
        write_tries: int = 3,
        retry_for: float = 60.0,
        max_buffered_spans: int = 100_000,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not (max_delay >= 0 and math.isfinite(max_delay)):
            raise ValueError(f"max_delay must be a finite number >= 0, got {max_delay}")
        if not retry_for >= 0:
            raise ValueError(f"retry_for must be >= 0 seconds, got {retry_for}")
        if max_buffered_spans < 1:
            raise ValueError(f"max_buffered_spans must be >= 1, got {max_buffered_spans}")
        self.max_batch_size = max_batch_size
        self.max_delay = max_delay
        self.write_tries = write_tries
        self.retry_for = retry_for
        self.max_buffered_spans = max_buffered_spans
        self.spans_dropped_buffer_full = 0
        self.write_retries = 0  # batch writes retried because the store was unavailable
        self.dropped_outside_rollout = 0
        self.spans_written = 0
        self.spans_failed = 0
        self.batches_written = 0
        self._init_state()
        os.register_at_fork(after_in_child=self._init_state)

    def _init_state(self) -> None:
        # Also the fork handler: a forked child starts with no writer thread and nothing pending.
        self._active: dict[tuple[int, int], tuple[RolloutContext, int]] = {}
        # live span -> the agent it runs under (its own gen_ai.agent.name, else its parent's): what the openai
        # client instrumentation names in each call's agent header, so the proxy can route it to the agent's policy
        self._agents: dict[tuple[int, int], str] = {}
        self._pending: collections.deque[tuple[RolloutContext, int, FinishedSpan]] = collections.deque()
        self._sending = threading.Lock()  # taking pending spans and handing them to their stores: one thread at once
        self._wake = threading.Event()
        self._armed = False  # the writer was woken for the spans pending now (or is awake)
        self._stop = False
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._own_loop = LoopThread("agentlightning-span-writer")
        self._inflight: set[concurrent.futures.Future[int]] = set()
        self._inflight_lock = threading.Lock()
        self._failed: dict[str, BaseException] = {}  # attempt id -> first write error, until flushed
        self._inflight_spans = 0  # spans handed to a store call and not yet acknowledged or failed
        self._shutdown = False

    # ------------------------------------------------------------------ hot path
    def on_start(self, span: SdkSpan, parent_context: otel_context.Context | None = None) -> None:
        """Stamp the rollout and attempt ids and reserve the span's sequence number."""
        ctx = self.rollout_of(parent_context)
        if ctx is None:
            return
        attributes = span.attributes
        agent = attributes.get(semconv.GEN_AI_AGENT_NAME) if attributes else None
        self.stamp(ctx, span, span.get_span_context(), span.parent, agent)
        if _genai.by_scope:  # another instrumentation's spans are read
            _genai.mark_start(span)

    def rollout_of(self, parent_context: otel_context.Context | None) -> RolloutContext | None:
        """The rollout a span starting now belongs to: the current one, else its parent span's (``None``: none)."""
        ctx = _CURRENT.get()
        if ctx is None:
            # A span started where the context variable did not follow (e.g. a callback on a pool thread)
            # still belongs to the rollout of its parent span.
            parent = trace.get_current_span(parent_context).get_span_context()
            if not parent.is_valid:
                return None
            entry = self._active.get((parent.trace_id, parent.span_id))
            if entry is None:
                return None
            ctx = entry[0]
        return ctx

    def stamp(
        self,
        ctx: RolloutContext,
        span: trace.Span,
        sc: trace.SpanContext,
        parent_sc: trace.SpanContext | None,
        agent: Any,
    ) -> None:
        """Tag a starting span of ``ctx`` (an SDK span or a light one): its ids, its agent, its sequence number."""
        if not isinstance(agent, str) or not agent:
            agent = self._agents.get((parent_sc.trace_id, parent_sc.span_id)) if parent_sc is not None else None
        if agent:
            self._agents[(sc.trace_id, sc.span_id)] = agent
        span.set_attributes({semconv.ROLLOUT_ID: ctx.rollout_id, semconv.ATTEMPT_ID: ctx.attempt_id})
        self._active[(sc.trace_id, sc.span_id)] = (ctx, ctx.next_sequence_id())

    def on_end(self, span: FinishedSpan) -> None:
        """Queue the finished span for its store (waking the writer only for the first span of a batch)."""
        sc = span.context
        entry = self._active.pop((sc.trace_id, sc.span_id), None) if sc is not None else None
        if entry is not None:
            self._agents.pop((sc.trace_id, sc.span_id), None)  # pyright: ignore[reportOptionalMemberAccess]
        if _genai.by_scope and entry is not None:  # another instrumentation's spans are read
            _genai.mark_end(span)
        if entry is None:
            self.dropped_outside_rollout += 1
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("span %r ended outside any rollout; dropped", span.name)
            return
        pending = self._pending
        if len(pending) + self._inflight_spans >= self.max_buffered_spans:
            self._drop_buffer_full(entry[0], span)
            return
        pending.append((entry[0], entry[1], span))
        if not self._armed or len(pending) >= self.max_batch_size:
            self._armed = True
            if self._writer is None:
                self._ensure_writer()
            self._wake.set()

    def agent_of(self, span: trace.Span) -> str | None:
        """The agent a live span of a rollout runs under (its own ``gen_ai.agent.name`` or its nearest ancestor's)."""
        sc = span.get_span_context()
        return self._agents.get((sc.trace_id, sc.span_id)) if sc.is_valid else None

    def _count_retry(self) -> None:
        self.write_retries += 1

    def _drop_buffer_full(self, ctx: RolloutContext, span: FinishedSpan) -> None:
        self.spans_dropped_buffer_full += 1
        dropped = self.spans_dropped_buffer_full
        error = SpanWriteError(
            f"{self.max_buffered_spans} spans were already waiting for the store; span {span.name!r} was dropped"
        )
        with self._inflight_lock:
            if len(self._failed) < _MAX_REMEMBERED_FAILURES:
                self._failed.setdefault(ctx.attempt_id, error)
        if dropped == 1 or dropped % 1000 == 0:
            logger.warning(
                "span buffer full: %d spans are waiting for the store (max_buffered_spans); dropped %d span(s) so "
                "far, the latest of rollout %s. Their attempts will report a failed flush.",
                self.max_buffered_spans,
                dropped,
                ctx.rollout_id,
            )

    # ------------------------------------------------------------------ writer thread
    def _ensure_writer(self) -> None:
        with self._writer_lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._writer_main, name="agentlightning-span-batcher", daemon=True
                )
                self._writer.start()

    def _writer_main(self) -> None:
        wake, pending = self._wake, self._pending
        while True:
            wake.wait()
            wake.clear()
            # Spans arrived: full batches go at once, the rest when the oldest waited max_delay (or a flush sent them).
            deadline = time.monotonic() + self.max_delay
            while True:
                while len(pending) >= self.max_batch_size:
                    with self._sending:
                        self._send(self._take_batch())
                if not pending or self._stop:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wake.wait(left)
                wake.clear()
            # Disarm before draining: a span ended from now on wakes the writer again (at worst needlessly).
            self._armed = False
            with self._sending:
                while pending:
                    self._send(self._take_batch())
            if self._stop:
                return

    def _take_batch(self) -> dict[tuple[int, int], _Group]:
        """Pop up to ``max_batch_size`` pending spans, grouped by store (and the loop that owns it)."""
        pending = self._pending
        groups: dict[tuple[int, int], _Group] = {}
        for _ in range(min(len(pending), self.max_batch_size)):
            item = pending.popleft()
            ctx = item[0]
            key = (id(ctx.store), id(ctx.store_loop))
            group = groups.get(key)
            if group is None:
                group = groups[key] = _Group(ctx.store, ctx.store_loop)
            group.items.append(item)
        return groups

    def _send(self, groups: dict[tuple[int, int], _Group]) -> None:
        for group in groups.values():
            spans: list[Span] = []
            for ctx, seq, readable in group.items:
                try:
                    spans.append(to_span_model(ctx, seq, readable))
                except Exception:
                    self.spans_failed += 1
                    logger.exception(
                        "span %r of rollout %s could not be converted; dropped", readable.name, ctx.rollout_id
                    )
            if not spans:
                continue
            coro = write_batch(group.store, spans, self.write_tries, self.retry_for, self._count_retry)
            loop = group.loop
            if loop is not None and loop.is_running() and not loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(coro, loop)
            else:
                if loop is not None:
                    logger.debug("the store's event loop no longer runs; writing spans on the span writer's loop")
                future = self._own_loop.submit(coro)
            n = len(spans)
            attempts = frozenset(span.attempt_id for span in spans)
            with self._inflight_lock:
                self._inflight.add(future)
                self._inflight_spans += n
            future.add_done_callback(lambda f, n=n, a=attempts: self._on_written(f, n, a))

    def _on_written(self, future: concurrent.futures.Future[int], n: int, attempts: frozenset[str]) -> None:
        exc = _error_of(future)
        with self._inflight_lock:
            self._inflight.discard(future)
            self._inflight_spans -= n
            if exc is None:
                self.spans_written += n
                self.batches_written += 1
                return
            failures: dict[str, BaseException] = dict.fromkeys(attempts, exc)
            if isinstance(exc, PartlyWritten):  # only some attempts' spans failed (late ones, say)
                failures = exc.failures
                self.spans_written += exc.written
                n -= exc.written
            self.spans_failed += n
            if len(self._failed) < _MAX_REMEMBERED_FAILURES:
                for attempt_id, error in failures.items():
                    self._failed.setdefault(attempt_id, error)
        late = [error for error in failures.values() if isinstance(error, AttemptEndedError)]
        if len(late) == len(failures):  # agent code that outlived its attempt: its flush reports it, no alarm here
            logger.warning("dropped %d late span(s): %s", n, late[0])
        else:
            logger.error("could not write %d spans to the store: %r", n, exc)

    def _resolve_after_inflight(self, done: concurrent.futures.Future[list[BaseException]]) -> None:
        """Complete ``done`` with the errors of every batch in flight now, once they all finished."""
        with self._inflight_lock:
            waiting = list(self._inflight)
        if not waiting:
            done.set_result([])
            return
        remaining = [len(waiting)]
        lock = threading.Lock()

        def _one_done(_: concurrent.futures.Future[int]) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                errors = [_error_of(f) for f in waiting]
                done.set_result([e for e in errors if e is not None])

        for future in waiting:
            future.add_done_callback(_one_done)

    # ------------------------------------------------------------------ flushing
    def _request_flush(self) -> concurrent.futures.Future[list[BaseException]]:
        """Send what is pending now; done once every batch in flight is (under ``_sending``, a span ended before
        this call is either pending and sent here, or was handed to its store by the writer and is in flight)."""
        done: concurrent.futures.Future[list[BaseException]] = concurrent.futures.Future()
        with self._sending:
            while self._pending:
                self._send(self._take_batch())
        self._resolve_after_inflight(done)
        return done

    def _raise_for(self, errors: list[BaseException], attempt_id: str | None) -> None:
        if attempt_id is None:
            ctx = _CURRENT.get()
            attempt_id = ctx.attempt_id if ctx is not None else None
        if attempt_id is not None:
            with self._inflight_lock:
                failure = self._failed.pop(attempt_id, None)
            if failure is not None:
                raise SpanWriteError(f"spans of attempt {attempt_id} could not be written: {failure!r}") from failure
        elif errors:
            raise SpanWriteError(f"{len(errors)} span batch(es) could not be written: {errors[0]!r}") from errors[0]

    def flush(self, timeout: float | None = None, attempt_id: str | None = None) -> None:
        """Write every span ended so far and wait until the stores acknowledged them.

        Args:
            timeout: Seconds to wait at most (``None``: no limit).
            attempt_id: Report write failures of this attempt's spans (default: the current rollout's attempt;
                outside a rollout, failures of any batch this flush waited for).

        Raises:
            RuntimeError: When called from a running event loop (use `aflush`): the loop may own a store
                whose writes would wait for this very call.
            TimeoutError: When ``timeout`` seconds pass first.
            SpanWriteError: When spans could not be written.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("flush() was called inside a running event loop; use `await aflush()` there")
        self._raise_for(self._request_flush().result(timeout), attempt_id)

    async def aflush(self, timeout: float | None = None, attempt_id: str | None = None) -> None:
        """Async `flush`: safe inside the loop that owns a store."""
        await asyncio.sleep(0)  # one loop turn: rollouts ending together send their spans in one write, not one each
        async with asyncio.timeout(timeout):  # not wait_for: 3.11's may swallow a cancellation
            errors = await asyncio.wrap_future(self._request_flush())
        self._raise_for(errors, attempt_id)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """OpenTelemetry's flush hook: like `flush`, but returns ``False`` instead of raising."""
        try:
            self.flush(timeout_millis / 1000)
        except Exception as exc:
            logger.warning("force_flush failed: %r", exc)
            return False
        return True

    def shutdown(self) -> None:
        """Flush (5 s at most), then stop the writer thread."""
        if self._shutdown:
            return
        self._shutdown = True
        if self._writer is not None and self._writer.is_alive():
            self.force_flush(5000)
            self._stop = True
            self._wake.set()
            self._writer.join(5.0)
        self._own_loop.stop()

    def stats(self) -> dict[str, int]:
        """Counters: spans written, failed, dropped outside a rollout or with a full buffer, batches written, open."""
        return {
            "spans_written": self.spans_written,
            "spans_failed": self.spans_failed,
            "dropped_outside_rollout": self.dropped_outside_rollout,
            "spans_dropped_buffer_full": self.spans_dropped_buffer_full,
            "write_retries": self.write_retries,
            "batches_written": self.batches_written,
            "open_spans": len(self._active),
        }
