"""The watchdog over worker processes whose agent may block them: a sign of progress each worker process publishes,
and what its runner does when the signs stop for longer than the rollout timeout.

An agent can block its worker so that nothing inside the worker's process can act: big-int arithmetic (``9**9**9``)
holds the GIL for minutes, a pure-Python loop never yields the event loop, a C extension holds the GIL. Neither the
rollout timeout (``asyncio.timeout`` needs the loop; a thread's join needs the GIL) nor the heartbeats can fire. So
each worker process ticks a shared counter from its event loop (`tick_on`), marks which slot's agent is stepping
(`stepping`), and lets `faulthandler` dump its threads' frames on ``SIGUSR2`` (`dump_frames_on_signal`;
faulthandler needs no GIL). The runner's process, which runs no agent, reads the ticks (`WorkerWatch`): while a worker
is stuck it beats for that worker's attempts (`beat_for`), and once the worker has not progressed for the rollout
timeout it reads the stuck frame (`blocked_frame`), kills the process, ends the blocked attempt as ``timeout`` with
the reason and hands the worker's other attempts back to the queue (`end_attempts_of`); the runner then starts a new
worker process.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import re
import signal
import sysconfig
import time
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

from agentlightning.store import LightningStore, StoreError

__all__ = [
    "RECYCLE_EXIT_CODE",
    "WorkerWatch",
    "ask_to_stop",
    "beat_for",
    "blocked_frame",
    "dump_frames_on_signal",
    "end_attempts_of",
    "new_progress",
    "stepping",
    "tick_on",
]

logger = logging.getLogger("agentlightning.runner._runner")  # the runner's logger

RECYCLE_EXIT_CODE = 75
"""Exit code of a worker process that asks to be replaced (an agent's thread it had to abandon still runs in it)."""

_TICK_S = 0.25
"""Seconds between two ticks of a worker process's event loop."""
_DUMP_SIGNAL = signal.SIGUSR2
_DUMP_WAIT_S = 2.0
"""Most seconds the runner waits for a stuck worker's frames (faulthandler writes them at once)."""
_LIBRARY_DIRS = tuple(
    str(Path(p).resolve())
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"], str(Path(__file__).parent.parent)}
)
"""Frames in these folders are the runtime's and ours: the blocked frame is the innermost frame outside them."""


def new_progress(ctx: Any) -> Any:
    """Memory shared with one worker process: ``[0]`` its last tick (``time.monotonic_ns``; 0 until its loop runs: a
    process still importing is not stuck), ``[1]`` the slot whose agent is stepping, plus one (0: none), ``[2]`` 1
    once the runner asks it to stop.

    Lock-free on purpose: a process killed while it waits on a ``multiprocessing`` lock or condition leaves it
    broken for the others (``Event.set`` then waits for the dead waiter forever).
    """
    return ctx.RawArray("q", 3)


def tick_on(loop: asyncio.AbstractEventLoop, progress: Any, on_stop: Callable[[], None] | None = None) -> None:
    """In a worker process: tick ``progress`` from ``loop`` for as long as it runs (a stuck loop stops ticking);
    ``on_stop`` runs once the runner asks the worker to stop (`ask_to_stop`)."""

    def tick() -> None:
        progress[0] = time.monotonic_ns()
        if on_stop is not None and progress[2]:
            on_stop()
            return
        loop.call_later(_TICK_S, tick)

    loop.call_soon_threadsafe(tick)


def ask_to_stop(progress: Any) -> None:
    """Ask the worker process that ticks ``progress`` to stop (see `tick_on`)."""
    progress[2] = 1


def stepping(coro: Coroutine[Any, Any, Any], progress: Any, slot: int) -> Any:
    """``coro`` awaited as is, with ``progress[1]`` naming ``slot`` while one of its steps runs on the loop.

    A step that never returns (the agent blocks the loop) leaves the mark: the runner knows whose attempt blocked.
    """
    return _Stepped(coro, progress, slot)


class _Stepped:
    def __init__(self, coro: Coroutine[Any, Any, Any], progress: Any, slot: int) -> None:
        self._coro = coro
        self._progress = progress
        self._slot = slot

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, progress = self._coro, self._progress
        value: Any = None
        error: BaseException | None = None
        while True:
            progress[1] = self._slot + 1
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                progress[1] = 0
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # a cancellation (the timeout, a drain) goes on into the agent
                value, error = None, exc


_dump_files: list[Any] = []  # open for the process's life: faulthandler writes to the descriptor


def dump_frames_on_signal(path: str) -> None:
    """In a worker process: ``SIGUSR2`` appends every thread's frames to ``path`` (from C, even with the GIL held)."""
    file = open(path, "a", encoding="utf-8")  # noqa: SIM115  # kept open: faulthandler holds its descriptor
    _dump_files.append(file)
    faulthandler.register(_DUMP_SIGNAL, file=file, all_threads=True, chain=False)


_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)', re.MULTILINE)


