"""Writing one batch of spans to a store: retried while the store is unreachable, split per attempt after a late span.

The span writer of `LightningSpanProcessor` (``_processor.py``) hands each batch to `write_batch` on the loop that owns
the batch's store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from agentlightning._models import Span
from agentlightning.store import AttemptEndedError, LightningStore, StoreError, StoreUnavailableError

__all__ = ["PartlyWritten", "SpanWriteError", "write_batch"]

logger = logging.getLogger("agentlightning.tracing._processor")  # the span writer's logger, as before the split


class SpanWriteError(RuntimeError):
    """Spans could not be written to their store (raised by ``flush``)."""


async def write_batch(
    store: LightningStore, spans: Sequence[Span], tries: int, retry_for: float, on_retry: Callable[[], None]
) -> int:
    """Write one batch: while the store is unreachable, keep the spans and retry for ``retry_for`` seconds."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + retry_for
    delay = 0.05
    attempt = 0
    warned = False
    while True:
        attempt += 1
        try:
            written = await store.add_spans(spans)
        except StoreUnavailableError as exc:  # the store is down or restarting: wait for it
            left = give_up - loop.time()
            if left <= 0:
                raise
            if not warned:
                warned = True
                logger.warning(
                    "store unavailable; keeping %d span(s) in memory and retrying for up to %.0f s more: %s",
                    len(spans),
                    left,
                    exc,
                )
            on_retry()
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)
            continue
        except AttemptEndedError:
            if len({span.attempt_id for span in spans}) < 2:
                raise
            # one attempt of the batch ended (a late span): the other attempts' spans must not be lost with it
            return await _write_per_attempt(store, spans, tries, retry_for, on_retry)
        except StoreError:
            raise  # the store refused the batch: trying again cannot help
        except Exception as exc:
            if attempt >= tries:
                raise
            logger.warning("add_spans failed (try %d of %d): %r; retrying in %.2fs", attempt, tries, exc, delay)
            await asyncio.sleep(delay)
            delay *= 4
            continue
        if warned:
            logger.warning("store reachable again: wrote %d buffered span(s)", len(spans))
        return written


class PartlyWritten(SpanWriteError):
    """A batch written per attempt after a late span: ``written`` spans stored, ``failures`` per attempt id."""

    def __init__(self, written: int, failures: dict[str, BaseException]) -> None:
        first = next(iter(failures.values()))
        super().__init__(f"spans of {len(failures)} attempt(s) could not be written: {first!r}")
        self.written = written
        self.failures = failures


async def _write_per_attempt(
    store: LightningStore, spans: Sequence[Span], tries: int, retry_for: float, on_retry: Callable[[], None]
) -> int:
    """Write a refused batch again, one request per attempt; raises `PartlyWritten` naming the attempts that failed."""
    groups: dict[str, list[Span]] = {}
    for span in spans:
        groups.setdefault(span.attempt_id, []).append(span)
    written = 0
    failures: dict[str, BaseException] = {}
    for attempt_id, group in groups.items():
        try:
            written += await write_batch(store, group, tries, retry_for, on_retry)
        except Exception as exc:
            failures[attempt_id] = exc
    if failures:
        raise PartlyWritten(written, failures)
    return written
