"""The runner: workers that take rollouts from the store, run the agent and report back."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import multiprocessing
import os
import pickle
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from agentlightning._gc import frozen_gc
from agentlightning._models import Claim
from agentlightning.runner._agent import as_agent
from agentlightning.runner._execute import execute_async, release
from agentlightning.runner._host import host_main, instrumented_adapters, look_at
from agentlightning.runner._watchdog import RECYCLE_EXIT_CODE, WorkerWatch, ask_to_stop, new_progress, stepping, tick_on
from agentlightning.runner._workers import (
    CLAIM_GRACE,
    ThreadBudget,
    WorkerLoop,
    WorkerSettings,
    aflush_left,
    agent_ref,
    call_on,
    ended_cleanly,
    flush_left,
    idle_wait,
    log_failure,
    process_main,
    release_active,
    sync_worker,
    worker_id_of,
    worker_prefix,
)
from agentlightning.store import LightningStore, StoreClient, StoreError
from agentlightning.tracing import LoopThread, export_to_otlp, flush_otlp, otlp_endpoint_from_env

__all__ = ["Runner", "WorkerMode"]

logger = logging.getLogger(__name__)

WorkerMode = Literal["auto", "process", "thread", "async"]


class Runner:
    """Runs an agent on the store's rollouts with one or many workers.

    Args:
        agent: The agent function (decorated with ``@agl.rollout`` or plain), ``fn(task)`` or
            ``fn(task, resources)``, sync or async.
        store: The store to take rollouts from.
        n_workers: Concurrent workers.
        worker_mode: ``async``: asyncio tasks in one loop (async agents); ``thread``: threads; ``process``:
            worker processes that reopen the store from ``store.reopen_spec()`` (sync agents, no GIL sharing);
            ``auto``: ``async`` for async agents, else ``process`` when the store can be reopened, the agent
            can be imported by a child process and ``n_workers > 1``, else ``thread``. A worker process that
            dies during an attempt (``os._exit``, a crash, the OOM killer) has that attempt failed at once (the
            retry policy then applies) and is replaced by a new process.
        heartbeat_interval: Seconds between heartbeats of a running attempt (keep well under the store's
            ``RetryPolicy.heartbeat_timeout``). Async agents beat from the runner's loop: an async agent that
            blocks the loop for longer than the timeout is taken for dead.
        poll_interval: Seconds to wait before asking again when the queue is empty (an interval under 0.1 s doubles
            with each empty answer in a row, up to 0.1 s, until rollouts come again).
        max_rollouts: Stop after claiming this many rollouts (``None``: no limit).
        rollout_timeout: Seconds an attempt may run before it is ended as ``timeout`` (``None``: no limit).
        stop_when_idle: Return once no rollout is queuing or running; otherwise wait for work until `stop`.
        flush_timeout: Seconds to wait for an attempt's spans to be stored before reporting its end (longer than
            the span writer's retry window, so a store restart does not fail the attempt).
        mp_start_method: ``multiprocessing`` start method for process workers (``spawn`` is safe with threads).
        otlp_endpoint: Also send every span to this OpenTelemetry collector over OTLP/HTTP (e.g.
            ``http://localhost:4318``), for Jaeger, Phoenix or Langfuse users; default: ``$AGL_OTLP_ENDPOINT``.
            Needs ``pip install "agentlightning-core[otlp]"``.
        watchdog: With a ``rollout_timeout``, watch the workers from a process no agent runs in (async workers
            then run in one host process; process workers are watched as they are): a worker process that has not
            progressed for the rollout timeout (an agent that blocks its event loop or holds the GIL, e.g. big-int
            arithmetic) is killed, its blocked attempt ends as ``timeout`` ("the agent blocked its worker for N s in
            <frame>"), its other attempts go back to the queue, and a new worker process takes its place; while it
            is stuck, this process heartbeats for its attempts. Needs a store with ``reopen_spec()`` and an agent a
            child process can import; otherwise async workers run in this process, unwatched.
    """

    def __init__(
        self,
        agent: Callable[..., Any],
        store: LightningStore,
        *,
        n_workers: int = 1,
        worker_mode: WorkerMode = "auto",
        heartbeat_interval: float = 5.0,
        poll_interval: float = 0.2,
        max_rollouts: int | None = None,
        rollout_timeout: float | None = None,
        stop_when_idle: bool = False,
        flush_timeout: float | None = 90.0,
        mp_start_method: str = "spawn",
        otlp_endpoint: str | None = None,
        watchdog: bool = True,
    ) -> None:
        self.agent = as_agent(agent)
        otlp_endpoint = otlp_endpoint or otlp_endpoint_from_env()
        if otlp_endpoint is not None:
            export_to_otlp(otlp_endpoint)  # fails now, with the install command, if the exporter is missing
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        if worker_mode not in ("auto", "process", "thread", "async"):
            raise ValueError(f"worker_mode must be auto, process, thread or async; got {worker_mode!r}")
        for name, value in (("heartbeat_interval", heartbeat_interval), ("poll_interval", poll_interval)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if rollout_timeout is not None and not rollout_timeout > 0:
            raise ValueError(f"rollout_timeout must be positive or None, got {rollout_timeout!r}")
        if max_rollouts is not None and max_rollouts < 0:
            raise ValueError(f"max_rollouts must be >= 0 or None, got {max_rollouts!r}")
        if worker_mode == "async" and not self.agent.is_async:
            raise ValueError(f"worker_mode='async' needs an async agent; {self.agent.name} is sync")
        self.store = store
        self.n_workers = n_workers
        self.max_rollouts = max_rollouts
        self.mp_start_method = mp_start_method
        self._settings = WorkerSettings(
            heartbeat_interval, poll_interval, rollout_timeout, stop_when_idle, flush_timeout, otlp_endpoint
        )
        self.worker_mode: Literal["process", "thread", "async"] = self._resolve_mode(worker_mode)
        self._stop = threading.Event()
        self._drain_deadline: float | None = None
        self._wake: Callable[[], None] | None = None  # wakes the async pool's loop (set while it runs)
        self.worker_pids: list[int | None] = []  # pids of worker processes (process mode), once started
        self.workers_replaced = 0  # worker processes that died in an attempt (or were stuck) and were replaced
        self.watched: tuple[Any, Any] | None = None  # in a host process: (the shared claim budget, its progress)
        self._watchdog = watchdog
        self.hosted = watchdog and self._can_host()
        """Whether the async workers run in a watched host process (`_host.host_main`)."""

    def _can_host(self) -> bool:
        if self.worker_mode != "async" or self._settings.rollout_timeout is None or self._reopen_spec() is None:
            return False
        try:
            pickle.dumps(agent_ref(self.agent))
        except Exception as exc:
            logger.info(
                "agent %s cannot be sent to a watched worker process (%s); running it unwatched", self.agent, exc
            )
            return False
        return True

    def _reopen_spec(self) -> tuple[type[Any], dict[str, Any]] | None:
        reopen = getattr(self.store, "reopen_spec", None)
        if reopen is None:
            return None
        try:
            return reopen()
        except (NotImplementedError, TypeError):  # e.g. MemoryStore: lives in one process only
            return None

    def _resolve_mode(self, mode: WorkerMode) -> Literal["process", "thread", "async"]:
        if mode != "auto":
            if mode == "process" and self._reopen_spec() is None:
                raise ValueError(f"worker_mode='process' needs a store with reopen_spec(); {type(self.store).__name__}")
            return mode
        if self.agent.is_async:
            return "async"
        if self.n_workers == 1:
            return "thread"
        if self._reopen_spec() is None:
            logger.info(
                "%s cannot be reopened in another process; running workers as threads", type(self.store).__name__
            )
            return "thread"
        try:
            pickle.dumps(self.agent)
        except Exception as exc:
            logger.info("agent %s cannot be sent to a worker process (%s); running workers as threads", self.agent, exc)
            return "thread"
        return "process"

    def stop(self) -> None:
        """Ask every worker to stop after its current rollout."""
        self._stop.set()
        if self._wake is not None:
            self._wake()

    def drain(self, grace: float = 0.0) -> None:
        """Stop claiming; give running rollouts ``grace`` seconds to finish, then release the rest to the store.

        A released rollout goes back to the queue at once (``release_claim``), so another runner takes it without
        waiting for a heartbeat timeout. Safe to call from a signal handler or another thread, and again with a
        shorter ``grace``. Async workers are cancelled; sync agents in threads cannot be interrupted and are
        abandoned (their claims released); worker processes are sent SIGTERM, release their claim and exit.
        """
        if not (math.isfinite(grace) and grace >= 0):
            raise ValueError(f"grace must be a non-negative number of seconds, got {grace!r}")
        deadline = time.monotonic() + grace
        if self._drain_deadline is None or deadline < self._drain_deadline:
            self._drain_deadline = deadline
        self.stop()

    def _drain_due(self) -> bool:
        deadline = self._drain_deadline
        return deadline is not None and time.monotonic() >= deadline

    # ------------------------------------------------------------------ sync entry point
    def run(self) -> None:
        """Run until `stop` is called (or, with ``stop_when_idle``, until no rollout is left)."""
        if self.hosted:
            self._run_processes()
        elif self.worker_mode == "async":
            asyncio.run(self.arun())
        elif self.worker_mode == "process":
            self._run_processes()
        else:
            store_loop = LoopThread("agentlightning-store")
            try:
                with frozen_gc():  # the agent's modules and clients out of full garbage collections
                    self._run_threads(store_loop.loop)
                flush_left()
            finally:
                store_loop.stop()
        if self._settings.otlp_endpoint is not None and self.worker_mode != "async":
            flush_otlp()

    async def arun(self) -> None:
        """Async `run`; the running loop must own the store (it is used from this loop only)."""
        if self.worker_mode == "async" and not self.hosted:
            budget = ThreadBudget(self.max_rollouts) if self.watched is None else self.watched[0]
            loop = WorkerLoop(self.store, self._settings, budget, self._stop.is_set)
            if self.watched is not None:
                tick_on(asyncio.get_running_loop(), self.watched[1], self.stop)
            with frozen_gc():  # the agent's modules and clients out of full garbage collections
                await self._async_pool(loop)
            await aflush_left()
        elif self.worker_mode == "process" or self.hosted:
            await asyncio.to_thread(self._run_processes)
        else:
            running = asyncio.get_running_loop()
            with frozen_gc():
                await asyncio.to_thread(self._run_threads, running)
            await aflush_left()
        if self._settings.otlp_endpoint is not None:
            await asyncio.to_thread(flush_otlp)  # the collector sees this run's last spans before we return

    # ------------------------------------------------------------------ worker kinds
    async def _async_pool(self, loop: WorkerLoop) -> None:
        """Run up to ``n_workers`` agents as tasks of this loop, fed by ONE claimer.

        One claimer instead of ``n_workers`` polling loops: with 128 idle workers each polling an empty queue,
        the store saw thousands of dequeue transactions a second, starving heartbeats and the trainer's writes.
        """
        settings = self._settings
        free_slots = list(range(self.n_workers - 1, -1, -1))
        slot_freed = asyncio.Event()
        running: set[asyncio.Task[None]] = set()
        event_loop = asyncio.get_running_loop()
        stopping = asyncio.Event()

        def wake() -> None:
            event_loop.call_soon_threadsafe(slot_freed.set)
            event_loop.call_soon_threadsafe(stopping.set)

        self._wake = wake
        try:
            await self._claim_loop(loop, settings, free_slots, slot_freed, running, stopping)
            await self._finish_running(running, slot_freed)
        finally:
            self._wake = None
            await loop.slots.close()

    async def _claim_loop(
        self,
        loop: WorkerLoop,
        settings: WorkerSettings,
        free_slots: list[int],
        slot_freed: asyncio.Event,
        running: set[asyncio.Task[None]],
        stopping: asyncio.Event,
    ) -> None:
        empty = 0  # empty answers in a row: an idle runner asks less often (`idle_wait`)
        while not self._stop.is_set():
            if not free_slots:
                slot_freed.clear()
                await slot_freed.wait()
                continue
            # Every idle slot claims in one request. Slots are taken before claiming: a rollout ending meanwhile
            # gives its slot back, and two rollouts must never share a slot (its worker id, its LLM proxy URL).
            indexes = free_slots[::-1]
            free_slots.clear()
            try:
                claims = await self._claim_unless_stopped(loop, [worker_id_of(i) for i in indexes], stopping)
            except Exception as exc:
                free_slots.extend(indexes[::-1])
                await self._async_sleep(loop.outage.failed(exc))
                continue
            if not isinstance(claims, list):
                free_slots.extend(indexes[::-1])
                if claims == "stop" or (claims == "idle" and not running):
                    break
                empty += 1
                await self._async_sleep(idle_wait(settings.poll_interval, empty))
                continue
            free_slots.extend(indexes[len(claims) :][::-1])
            for claim, index in zip(claims, indexes, strict=False):
                self._start_claim(loop, claim, index, free_slots, slot_freed, running)
            empty = 0 if claims else empty + 1
            if len(claims) < len(indexes):  # the queue ran short: poll again later, not at once
                await self._async_sleep(idle_wait(settings.poll_interval, empty))

    def _start_claim(
        self,
        loop: WorkerLoop,
        claim: Claim,
        index: int,
        free_slots: list[int],
        slot_freed: asyncio.Event,
        running: set[asyncio.Task[None]],
    ) -> None:
        """Run ``claim`` in slot ``index`` as a task of this loop; the slot is freed when it ends."""
        worker_id = worker_id_of(index)

        async def run_one() -> None:
            try:
                await self._run_claim(loop, claim, worker_id, index)
            finally:
                free_slots.append(index)
                slot_freed.set()

        task = asyncio.create_task(run_one(), name=f"agentlightning-{worker_id}")
        running.add(task)
        task.add_done_callback(running.discard)

    async def _claim_unless_stopped(
        self, loop: WorkerLoop, worker_ids: list[str], stopping: asyncio.Event
    ) -> list[Claim] | Literal["idle", "stop", "wait"]:
        """`WorkerLoop.claim_many`, abandoned when the runner stops while the store does not answer (it may be down)."""
        claiming = asyncio.ensure_future(loop.claim_many(worker_ids))
        stop = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({claiming, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not claiming.done():  # give an answer on its way a moment, then stop waiting for it
                await asyncio.wait({claiming}, timeout=CLAIM_GRACE)
        finally:
            stop.cancel()
        if not claiming.done():
            claiming.cancel()
            await asyncio.gather(claiming, return_exceptions=True)
            return "stop"
        claims = claiming.result()
        if isinstance(claims, list) and self._stop.is_set():
            for claim in claims:  # claimed as the runner stopped: hand them straight back
                await release(self.store, claim)
            return "stop"
        return claims

    async def _finish_running(self, running: set[asyncio.Task[None]], wakeup: asyncio.Event) -> None:
        """Let running rollouts finish; once a drain's grace is over, cancel them (which releases their claims)."""
        while running and not self._drain_due():
            deadline = self._drain_deadline
            wakeup.clear()
            waker = asyncio.ensure_future(wakeup.wait())
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait({*running, waker}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            waker.cancel()
        if running:  # what a drain is for: info, not a warning
            logger.info("draining: releasing %d running rollout(s) back to the store", len(running))
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _run_claim(self, loop: WorkerLoop, claim: Claim, worker_id: str, index: int) -> None:
        settings = self._settings
        clean = False
        try:
            try:
                resources, agent_resources = await loop.resources(claim)
                url = await loop.slots.acquire(index, claim, resources)
            except asyncio.CancelledError:  # drained before the agent started: the claim goes back all the same
                await asyncio.shield(release(self.store, claim))
                raise
            outcome, _ = await execute_async(
                self.agent,
                claim,
                self.store,
                agent_resources,
                **settings.limits(),
                llm_base_url=url,
                on_heartbeat=functools.partial(loop.slots.refresh, index) if url is not None else None,
                on_agent_end=functools.partial(loop.slots.end, index),
                watched=None
                if self.watched is None
                else functools.partial(stepping, progress=self.watched[1], slot=index),
            )
            clean = ended_cleanly(claim, outcome.status)
        except Exception:
            log_failure(worker_id, claim)
        finally:
            # shielded: a drained (cancelled) agent may still run; its slot must move on all the same
            await asyncio.shield(loop.slots.release(index, clean))

    async def _async_sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, seconds))

    def _run_threads(self, store_loop: asyncio.AbstractEventLoop) -> None:
        loop = WorkerLoop(self.store, self._settings, ThreadBudget(self.max_rollouts), self._stop.is_set)
        # Daemon threads: a drain may abandon a sync agent that cannot be interrupted.
        threads = [
            threading.Thread(
                target=sync_worker,
                args=(self.agent, loop, store_loop, i, self._stop),
                name=f"agl-worker-{i}",
                daemon=True,
            )
            for i in range(self.n_workers)
        ]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads) and not self._drain_due():
            for thread in threads:
                thread.join(0.05)

        call = call_on(store_loop)
        if any(thread.is_alive() for thread in threads):
            released = release_active(loop, call)
            logger.warning("draining: released %d rollout(s); their agents' threads are abandoned", released)
        call(loop.slots.close())

    def _run_processes(self) -> None:
        spec = self._reopen_spec()
        assert spec is not None
        store_type, store_kwargs = spec
        ctx: Any = multiprocessing.get_context(self.mp_start_method)
        stop_event = ctx.Event()
        budget = ctx.Value("q", self.max_rollouts if self.max_rollouts is not None else 0)
        watches: list[WorkerWatch | None] = []
        dumps = tempfile.TemporaryDirectory(prefix="agl-frames-")

        def start(index: int) -> Any:
            process, watch = self._start_worker(ctx, index, (store_type, store_kwargs), stop_event, budget, dumps.name)
            watches[index:] = [watch, *watches[index + 1 :]]  # set (a replacement) or append (a first start)
            return process

        processes = [start(i) for i in range(1 if self.hosted else self.n_workers)]
        self.worker_pids = [p.pid for p in processes]
        ended: list[Any] = []  # processes that exited (replaced ones included)
        store_loop = LoopThread("agentlightning-runner-watch")

        def replace(index: int) -> None:
            processes[index] = start(index)
            self.worker_pids[index] = processes[index].pid
            self.workers_replaced += 1

        try:
            while any(p.is_alive() for p in processes):
                if self._stop.is_set():
                    stop_event.set()
                    for watch in watches:
                        if watch is not None:
                            ask_to_stop(watch.progress)
                if self._drain_due():
                    for p in processes:
                        if p.is_alive():
                            p.terminate()  # the worker releases its claim and exits
                for index, p in enumerate(processes):
                    p.join(0.1)
                    watch = watches[index]
                    if p.exitcode is None:
                        dump = os.path.join(dumps.name, f"worker-{index}.txt")
                        if watch is not None and look_at(
                            p, index, watch, self._settings, store_loop.call, self.store, dump, self.hosted
                        ):
                            ended.append(p)
                            if not stop_event.is_set():
                                replace(index)
                        continue
                    if p.exitcode == RECYCLE_EXIT_CODE and not stop_event.is_set():
                        ended.append(p)  # it left an agent's thread running: a fresh process goes on instead
                        logger.info("worker process %s (pid %s) asked to be replaced", p.name, p.pid)
                        replace(index)
                        continue
                    if p.exitcode == 0 or stop_event.is_set():
                        continue
                    # A worker died (os._exit, a segfault, the OOM killer): end its attempt now rather than after
                    # the heartbeat timeout, and give the pool a new worker so the run goes on.
                    ended.append(p)
                    failed = store_loop.call(self._fail_attempts_of(p, index))
                    if failed:
                        replace(index)
                        _warn_replaced(p, failed, processes[index].pid)
        finally:
            stop_event.set()
            for p in processes:
                p.join()
            if ended and isinstance(self.store, StoreClient):
                store_loop.call(self.store.close())  # only this loop's connection pool
            store_loop.stop()
            dumps.cleanup()
        self._check_exits(processes, ended)

    def _check_exits(self, processes: list[Any], ended: list[Any]) -> None:
        """Log the worker processes that exited unasked (``ended``: already handled); raise when all of them did."""
        failed = [p for p in processes if p.exitcode not in (0, RECYCLE_EXIT_CODE)]
        for p in failed:
            # A stop signal to the runner's process group reaches its worker processes too, a starting one before
            # it can take it as a drain: asked for, no warning.
            asked = self._stop.is_set() and p.exitcode == -signal.SIGTERM
            if p not in ended:
                level = logging.INFO if asked else logging.WARNING
                logger.log(level, "worker process %s (pid %s) exited with code %s", p.name, p.pid, p.exitcode)
        if failed and len(failed) == len(processes) and not self._stop.is_set():
            codes = ", ".join(str(p.exitcode) for p in failed)
            raise RuntimeError(f"all {len(processes)} worker processes failed (exit codes {codes}); see their stderr")

    def _start_worker(
        self, ctx: Any, index: int, spec: tuple[type[Any], dict[str, Any]], stop_event: Any, budget: Any, dumps: str
    ) -> tuple[Any, WorkerWatch | None]:
        """Start worker process ``index`` (the async workers' host when `hosted`), watched with a rollout timeout."""
        watched = self._settings.rollout_timeout is not None and (self.hosted or self._watchdog)
        progress = new_progress(ctx) if watched else None
        common = (agent_ref(self.agent), *spec, self._settings)
        limit = (stop_event, budget, self.max_rollouts is not None)
        dump = os.path.join(dumps, f"worker-{index}.txt")
        if self.hosted:
            target, args = host_main, (*common, self.n_workers, *limit, progress, dump, instrumented_adapters())
        else:
            target, args = process_main, (*common, index, *limit, progress, dump)
        process = ctx.Process(target=target, args=args, name=f"agl-worker-{index}")
        process.start()
        return process, None if progress is None else WorkerWatch(progress)

    async def _fail_attempts_of(self, process: Any, index: int) -> list[str]:
        """Fail the running attempts of a dead worker process; returns their rollout ids."""
        prefix = worker_prefix(process.pid, os.getpid() if self.hosted else None)  # a host process runs every slot
        worker_id = f"{prefix}{index}"
        failed: list[str] = []
        try:
            for rollout in await self.store.query_rollouts(status=["running"]):
                for attempt in await self.store.query_attempts(rollout.rollout_id):
                    mine = attempt.worker_id == worker_id or (
                        self.hosted and (attempt.worker_id or "").startswith(prefix)
                    )
                    if not mine or attempt.status != "running":
                        continue
                    await self.store.finish_attempt(
                        rollout.rollout_id,
                        attempt.attempt_id,
                        "failed",
                        f"worker process {process.name} (pid {process.pid}) died with exit code {process.exitcode} "
                        "while running this attempt",
                    )
                    failed.append(rollout.rollout_id)
        except StoreError as exc:
            logger.warning("could not end the attempts of dead worker %s: %s", worker_id, exc)
        return failed


def _warn_replaced(process: Any, failed: list[str], new_pid: int | None) -> None:
    logger.warning(
        "worker process %s (pid %s) died with exit code %s while running %s; its attempt is failed and a new worker "
        "(pid %s) took its place",
        process.name,
        process.pid,
        process.exitcode,
        ", ".join(failed),
        new_pid,
    )