def blocked_frame(pid: int, path: str) -> str:
    """Where the stuck worker process ``pid`` is: its innermost frame outside the runtime and agentlightning.

    Asks the process for its frames (`dump_frames_on_signal`) and reads what it appends to ``path``; ``"an unknown
    frame"`` when it cannot tell.
    """
    try:
        start = os.path.getsize(path)
        os.kill(pid, _DUMP_SIGNAL)
    except OSError:
        return "an unknown frame"
    text = ""
    deadline = time.monotonic() + _DUMP_WAIT_S
    while time.monotonic() < deadline:  # faulthandler writes the dump at once; wait until it stops growing
        time.sleep(0.02)
        with open(path, encoding="utf-8", errors="replace") as file:
            file.seek(start)
            latest = file.read()
        if latest and latest == text:
            break
        text = latest
    return _innermost_user_frame(text)


def _innermost_user_frame(dump: str) -> str:
    for block in re.split(r"^(?:Current thread|Thread) 0x[0-9a-f]+", dump, flags=re.MULTILINE)[1:]:
        for match in _FRAME.finditer(block):  # most recent call first
            file = match["file"]
            if not str(Path(file).resolve()).startswith(_LIBRARY_DIRS):
                return f"{match['name']} ({file}:{match['line']})"
    first = _FRAME.search(dump)
    return f"{first['name']} ({first['file']}:{first['line']})" if first else "an unknown frame"


class WorkerWatch:
    """The runner's view of one worker process's progress.

    Args:
        progress: The memory the worker ticks (`new_progress`).
    """

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.last_beat = 0.0

    def stuck_for(self) -> float:
        """Seconds since the worker's event loop last ticked (0 before its first tick)."""
        last = self.progress[0]
        return 0.0 if last == 0 else max(0.0, (time.monotonic_ns() - last) / 1e9)

    def stepping_slot(self) -> int | None:
        """The slot whose agent was stepping when the loop last stopped (``None``: none)."""
        mark = int(self.progress[1])
        return mark - 1 if mark > 0 else None


async def _running_attempts(store: LightningStore, prefix: str) -> list[tuple[str, str, str]]:
    found: list[tuple[str, str, str]] = []
    for rollout in await store.query_rollouts(status=["running"]):
        for attempt in await store.query_attempts(rollout.rollout_id):
            if attempt.status == "running" and (attempt.worker_id or "").startswith(prefix):
                found.append((rollout.rollout_id, attempt.attempt_id, attempt.worker_id or ""))
    return found


async def beat_for(store: LightningStore, prefix: str) -> int:
    """Heartbeat the running attempts of a stuck worker process (it cannot), its worker ids starting with ``prefix``
    (`agentlightning.runner._workers.worker_prefix`); returns how many."""
    beaten = 0
    try:
        for rollout_id, attempt_id, _ in await _running_attempts(store, prefix):
            try:
                await store.heartbeat(rollout_id, attempt_id)
                beaten += 1
            except StoreError:  # ended meanwhile
                pass
    except StoreError as exc:
        logger.warning("could not beat for the attempts of stuck worker %s: %s", prefix, exc)
    return beaten


async def end_attempts_of(
    store: LightningStore, prefix: str, blocked_worker_id: str | None, reason: str
) -> tuple[list[str], list[str]]:
    """End the attempts of a killed worker process (worker ids starting with ``prefix``): ``blocked_worker_id``'s as
    ``timeout`` with ``reason``, the others released to the queue (their agents were blameless). Returns (timed out,
    released) rollout ids."""
    timed_out: list[str] = []
    released: list[str] = []
    try:
        for rollout_id, attempt_id, worker_id in await _running_attempts(store, prefix):
            try:
                if worker_id == blocked_worker_id:
                    await store.finish_attempt(rollout_id, attempt_id, "timeout", reason)
                    timed_out.append(rollout_id)
                else:
                    await store.release_claim(rollout_id, attempt_id)
                    released.append(rollout_id)
            except StoreError as exc:  # ended meanwhile (the trainer cancelled it)
                logger.info("attempt %s of rollout %s already ended: %s", attempt_id, rollout_id, exc)
    except StoreError as exc:
        logger.warning("could not end the attempts of stuck worker %s: %s", prefix, exc)
    return timed_out, released
