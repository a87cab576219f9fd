"""The runner's workers: the claim loop over the store, the claim budget, and the thread and process worker bodies.

`Runner` (``_runner.py``) starts them: async tasks and threads share one `WorkerLoop` on the store's event loop;
each worker process builds its own (`process_main`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.util
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypedDict

from agentlightning._models import Claim, Resources
from agentlightning.runner._agent import RolloutAgent, as_agent
from agentlightning.runner._execute import execute_sync, release
from agentlightning.runner._slots import SlotRegistrar, for_agents
from agentlightning.runner._watchdog import RECYCLE_EXIT_CODE, dump_frames_on_signal, tick_on
from agentlightning.store import LightningStore
from agentlightning.tracing import LoopThread, aflush, export_to_otlp, flush, flush_otlp

__all__ = [
    "CLAIM_GRACE",
    "ThreadBudget",
    "WorkerLoop",
    "WorkerSettings",
    "aflush_left",
    "agent_ref",
    "ended_cleanly",
    "flush_left",
    "idle_wait",
    "log_failure",
    "process_main",
    "release_active",
    "sync_worker",
    "worker_id_of",
    "worker_prefix",
]

logger = logging.getLogger("agentlightning.runner._runner")  # the runner's logger, as before the split


class _Budget(Protocol):
    def take(self) -> bool: ...
    def give_back(self) -> None: ...


class ThreadBudget:
    """How many more rollouts may be claimed (``None``: unlimited), shared by threads/tasks."""

    def __init__(self, limit: int | None) -> None:
        self._left = limit
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._left is None:
                return True
            if self._left <= 0:
                return False
            self._left -= 1
            return True

    def give_back(self) -> None:
        with self._lock:
            if self._left is not None:
                self._left += 1


class _ProcessBudget:
    """The same, shared by worker processes through a ``multiprocessing.Value``."""

    def __init__(self, value: Any, limited: bool) -> None:
        self._value = value
        self._limited = limited

    def take(self) -> bool:
        if not self._limited:
            return True
        with self._value.get_lock():
            if self._value.value <= 0:
                return False
            self._value.value -= 1
            return True

    def give_back(self) -> None:
        if self._limited:
            with self._value.get_lock():
                self._value.value += 1


@dataclass(frozen=True)
class WorkerSettings:
    heartbeat_interval: float
    poll_interval: float
    rollout_timeout: float | None
    stop_when_idle: bool
    flush_timeout: float | None
    otlp_endpoint: str | None = None

    def limits(self) -> ExecuteLimits:
        """The limits every rollout runs under (`execute_sync` / `execute_async` keywords)."""
        return {
            "timeout": self.rollout_timeout,
            "heartbeat_interval": self.heartbeat_interval,
            "flush_timeout": self.flush_timeout,
        }


class ExecuteLimits(TypedDict):
    timeout: float | None
    heartbeat_interval: float
    flush_timeout: float | None


HOSTED_BY: list[int] = []
"""In a runner's watched host process (`agentlightning.runner._host.host_main`): the runner's pid, which its worker
ids name, so a worker id always names the runner process (``agl train``'s counts, the Ray runners' places)."""


def worker_id_of(index: int) -> str:
    """``host:pid:index``; in a watched host process ``host:runner_pid:w<host_pid>.index`` (see `worker_prefix`)."""
    return f"{worker_prefix(os.getpid(), HOSTED_BY[0] if HOSTED_BY else None)}{index}"


def worker_prefix(pid: int | None, runner_pid: int | None = None) -> str:
    """The start of the worker ids of process ``pid``: ``host:pid:``, or with ``runner_pid`` (``pid`` is that
    runner's watched host process) ``host:runner_pid:w<pid>.``."""
    if runner_pid is None:
        return f"{socket.gethostname()}:{pid}:"
    return f"{socket.gethostname()}:{runner_pid}:w{pid}."


_MAX_BACKOFF = 5.0
"""Longest wait between tries while the store cannot be reached."""
CLAIM_GRACE = 2.0
"""Seconds a stopping runner still waits for a claim request in flight before it abandons it."""


class _Outage:
    """While the store cannot be reached (its trainer restarting, a network cut): back off, warn once, recover."""

    def __init__(self, poll_interval: float) -> None:
        self._poll = poll_interval
        self._failures = 0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> float:
        """Count one failed try; returns the seconds to wait before the next."""
        with self._lock:
            self._failures += 1
            failures = self._failures
        if failures == 1:
            logger.warning("cannot reach the store (%r); retrying until it is back", exc)
        else:
            logger.debug("store still unreachable after %d tries: %r", failures, exc)
        return min(self._poll * 2 ** min(failures, 10), _MAX_BACKOFF)

    def succeeded(self) -> None:
        """The store answered: reset the backoff."""
        if self._failures:
            with self._lock:
                failures, self._failures = self._failures, 0
            if failures:
                logger.warning("the store is reachable again (after %d failed tries)", failures)


class WorkerLoop:
    """The claim loop shared by every worker kind; ``call`` runs a store coroutine and returns its result."""

    def __init__(self, store: LightningStore, settings: WorkerSettings, budget: _Budget, stopped: Callable[[], bool]):
        self.store = store
        self.settings = settings
        self.budget = budget
        self.stopped = stopped
        self.outage = _Outage(settings.poll_interval)
        self.active: dict[str, Claim] = {}  # worker id -> the claim it runs (thread and process workers)
        self.slots = SlotRegistrar()  # each worker slot's stable LLM proxy URL
        self._resources: dict[str, tuple[Resources | None, Resources | None]] = {}

    async def claim(self, worker_id: str) -> Claim | Literal["idle", "stop", "wait"]:
        claims = await self.claim_many([worker_id])
        return claims[0] if isinstance(claims, list) else claims

    async def claim_many(self, worker_ids: list[str]) -> list[Claim] | Literal["idle", "stop", "wait"]:
        """Claim a rollout for each of ``worker_ids`` (idle workers) in one store request; at least one, or why not.

        The claims come in ``worker_ids`` order (fewer when the queue or the budget runs short).
        """
        granted = 0
        while granted < len(worker_ids) and self.budget.take():
            granted += 1
        if self.stopped() or not granted:
            self._give_back(granted)
            return "stop"
        try:
            if granted == 1:
                one = await self.store.dequeue_rollout(worker_ids[0])
                claims = [] if one is None else [one]
            else:  # one round trip for every idle worker
                claims = await self.store.dequeue_many(worker_ids[:granted])
        except BaseException:
            self._give_back(granted)
            raise
        self.outage.succeeded()
        self._give_back(granted - len(claims))
        if claims:
            return claims
        if self.settings.stop_when_idle:
            # Idle only when nothing is running anywhere: a running attempt may still be retried.
            counts = (await self.store.stats()).rollouts
            if counts.get("queuing", 0) + counts.get("running", 0) == 0:
                return "idle"
        return "wait"

    def _give_back(self, n: int) -> None:
        for _ in range(n):
            self.budget.give_back()

    async def resources(self, claim: Claim) -> tuple[Resources | None, Resources | None]:
        """The claim's resources: as published (for the runner) and as its agent gets them (`for_agents`)."""
        resources_id = claim.rollout.resources_id
        if resources_id is None:
            latest = await self.store.get_resources(None)
            return latest, for_agents(latest)
        if resources_id not in self._resources:
            published = await self.store.get_resources(resources_id)
            self._resources[resources_id] = (published, for_agents(published))
        return self._resources[resources_id]


def sync_worker(
    agent: RolloutAgent,
    loop: WorkerLoop,
    store_loop: asyncio.AbstractEventLoop,
    index: int,
    stop_event: Any,
    recycle: bool = False,
) -> bool:
    """A worker in a thread (or a worker process's main thread): store calls run on ``store_loop``.

    With ``recycle`` (a worker process's), it stops once it left an agent's thread running (abandoned past the
    rollout timeout) and returns ``True``: the process asks to be replaced. A thread worker goes on beside it.
    """

    call = call_on(store_loop)
    worker_id = worker_id_of(index)
    settings = loop.settings
    while not stop_event.is_set():
        try:
            claim = call(loop.claim(worker_id))
        except Exception as exc:
            stop_event.wait(loop.outage.failed(exc))
            continue
        if claim == "stop" or claim == "idle":
            return False
        if claim == "wait":
            stop_event.wait(settings.poll_interval)
            continue
        assert isinstance(claim, Claim)
        loop.active[worker_id] = claim
        clean = abandoned = False
        try:
            resources, agent_resources = call(loop.resources(claim))
            url = call(loop.slots.acquire(index, claim, resources))
            outcome, _ = execute_sync(
                agent,
                claim,
                loop.store,
                call,
                store_loop,
                agent_resources,
                **settings.limits(),
                llm_base_url=url,
                on_heartbeat=functools.partial(loop.slots.refresh, index) if url is not None else None,
                on_agent_end=functools.partial(loop.slots.end, index),
            )
            clean = ended_cleanly(claim, outcome.status)
            abandoned = outcome.abandoned
        except RunnerStopped:
            logger.info("worker %s: the runner stopped while it ran rollout %s", worker_id, claim.rollout.rollout_id)
            return False  # the drain released its claim already
        except Exception:
            log_failure(worker_id, claim)
        finally:
            loop.active.pop(worker_id, None)
            with contextlib.suppress(RunnerStopped):
                call(loop.slots.release(index, clean))
        if abandoned and recycle:  # its agent's thread still runs (and may hold the GIL): no more rollouts beside it
            logger.warning("worker %s: stops taking rollouts, an abandoned agent thread still runs in it", worker_id)
            return True
    return False


class RunnerStopped(RuntimeError):
    """The runner's store loop is gone: it drained and abandoned the worker thread that tried to use it."""


def call_on(store_loop: asyncio.AbstractEventLoop) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """A blocking ``call(coro)`` that runs ``coro`` on ``store_loop`` from another thread.

    Once the loop is closed (the runner stopped), the coroutine is closed unstarted and `RunnerStopped` raised, so an
    abandoned worker ends quietly instead of leaving a never-awaited coroutine and a thread traceback behind.
    """

    def call(coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            future = asyncio.run_coroutine_threadsafe(coro, store_loop)
        except RuntimeError as exc:
            coro.close()
            raise RunnerStopped(f"the runner's store loop has stopped ({exc})") from exc
        return future.result()

    return call


def ended_cleanly(claim: Claim, status: str) -> bool:
    """Log how the attempt ended; whether it succeeded (only then may its runner slot keep its key)."""
    logger.info("rollout %s attempt %s: %s", claim.rollout.rollout_id, claim.attempt.attempt_id, status)
    return status == "succeeded"


def log_failure(worker_id: str, claim: Claim) -> None:
    """Log the exception a worker caught while running ``claim`` (the worker goes on with the next claim)."""
    logger.exception("worker %s failed while running rollout %s", worker_id, claim.rollout.rollout_id)


def release_active(loop: WorkerLoop, call: Callable[[Coroutine[Any, Any, Any]], Any]) -> int:
    """Release every claim still held by a sync worker (they are being abandoned); returns how many."""
    claims = list(loop.active.values())
    for claim in claims:
        call(release(loop.store, claim))
    return len(claims)


def agent_ref(agent: RolloutAgent) -> tuple[str, str, str | None] | RolloutAgent:
    """How a worker process finds the agent: by module and name (with the module's file as a fallback)."""
    module_name = getattr(agent, "__module__", None)
    qualname = getattr(agent, "__qualname__", "")
    module = sys.modules.get(module_name or "")
    if (
        module_name is None
        or not qualname
        or "<" in qualname
        or module is None
        or not _found_as(module, qualname, agent)
    ):
        return agent  # pickled as is (a callable object such as a `CommandAgent`); fails clearly if it cannot be
    return module_name, qualname, getattr(module, "__file__", None)


def _found_as(module: Any, qualname: str, agent: Any) -> bool:
    """Whether ``module.<qualname>`` is ``agent`` (or what it wraps): a name a fresh process can import it by."""
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return False
    return found is agent or found is getattr(agent, "fn", None) or getattr(found, "fn", None) is agent


def _resolve_agent(ref: tuple[str, str, str | None] | RolloutAgent) -> RolloutAgent:
    if isinstance(ref, RolloutAgent):
        return ref
    module_name, qualname, path = ref
    module: Any
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        # Modules imported by path (pytest's importlib mode, scripts run from elsewhere) are not on sys.path
        # in a fresh process: load the same file under the same name.
        if path is None:
            raise
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return as_agent(obj)


def process_main(
    agent_ref: tuple[str, str, str | None] | RolloutAgent,
    store_type: type[Any],
    store_kwargs: dict[str, Any],
    settings: WorkerSettings,
    index: int,
    stop_event: Any,
    budget_value: Any,
    limited: bool,
    progress: Any = None,
    dump_path: str | None = None,
) -> None:
    """Entry point of a worker process: reopen the store, run one sync worker, close.

    With ``progress`` (a watched worker, see `_watchdog`) its store loop ticks it and ``SIGUSR2`` dumps its frames
    to ``dump_path``; a worker that had to abandon an agent's thread exits with `RECYCLE_EXIT_CODE` to be replaced.
    """
    logging.basicConfig(level=logging.WARNING)
    if settings.otlp_endpoint is not None:
        export_to_otlp(settings.otlp_endpoint)
    if dump_path is not None:
        dump_frames_on_signal(dump_path)
    agent = _resolve_agent(agent_ref)
    loop_thread = LoopThread("agentlightning-store")
    if progress is not None:
        tick_on(loop_thread.loop, progress)
    abandoned = False
    store: LightningStore = store_type(**store_kwargs)
    try:
        loop = WorkerLoop(store, settings, _ProcessBudget(budget_value, limited), stop_event.is_set)

        def on_terminate(signum: int, frame: Any) -> None:
            # The parent's drain ran out of grace (or someone sent SIGTERM): give the claim back, then go.
            released = release_active(loop, loop_thread.call)
            logger.info("worker process %d: SIGTERM, released %d claim(s)", os.getpid(), released)
            os._exit(0)

        signal.signal(signal.SIGTERM, on_terminate)
        _end_with_parent()
        abandoned = sync_worker(agent, loop, loop_thread.loop, index, stop_event, recycle=True)
        loop_thread.call(loop.slots.close())
        flush(settings.flush_timeout)
        if settings.otlp_endpoint is not None:
            flush_otlp()
    finally:
        loop_thread.call(store.close())
        loop_thread.stop()
    if abandoned:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(RECYCLE_EXIT_CODE)  # the abandoned thread must not hold the exit


def _end_with_parent() -> None:
    """In a worker process: take the SIGTERM path (release the claim, exit) when the runner process dies.

    A runner killed outright (``kill -9``, the OOM killer) cannot stop its workers; without this they would go on
    claiming rollouts for nobody. ``multiprocessing`` gives the child a descriptor that becomes ready when its
    parent ends.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    main = threading.main_thread().ident
    assert main is not None

    def watch() -> None:
        parent.join()  # returns when the parent process has ended
        logger.warning("worker process %d: its runner process is gone; stopping", os.getpid())
        signal.pthread_kill(main, signal.SIGTERM)  # to the main thread: it interrupts the agent's blocking call

    threading.Thread(target=watch, name="agentlightning-runner-watch", daemon=True).start()


_IDLE_POLL_CAP_S = 0.1
"""Longest wait between claims of an idle runner whose ``poll_interval`` is shorter (see `_idle_wait`)."""


def idle_wait(poll_interval: float, empty: int) -> float:
    """Seconds to wait before claiming again after ``empty`` empty answers in a row.

    ``poll_interval`` after a claim that found rollouts; then doubling with each empty answer, up to
    ``max(poll_interval, 0.1 s)``: a runner polling a local store every 20 ms (the quickstart's runners) spent ~2%
    of a core asking an empty queue while the trainer updated, evaluated or waited for its last rollouts; now it
    asks ten times a second at most once idle, and a new iteration's rollouts wait ~0.05 s longer on average.
    """
    if empty <= 0:
        return poll_interval
    return min(poll_interval * 2 ** min(empty, 10), max(poll_interval, _IDLE_POLL_CAP_S))


_STOP_FLUSH_S = 10.0
"""Seconds a stopping runner waits for its workers' last spans to be stored (a drained attempt's included)."""


def flush_left() -> None:
    """Store the spans a stopping runner's workers left (a drained attempt's too) while the store is still open."""
    try:
        flush(_STOP_FLUSH_S)
    except Exception as exc:  # the span writer logged each batch it could not write
        logger.debug("spans left unwritten as the runner stopped: %r", exc)


async def aflush_left() -> None:
    """`flush_left` from the event loop that owns the store."""
    try:
        await aflush(_STOP_FLUSH_S)
    except Exception as exc:
        logger.debug("spans left unwritten as the runner stopped: %r", exc)
