"""Which rollout and attempt the running code belongs to, carried in a context variable.

A context variable follows the code that runs: each thread and each asyncio task sees its own value, so
concurrent rollouts in threads or tasks never see each other's ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from agentlightning._models import Resources
from agentlightning.store import LightningStore

__all__ = ["RolloutContext", "current_rollout", "rollout_context"]


@dataclass(frozen=True)
class RolloutContext:
    """The rollout and attempt the current code runs for, and where its spans go.

    Attributes:
        rollout_id: Rollout being run.
        attempt_id: Attempt being run.
        store: Store the attempt's spans are written to.
        resources: Resources the rollout runs with (``None`` if the store has none).
        input: The task input, as given to the agent.
        store_loop: Event loop that owns ``store``; span batches are written on it. ``None`` means the store may
            be used from any loop (the span writer then uses its own).
        llm_base_url: The LLM base URL the runner chose for this attempt (its worker slot's stable proxy URL);
            ``None``: `agentlightning.llm_base_url` builds the per-rollout URL from ``resources``.
    """

    rollout_id: str
    attempt_id: str
    store: LightningStore
    resources: Resources | None = None
    input: Any = None
    store_loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False, compare=False)
    llm_base_url: str | None = None
    _sequence: Iterator[int] = field(default_factory=itertools.count, repr=False, compare=False)

    def next_sequence_id(self) -> int:
        """Next per-attempt span sequence number (0, 1, 2, ...; thread-safe under the GIL)."""
        return next(self._sequence)


_CURRENT: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("agentlightning_rollout", default=None)


def current_rollout() -> RolloutContext | None:
    """The rollout the calling code runs in, or ``None`` outside any rollout."""
    return _CURRENT.get()


@contextlib.contextmanager
def rollout_context(
    store: LightningStore,
    rollout_id: str,
    attempt_id: str,
    resources: Resources | None = None,
    *,
    input: Any = None,
    store_loop: asyncio.AbstractEventLoop | None = None,
    llm_base_url: str | None = None,
) -> Generator[RolloutContext]:
    """Run the ``with`` body as part of one attempt: spans it starts are tagged and sent to ``store``.

    Entering it routes the global OpenTelemetry provider into rollouts when an instrumentor waits for that
    (`agentlightning.tracing.when_global_provider`); otherwise the global provider is left alone.

    Works in sync code and inside async functions (``with``, not ``async with``). When it is entered while an
    event loop runs in this thread and ``store_loop`` is not given, that loop is taken as the store's owner,
    so a loop-bound store (an HTTP client) is only ever used from its own loop.

    Args:
        store: Where the attempt's spans go.
        rollout_id: Rollout id.
        attempt_id: Attempt id.
        resources: Resources of the rollout (used by ``llm_base_url()``).
        input: The task input.
        store_loop: Loop that owns ``store``; defaults to the running loop, if any.
        llm_base_url: What `agentlightning.llm_base_url` returns in the body (default: the per-rollout URL).

    Yields:
        The new `RolloutContext`.
    """
    if not rollout_id or not attempt_id:
        raise ValueError(f"rollout_context needs a rollout_id and an attempt_id, got {rollout_id!r}, {attempt_id!r}")
    # What runs rollouts owns the process: a framework that reports only to the global OpenTelemetry provider
    # (AutoGen) is routed into rollouts here, so its one instrument() line is enough (imported late: a cycle).
    from agentlightning.tracing._provider import route_global_provider

    route_global_provider()
    if store_loop is None:
        try:
            store_loop = asyncio.get_running_loop()
        except RuntimeError:
            store_loop = None
    ctx = RolloutContext(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        store=store,
        resources=resources,
        input=input,
        store_loop=store_loop,
        llm_base_url=llm_base_url,
    )
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
