"""Watched worker processes: the async workers' host process, and the runner's look at each worker process.

With a rollout timeout, a runner whose agent is async runs its async workers in one host process (`host_main`),
watched by the runner's own process (`look_at`, see `_watchdog`), so that an agent that blocks the event loop is
killed with its process and the run goes on in a new one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from agentlightning.runner._watchdog import (
    WorkerWatch,
    beat_for,
    blocked_frame,
    dump_frames_on_signal,
    end_attempts_of,
)
from agentlightning.runner._workers import HOSTED_BY, WorkerSettings, worker_prefix
from agentlightning.runner._workers import _end_with_parent as end_with_parent  # pyright: ignore[reportPrivateUsage]
from agentlightning.runner._workers import _ProcessBudget as ProcessBudget  # pyright: ignore[reportPrivateUsage]
from agentlightning.runner._workers import _resolve_agent as resolve_agent  # pyright: ignore[reportPrivateUsage]
from agentlightning.store import LightningStore
from agentlightning.tracing import export_to_otlp

__all__ = ["host_main", "instrument", "instrumented_adapters", "look_at"]

logger = logging.getLogger("agentlightning.runner._runner")  # the runner's logger


def host_main(
    agent_ref: Any,
    store_type: type[Any],
    store_kwargs: dict[str, Any],
    settings: WorkerSettings,
    n_workers: int,
    stop_event: Any,
    budget_value: Any,
    limited: bool,
    progress: Any,
    dump_path: str,
    adapters: tuple[str, ...] = (),
) -> None:
    """Entry point of the async workers' host process: reopen the store, run ``n_workers`` async workers, close.

    ``adapters``: the adapters instrumented in the runner's process, instrumented here too.
    """
    from agentlightning.runner._runner import Runner

    stopping: list[Any] = []  # a SIGTERM before the runner exists: it drains at once when it does
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    logging.basicConfig(level=logging.WARNING)
    if settings.otlp_endpoint is not None:
        export_to_otlp(settings.otlp_endpoint)
    dump_frames_on_signal(dump_path)
    HOSTED_BY[:] = [os.getppid()]  # this process's worker ids name the runner's process (`worker_id_of`)
    agent = resolve_agent(agent_ref)
    instrument(adapters)
    store: LightningStore = store_type(**store_kwargs)
    runner = Runner(
        agent,
        store,
        n_workers=n_workers,
        worker_mode="async",
        heartbeat_interval=settings.heartbeat_interval,
        poll_interval=settings.poll_interval,
        rollout_timeout=settings.rollout_timeout,
        stop_when_idle=settings.stop_when_idle,
        flush_timeout=settings.flush_timeout,
        otlp_endpoint=settings.otlp_endpoint,
        watchdog=False,
    )
    # The runner asks it to stop through ``progress`` (ticked from its loop), never ``stop_event``: see new_progress.
    runner.watched = (ProcessBudget(budget_value, limited), progress)
    # The runner's drain (SIGTERM, its grace over) releases the claims at once; its stop ends the host after them.
    signal.signal(signal.SIGTERM, lambda signum, frame: runner.drain(0.0))
    if stopping:
        runner.drain(0.0)
    end_with_parent()  # a runner killed outright: SIGTERM, as above

    async def main() -> None:
        try:
            await runner.arun()
        finally:
            await store.close()

    asyncio.run(main())
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)  # a thread an agent left behind must not hold the exit


def instrumented_adapters() -> tuple[str, ...]:
    """The names of the adapters instrumented in this process (a worker process instruments the same)."""
    from agentlightning.adapters import Adapter

    return tuple(adapter.NAME for adapter in Adapter.instances() if adapter.instrumented)


def instrument(names: tuple[str, ...]) -> None:
    """Instrument the adapters named ``names`` in this (worker) process."""
    from agentlightning.adapters import get_adapter

    for name in names:
        get_adapter(name).instrument()


def look_at(
    process: Any,
    index: int,
    watch: WorkerWatch,
    settings: WorkerSettings,
    call: Callable[[Coroutine[Any, Any, Any]], Any],
    store: LightningStore,
    dump_path: str,
    hosted: bool,
) -> bool:
    """One look at a live worker process: beat for it while it is stuck, kill it once it was stuck for the rollout
    timeout (its blocked attempt then ends as ``timeout``, its others go back to the queue). Returns whether it was
    killed (the caller starts a new one)."""
    timeout = settings.rollout_timeout
    stuck = watch.stuck_for()
    if timeout is None or stuck < settings.heartbeat_interval:
        watch.last_beat = 0.0
        return False
    if stuck < timeout:
        # It cannot beat for its attempts: beat for them here, so the store does not take them for dead first.
        if stuck - watch.last_beat >= settings.heartbeat_interval:
            watch.last_beat = stuck
            call(beat_for(store, worker_prefix(process.pid, os.getpid() if hosted else None)))
        return False
    slot = watch.stepping_slot() if hosted else index
    frame = blocked_frame(process.pid, dump_path)
    process.kill()
    process.join()
    reason = f"the agent blocked its worker for {stuck:.0f} s in {frame}"
    prefix = worker_prefix(process.pid, os.getpid() if hosted else None)
    blocked = None if slot is None else f"{prefix}{slot}"
    timed_out, released = call(end_attempts_of(store, prefix, blocked, reason))
    logger.warning(
        "worker process %s (pid %s) was stuck for %.0f s in %s: killed; %s; a new worker process takes its place",
        process.name,
        process.pid,
        stuck,
        frame,
        ", ".join(
            [f"rollout {r} timed out" for r in timed_out] + [f"rollout {r} released to the queue" for r in released]
        )
        or "no attempt of it was running",
    )
    watch.last_beat = 0.0
    return True
