"""Running one claimed attempt: the agent under a root span, its reward, its spans, its end in the store."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry.trace import Span as OtelSpan
from opentelemetry.trace import Status, StatusCode

from agentlightning import semconv
from agentlightning._models import AttemptStatus, Claim, Resources, Rollout
from agentlightning.adapters import use_active_sources
from agentlightning.runner._agent import RolloutAgent, reward_from_result
from agentlightning.runner._heartbeats import batcher_for, next_tick
from agentlightning.store import LightningStore, StoreError
from agentlightning.tracing import aflush, emit_reward, flush, rollout_context
from agentlightning.tracing._provider import light_tracer

__all__ = [
    "ROOT_SPAN_NAME",
    "Outcome",
    "agent_failures",
    "describe_exception",
    "execute_async",
    "execute_sync",
    "heartbeat_loop",
    "release",
]

logger = logging.getLogger(__name__)

ROOT_SPAN_NAME = "agentlightning.rollout"

T = TypeVar("T")


@dataclass
class Outcome:
    """How an attempt ended, as reported to the store."""

    status: AttemptStatus = "succeeded"
    error: str | None = None
    reward: float | None = None
    abandoned: bool = False
    """The agent's thread ran past the timeout and was left running (a worker process then asks to be replaced)."""


async def heartbeat_loop(
    store: LightningStore,
    rollout_id: str,
    attempt_id: str,
    interval: float,
    on_beat: Callable[[], Awaitable[None]] | None = None,
    on_gone: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Beat every ``interval`` seconds until cancelled or the store says the attempt is over.

    After the first, beats fall on the multiples of ``interval`` of the loop's clock and go through `batcher_for`:
    the attempts of one process share one ``heartbeat_many`` request per beat.

    ``on_beat`` runs after each beat (the runner registers the attempt's slot on the LLM proxy again); ``on_gone``
    once the store says the attempt is over while its agent still runs (cancelled by the trainer, timed out): the
    runner tells the LLM proxy, which then refuses the agent's further calls.
    """
    loop = asyncio.get_running_loop()
    delay = interval  # the first beat one interval after the start, as ever; then never later than one interval
    while True:
        await asyncio.sleep(delay)
        # later beats on the loop's common ticks: every attempt of this process beats at once, in one store request
        delay = next_tick(loop, interval)
        if on_beat is not None:
            try:
                await on_beat()
            except Exception as exc:
                logger.warning("attempt %s: refreshing its LLM proxy slot failed: %r", attempt_id, exc)
        try:
            await batcher_for(store).beat(rollout_id, attempt_id)
        except StoreError as exc:
            logger.warning("attempt %s of rollout %s no longer runs in the store (%s)", attempt_id, rollout_id, exc)
            if on_gone is not None:
                await _agent_ended(on_gone, attempt_id)
            return
        except Exception as exc:  # a transport hiccup must not kill the beat
            logger.warning("heartbeat for attempt %s failed: %r", attempt_id, exc)


def _root_attributes(claim: Claim, agent: RolloutAgent) -> dict[str, Any]:
    return {semconv.SPAN_KIND: semconv.KIND_ROLLOUT, semconv.GEN_AI_AGENT_NAME: agent.name}


_MAX_DESCRIPTION = 2000
"""Most characters of an exception's description in the runner's warning."""


def describe_exception(exc: BaseException) -> str:
    """``exc`` in one line: its type, its message, then its notes in brackets.

    Frameworks add notes to what they re-raise (LangGraph: ``During task with name 'assistant' and id ...``); the
    last line of Python's own formatting is then the note, not the error, so the type and message come first here.
    """
    kind = type(exc)
    name = (
        kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    )
    message = " ".join(str(exc).split())
    text = f"{name}: {message}" if message else name
    notes: list[object] = list(getattr(exc, "__notes__", None) or ())
    if notes:
        text += f" [{'; '.join(' '.join(str(note).split()) for note in notes)}]"
    return text if len(text) <= _MAX_DESCRIPTION else text[: _MAX_DESCRIPTION - 3] + "..."


class _FailureLog:
    """Rate-limited warnings for agents that raise: the first few at once, then one per interval with a count."""

    def __init__(self, first: int = 5, interval: float = 30.0) -> None:
        self.first = first
        self.interval = interval
        self.count = 0
        self._unreported = 0
        self._last = 0.0
        self._lock = threading.Lock()

    def report(self, rollout_id: str, exc: BaseException) -> None:
        """Count one failed agent run and warn with the exception (`describe_exception`) unless warned recently."""
        with self._lock:
            self.count += 1
            self._unreported += 1
            t = time.monotonic()
            if self.count > self.first and t - self._last < self.interval:
                return
            self._last = t
            unreported, self._unreported = self._unreported, 0
            count = self.count
        logger.warning(
            "the agent raised in rollout %s: %s (%d agent failure(s) in this process%s)",
            rollout_id,
            describe_exception(exc),
            count,
            f", {unreported - 1} not shown since the last warning" if unreported > 1 else "",
        )


agent_failures = _FailureLog()
"""Counts and logs agent exceptions of this process (``agent_failures.count``)."""


def _record_failure(root: OtelSpan, outcome: Outcome, exc: BaseException, rollout_id: str) -> None:
    outcome.status = "failed"
    # No store keeps NUL in an attempt's error (the boundary refuses it): an agent's message may hold one.
    outcome.error = f"{type(exc).__name__}: {exc}".replace("\x00", "\\x00")
    root.record_exception(exc)
    root.set_status(Status(StatusCode.ERROR, outcome.error))
    if not isinstance(exc, asyncio.CancelledError):
        agent_failures.report(rollout_id, exc)


def _accept_result(result: Any, outcome: Outcome) -> None:
    reward = reward_from_result(result)
    outcome.reward = reward
    if reward is not None:
        emit_reward(reward, final=True)


_RELEASE_FLUSH_TIMEOUT = 5.0
"""Most seconds a release waits for the attempt's spans to be stored (a store that does not answer: give up)."""


async def release(store: LightningStore, claim: Claim) -> Rollout | None:
    """Give a claim back to the store (the runner is going away); logs instead of raising.

    The attempt's spans ended so far (a cancelled agent's last ones) are written first: once released the attempt
    has ended, and the store refuses its records as late.
    """
    rollout_id, attempt_id = claim.rollout.rollout_id, claim.attempt.attempt_id
    try:
        await aflush(_RELEASE_FLUSH_TIMEOUT, attempt_id)
    except Exception as exc:  # the release matters more: another runner may take the rollout at once
        logger.debug("attempt %s: its spans could not be flushed before the release: %r", attempt_id, exc)
    try:
        rollout = await store.release_claim(rollout_id, attempt_id)
    except Exception as exc:  # the store's heartbeat timeout will requeue it instead
        logger.warning("could not release attempt %s of rollout %s: %r", attempt_id, rollout_id, exc)
        return None
    logger.info("released rollout %s (attempt %s) back to the queue", rollout_id, attempt_id)
    return rollout


async def _finish(store: LightningStore, claim: Claim, outcome: Outcome) -> Rollout | None:
    rollout_id, attempt_id = claim.rollout.rollout_id, claim.attempt.attempt_id
    try:
        return await store.finish_attempt(rollout_id, attempt_id, outcome.status, outcome.error)
    except StoreError as exc:  # e.g. the store already marked it unresponsive or timeout
        logger.warning(
            "could not finish attempt %s of rollout %s as %s: %s", attempt_id, rollout_id, outcome.status, exc
        )
        return None


async def execute_async(
    agent: RolloutAgent,
    claim: Claim,
    store: LightningStore,
    resources: Resources | None,
    *,
    timeout: float | None,
    heartbeat_interval: float,
    flush_timeout: float | None,
    llm_base_url: str | None = None,
    on_heartbeat: Callable[[], Awaitable[None]] | None = None,
    on_agent_end: Callable[[], Awaitable[None]] | None = None,
    watched: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]] | None = None,
) -> tuple[Outcome, Rollout | None]:
    """Run one attempt in the current event loop (which must own ``store``).

    ``watched`` wraps the agent's coroutine (a watched worker process marks whose steps run: `stepping`).

    ``llm_base_url`` is what `agentlightning.llm_base_url` returns to the agent (default: the per-rollout URL);
    ``on_heartbeat`` runs with each heartbeat; ``on_agent_end`` runs once the agent returned (or raised, or timed
    out), while its spans are flushed, and is over before the store hears of the attempt's end (the runner tells
    the LLM proxy to refuse the attempt's late calls); it runs earlier if the store ends the attempt first (a
    heartbeat finds it cancelled), and must then do nothing the second time.
    """
    rollout_id, attempt_id = claim.rollout.rollout_id, claim.attempt.attempt_id
    outcome = Outcome()
    use_active_sources()  # the app's own GenAI instrumentation, turned on since the last rollout, is read too
    gone = asyncio.Event()  # the store ended the attempt while its agent ran (cancelled by the trainer, timed out)

    async def on_gone() -> None:
        gone.set()
        if on_agent_end is not None:
            await on_agent_end()

    beat = asyncio.create_task(heartbeat_loop(store, rollout_id, attempt_id, heartbeat_interval, on_heartbeat, on_gone))
    try:
        with (
            rollout_context(
                store, rollout_id, attempt_id, resources, input=claim.rollout.input, llm_base_url=llm_base_url
            ),
            light_tracer().start_as_current_span(
                ROOT_SPAN_NAME,
                attributes=_root_attributes(claim, agent),
                record_exception=False,
                set_status_on_exception=False,
            ) as root,
        ):
            deadline = asyncio.timeout(timeout)
            try:
                async with deadline:
                    result = await _run_agent(agent, claim, resources, gone, watched)
                _accept_result(result, outcome)
            except TimeoutError as exc:
                if deadline.expired():
                    outcome.status = "timeout"
                    outcome.error = f"the agent ran past the rollout timeout of {timeout}s"
                    root.set_status(Status(StatusCode.ERROR, outcome.error))
                else:
                    _record_failure(root, outcome, exc, rollout_id)
            except Exception as exc:
                _record_failure(root, outcome, exc, rollout_id)
            except asyncio.CancelledError as exc:
                _record_failure(root, outcome, exc, rollout_id)
                outcome.error = "the runner was cancelled while the agent ran; the rollout was released"
                raise
        await _flush_attempt(outcome, flush_timeout, attempt_id, on_agent_end)
    except asyncio.CancelledError:
        # The agent did not fail, its runner went away (shutdown, drain): hand the rollout to another runner now.
        await asyncio.shield(release(store, claim))
        raise
    finally:
        beat.cancel()
    return outcome, await _finish(store, claim, outcome)


