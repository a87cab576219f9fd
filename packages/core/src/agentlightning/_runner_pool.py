"""A trainer's local runner processes: started tied to the trainer, watched while it waits, stopped on every way out.

Shared by ``agl train`` and the examples' ``train.py`` scripts (exported from `agentlightning.cli`):

* `start_runners` starts each command with `start_child` in its own session, so that even a ``kill -9`` of the
  trainer ends them (the runner's ``agl`` entry point watches its parent) and a Ctrl-C at the terminal reaches only
  the trainer, which stops them itself;
* `guarded` awaits the trainer's work but fails at once with `RunnerDied` when a runner exits (no silent
  zero-reward run), and never leaves its watcher running to raise into nowhere;
* `stop_children` stops them: SIGTERM to each process group (a runner drains), then SIGKILL;
* `cancel_on_sigterm` makes SIGTERM cancel the trainer's main task, so that it ends through its cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from agentlightning._lifeline import start_child

__all__ = ["RunnerDied", "cancel_on_sigterm", "guarded", "start_runners", "stop_children"]

T = TypeVar("T")


class RunnerDied(Exception):
    """A runner process exited while the trainer waited for rollouts."""


def start_runners(
    commands: Sequence[Sequence[str]], env: dict[str, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    """One runner process per command line, each in its own session and tied to this process (`start_child`).

    Args:
        commands: The runners' command lines; each program must call `agentlightning.cli.main` (``agl runner``,
            or a script that wraps it), which watches this process.
        env: Their environment (default: this process's).

    Returns:
        The processes; stop them with `stop_children` on every way out (if one fails to start, those already
        started are stopped before the error propagates).
    """
    runners: list[subprocess.Popen[bytes]] = []
    try:
        for cmd in commands:
            runners.append(start_child(cmd, env=env, start_new_session=True))
    except OSError:
        stop_children(runners)
        raise
    return runners


def stop_children(children: Sequence[subprocess.Popen[bytes]], grace_s: float = 15.0) -> None:
    """Stop each child's whole process group (the child and anything it started): SIGTERM, then SIGKILL.

    The children run in their own sessions, so a Ctrl-C at the terminal reaches only the trainer, which then stops
    them here on its way out. Blocks up to ``grace_s`` seconds: from a coroutine, call it in a thread.
    """

    def signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone, its group with it
            os.killpg(process.pid, sig)

    for process in children:
        signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
    for process in children:  # the group may outlive its leader: kill what is left either way
        signal_group(process, signal.SIGKILL)
        process.wait()


async def guarded(runners: Sequence[subprocess.Popen[bytes]], work: Awaitable[T]) -> T:
    """Await ``work``, but stop at once with `RunnerDied` if a runner process exits (no silent zero-reward run).

    Without runners (all remote) it just awaits ``work``.
    """

    async def watch() -> None:
        while all(r.poll() is None for r in runners):
            await asyncio.sleep(0.5)
        dead = next(r for r in runners if r.poll() is not None)
        raise RunnerDied(f"a runner process exited with code {dead.returncode}; its error is printed above")

    if not runners:
        return await work
    watcher, job = asyncio.ensure_future(watch()), asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({watcher, job}, return_when=asyncio.FIRST_COMPLETED)
        if job not in done:
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
            watcher.result()
        return job.result()
    finally:
        # Cancelled too when the run is (Ctrl-C, SIGTERM): left running, it would see the runners stop on the way
        # out and raise into nowhere ("Task exception was never retrieved").
        # A cancellation can be lost on its way in (Python 3.11's asyncio.wait_for drops one that lands as what it
        # awaits completes, and the run would go on training): the job is cancelled again until it has ended.
        for task in (watcher, job):
            task.cancel()
        while not job.done():
            await asyncio.wait({job}, timeout=5.0)  # time for its own cleanup before the next cancellation
            job.cancel()
        await asyncio.gather(watcher, job, return_exceptions=True)


def cancel_on_sigterm() -> None:
    """From the trainer's main task: SIGTERM cancels it, so the run ends through its cleanup (as Ctrl-C does).

    The caller then sees `asyncio.CancelledError` come out of ``asyncio.run`` and says one line ("terminated").
    """
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