async def _run_agent(
    agent: RolloutAgent,
    claim: Claim,
    resources: Resources | None,
    gone: asyncio.Event,
    watched: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]] | None,
) -> Any:
    """The agent's result, awaited as its kind needs: a command agent until the store ends its attempt (its process
    ends with it), a coroutine step by step where the worker is watched."""
    result = agent.invoke(claim.rollout.input, resources)
    if inspect.isawaitable(result) and getattr(agent.fn, "stop_when_attempt_ends", False):
        return await _unless_gone(result, gone)
    if watched is not None and inspect.iscoroutine(result):
        return await watched(result)
    if inspect.isawaitable(result):
        return await result
    return result


async def _flush_attempt(
    outcome: Outcome, flush_timeout: float | None, attempt_id: str, on_agent_end: Callable[[], Awaitable[None]] | None
) -> None:
    """The attempt's spans stored (a failure to store them fails a succeeded attempt), ``on_agent_end`` overlapping."""
    ending = None if on_agent_end is None else asyncio.ensure_future(_agent_ended(on_agent_end, attempt_id))
    await _drain_adapters()
    try:
        await aflush(flush_timeout, attempt_id)
    except Exception as exc:
        if outcome.status == "succeeded":
            outcome.status, outcome.error = "failed", f"the attempt's spans could not be stored: {exc!r}"
    if ending is not None:
        await ending


async def _unless_gone(awaitable: Awaitable[T], gone: asyncio.Event) -> T:
    """Await an agent that can be stopped (a `CommandAgent`: its process group ends) until the store ends its attempt.

    Raises:
        RuntimeError: The store ended the attempt first (the agent was cancelled).
    """
    task = asyncio.ensure_future(awaitable)  # the same context: the rollout and its root span
    waiter = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise RuntimeError("the attempt ended in the store while its agent ran (cancelled or timed out); agent stopped")


async def _agent_ended(on_agent_end: Callable[[], Awaitable[None]], attempt_id: str) -> None:
    """Run ``on_agent_end``; a failure is logged (the attempt's outcome does not depend on it)."""
    try:
        await on_agent_end()
    except Exception as exc:
        logger.warning("attempt %s: reporting its end to the LLM proxy failed: %r", attempt_id, exc)


def _stuck_after(body: Callable[[], None], timeout: float | None, rollout_id: str) -> threading.Thread | None:
    """Run ``body`` in this thread, or with a ``timeout`` in a helper thread; the helper when it still runs at the
    timeout (it is then abandoned: a sync function cannot be interrupted), else ``None``."""
    if timeout is None:
        body()
        return None
    helper = threading.Thread(
        target=contextvars.copy_context().run, args=(body,), name=f"agent-{rollout_id}", daemon=True
    )
    helper.start()
    helper.join(timeout)
    return helper if helper.is_alive() else None


def execute_sync(
    agent: RolloutAgent,
    claim: Claim,
    store: LightningStore,
    call: Callable[[Coroutine[Any, Any, Any]], Any],
    store_loop: asyncio.AbstractEventLoop,
    resources: Resources | None,
    *,
    timeout: float | None,
    heartbeat_interval: float,
    flush_timeout: float | None,
    llm_base_url: str | None = None,
    on_heartbeat: Callable[[], Awaitable[None]] | None = None,
    on_agent_end: Callable[[], Awaitable[None]] | None = None,
) -> tuple[Outcome, Rollout | None]:
    """Run one attempt in this thread; store calls go through ``call`` onto ``store_loop``.

    ``llm_base_url``, ``on_heartbeat`` and ``on_agent_end`` are as in `execute_async` (both run on ``store_loop``).

    With a ``timeout`` the agent runs in a helper thread; past the timeout the attempt is ended as ``timeout``
    and the helper thread is abandoned (a sync function cannot be interrupted).
    """
    rollout_id, attempt_id = claim.rollout.rollout_id, claim.attempt.attempt_id
    outcome = Outcome()
    use_active_sources()  # the app's own GenAI instrumentation, turned on since the last rollout, is read too

    def body() -> None:
        with (
            rollout_context(
                store,
                rollout_id,
                attempt_id,
                resources,
                input=claim.rollout.input,
                store_loop=store_loop,
                llm_base_url=llm_base_url,
            ),
            light_tracer().start_as_current_span(
                ROOT_SPAN_NAME,
                attributes=_root_attributes(claim, agent),
                record_exception=False,
                set_status_on_exception=False,
            ) as root,
        ):
            try:
                result = agent.invoke(claim.rollout.input, resources)
                if inspect.isawaitable(result):  # a sync callable that returned a coroutine
                    result = asyncio.run(_await(result))
                _accept_result(result, outcome)
            except Exception as exc:
                _record_failure(root, outcome, exc, rollout_id)

    beat: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(
        heartbeat_loop(store, rollout_id, attempt_id, heartbeat_interval, on_heartbeat, on_agent_end), store_loop
    )
    try:
        stuck = _stuck_after(body, timeout, rollout_id)
        if stuck is not None:
            where = thread_frame(stuck)
            outcome = Outcome("timeout", f"the agent blocked its worker for {timeout:g} s in {where}", None, True)
            logger.warning(
                "rollout %s: agent still running after %ss in %s; attempt abandoned", rollout_id, timeout, where
            )
        ending = None
        if on_agent_end is not None and store_loop.is_running():  # overlaps the flush (a stopped loop: shutting down)
            ending = asyncio.run_coroutine_threadsafe(_agent_ended(on_agent_end, attempt_id), store_loop)
        _drain_adapters_sync()
        try:
            flush(flush_timeout, attempt_id)
        except Exception as exc:
            if outcome.status == "succeeded":
                outcome.status, outcome.error = "failed", f"the attempt's spans could not be stored: {exc!r}"
        if ending is not None:
            ending.result()
    finally:
        beat.cancel()
    return outcome, call(_finish(store, claim, outcome))


def thread_frame(thread: threading.Thread) -> str:
    """The innermost frame ``thread`` runs now, as ``function (file:line)`` (where an abandoned agent was)."""
    frame = sys._current_frames().get(thread.ident or -1)  # pyright: ignore[reportPrivateUsage]
    if frame is None:
        return "an unknown frame"
    return f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})"


async def _await(awaitable: Any) -> Any:
    return await awaitable


_DRAIN_TIMEOUT = 2.0
"""Most seconds to wait for adapters whose framework reports calls after they return (e.g. LiteLLM)."""


async def _drain_adapters() -> None:
    """Let late-reporting adapters record the attempt's last calls before its spans are flushed."""
    from agentlightning.adapters import Adapter

    for adapter in Adapter.instances():
        if adapter.pending() > 0 and not await adapter.adrain(_DRAIN_TIMEOUT):
            logger.warning(
                "adapter %s still had %d unreported calls after %.0fs", adapter.NAME, adapter.pending(), _DRAIN_TIMEOUT
            )


def _drain_adapters_sync() -> None:
    """`_drain_adapters` for worker threads and processes (no event loop of their own)."""
    import time

    from agentlightning.adapters import Adapter

    for adapter in Adapter.instances():
        deadline = time.monotonic() + _DRAIN_TIMEOUT
        while adapter.pending() > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
