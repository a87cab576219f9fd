"""``agl runner --processes N``: N runner processes forked from one that imported the agent once.

Each runner process used to import the openai client, the agent's framework and agentlightning on its own (~1.4 s
of CPU apiece in the CPU quickstart, a fifth of all its runners' CPU). With ``--processes N`` the process started
imports the agent module, its adapters and agentlightning once, keeps what it built out of garbage collections
(`gc.freeze`: the forked runners then share those pages instead of copying them) and forks the N runner processes
before any thread, event loop or store connection exists; each opens its own store and runs its share of
``--workers``.

The first process stays as their supervisor (it runs no rollout, and sleeps until something happens):

* SIGTERM and SIGINT to it reach every runner once (each drains as a lone runner does; a second signal releases
  at once). The runners sit in a process group of their own, so a signal to the supervisor's group (a trainer's
  `stop_children`, a Ctrl-C at a terminal) still reaches each runner once, through the supervisor;
* the lifeline of the process that started it (`start_child`) is polled here: its death stops the runners as
  SIGTERM does; each runner watches the supervisor through a pipe of its own, so a ``kill -9`` of the supervisor
  stops them too;
* a runner that exits unasked (a crash, an error) has the others stopped, and the supervisor then exits with its
  code: a trainer watching the supervisor (`guarded`) stops as it does when one of its own runner processes exits.

Forking is safe only while a single thread runs: if importing the agent started threads, the runners are started as
fresh ``agl runner`` processes instead, supervised the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentlightning._lifeline import start_child, watch_fd

__all__ = ["shares", "supervise_runners"]

logger = logging.getLogger(__name__)

_ORPHAN_GRACE_S = 20.0
"""Seconds the runners have to stop after the supervisor's parent died before they are killed."""

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def shares(workers: int, processes: int) -> list[int]:
    """``workers`` split over ``processes`` as evenly as it goes, each at least one."""
    return [max(workers // processes + (1 if i < workers % processes else 0), 1) for i in range(processes)]


@dataclass
class _RunnerProcess:
    """A runner process: forked (``process`` is ``None``; ``lifeline`` is the write end it watches) or started."""

    pid: int
    lifeline: int | None = None
    process: subprocess.Popen[bytes] | None = None
    code: int | None = None

    def poll(self) -> int | None:
        """Its exit code once it has exited (a signal's death as 128 + the signal's number), else ``None``."""
        if self.code is None:
            if self.process is not None:
                status = self.process.poll()
            else:
                pid, raw = os.waitpid(self.pid, os.WNOHANG)
                status = None if pid == 0 else os.waitstatus_to_exitcode(raw)
            if status is not None:
                self.code = 128 - status if status < 0 else status
                if self.lifeline is not None:
                    os.close(self.lifeline)
        return self.code


class _Wakeup:
    """Signals as bytes on a pipe (`signal.set_wakeup_fd`): the supervisor's poll wakes for them, and counts stops."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        for fd in (self.read_end, self.write_end):
            os.set_blocking(fd, False)
        self.stops = 0
        for signum in _STOP_SIGNALS:
            signal.signal(signum, self._on_stop)
        signal.signal(signal.SIGCHLD, self._on_child)
        signal.set_wakeup_fd(self.write_end)

    def _on_stop(self, signum: int, frame: object) -> None:
        self.stops += 1

    def _on_child(self, signum: int, frame: object) -> None:
        pass  # the wakeup byte is all it takes: the loop polls its runners

    def drain(self) -> None:
        """Read the wakeup bytes (the handlers have counted the signals)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_end, 512):
                pass

    def fds(self) -> tuple[int, int]:
        """Both ends of the pipe (a forked runner closes them)."""
        return self.read_end, self.write_end


def supervise_runners(
    processes: int,
    workers: int,
    run_one: Callable[[int, int], int],
    fresh_command: Callable[[int, int], list[str]],
    lifeline: int | None,
) -> int:
    """Start ``processes`` runners sharing ``workers`` and supervise them until they have all exited.

    Args:
        processes: Runner processes to start.
        workers: Concurrent rollouts of them all (`shares`).
        run_one: In a forked runner: runs it with this many workers, as runner number ``index`` (0 to
            ``processes - 1``; it picks the runner's store server among several); returns its exit code.
        fresh_command: The command line of a runner with this many workers and this index (when forking is not
            safe).
        lifeline: The inherited lifeline of this process's parent (`take_lifeline`), or ``None``.

    Returns:
        The exit code: the first unasked runner exit's code, else the highest of their codes.
    """
    wakeup = _Wakeup()
    if threading.active_count() == 1:
        runners = _fork_all(
            shares(workers, processes), run_one, [*wakeup.fds(), *([] if lifeline is None else [lifeline])]
        )
    else:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.current_thread())
        logger.warning("importing the agent started threads (%s): runners start as fresh processes, not forks", names)
        runners = _start_all([fresh_command(share, index) for index, share in enumerate(shares(workers, processes))])
    return _Supervisor(runners, wakeup, lifeline).run()


def _fork_all(
    counts: Sequence[int], run_one: Callable[[int, int], int], close_in_child: list[int]
) -> list[_RunnerProcess]:
    """Fork one runner per entry of ``counts`` (its workers), in one new process group."""
    # Frozen: the runners' garbage collections never walk (nor copy) what the imports built. Only the young
    # generations are collected first: a full collection walked every object (~107k, ~70 ms of CPU in the calc
    # example's runner) to free a few dozen (see `agentlightning._gc`).
    gc.collect(1)
    gc.freeze()
    runners: list[_RunnerProcess] = []
    group = 0
    for index, count in enumerate(counts):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            closing = [*close_in_child, write_end, *(r.lifeline for r in runners)]
            _runner_main(run_one, (count, index), read_end, group, closing)
        os.close(read_end)
        group = group or pid
        with contextlib.suppress(OSError):  # the child sets it too: whichever comes first
            os.setpgid(pid, group)
        runners.append(_RunnerProcess(pid, lifeline=write_end))
    return runners


def _runner_main(
    run_one: Callable[[int, int], int], share: tuple[int, int], lifeline: int, group: int, close: list[int | None]
) -> None:
    """A forked runner's whole life (``share``: its workers and index): never returns into the supervisor's code."""
    code = 1
    try:
        with contextlib.suppress(OSError):
            os.setpgid(0, group)
        signal.set_wakeup_fd(-1)
        for signum in (*_STOP_SIGNALS, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        for fd in close:
            if fd is not None:
                os.close(fd)
        watch_fd(lifeline, os.getppid())  # the supervisor's death (even a kill -9) stops this runner
        code = run_one(*share)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            getattr(atexit, "_run_exitfuncs")()  # noqa: B009 - what a normal exit runs (span flushes, logging)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _start_all(commands: Sequence[Sequence[str]]) -> list[_RunnerProcess]:
    """Start one fresh runner per command line, tied to this process, in one new process group."""
    runners: list[_RunnerProcess] = []
    group = 0
    try:
        for cmd in commands:
            process = start_child(cmd, process_group=group)
            group = group or process.pid
            runners.append(_RunnerProcess(process.pid, process=process))
    except OSError:
        for runner in runners:
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner.pid, signal.SIGKILL)
        raise
    return runners


class _Supervisor:
    """Forwards stops to the runners, watches the parent's lifeline and the runners' exits (see the module)."""

    def __init__(self, runners: list[_RunnerProcess], wakeup: _Wakeup, lifeline: int | None) -> None:
        self.runners = runners
        self.wakeup = wakeup
        self.lifeline = lifeline
        self.poller = select.poll()
        self.poller.register(wakeup.read_end, select.POLLIN)
        if lifeline is not None:
            self.poller.register(lifeline, select.POLLIN)
        self.forwarded = 0
        self.asked = 0  # stops the supervisor decided itself (the parent died, a runner exited unasked)
        self.failure: int | None = None
        self.orphaned_at: float | None = None

    def run(self) -> int:
        """Until every runner has exited; returns the exit code (see `supervise_runners`)."""
        running = list(self.runners)
        while running:
            # Not a sleep for synchronisation: signals, the lifeline and (by SIGCHLD) exits all wake the poll; the
            # timeout only bounds how late the orphan deadline is checked.
            for fd, _ in self.poller.poll(1000):
                if fd == self.wakeup.read_end:
                    self.wakeup.drain()
                elif fd == self.lifeline:
                    self._parent_died()
            for runner in list(running):
                if runner.poll() is not None:
                    running.remove(runner)
                    self._exited(runner)
            self._forward(running)
            if self.orphaned_at is not None and time.monotonic() - self.orphaned_at > _ORPHAN_GRACE_S:
                logger.error("runners still running %.0f s after the parent died: killing them", _ORPHAN_GRACE_S)
                for runner in running:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(runner.pid, signal.SIGKILL)
                self.orphaned_at = None
        if self.failure is not None:
            return self.failure
        return max((runner.code or 0 for runner in self.runners), default=0)

    def _parent_died(self) -> None:
        assert self.lifeline is not None
        self.poller.unregister(self.lifeline)
        logger.warning("parent process is gone: stopping the runners (pid %d)", os.getpid())
        self.asked += 1
        self.orphaned_at = time.monotonic()

    def _exited(self, runner: _RunnerProcess) -> None:
        code = runner.code or 0
        if self.wakeup.stops + self.asked > 0 or self.failure is not None:
            return  # asked to stop, or one failure already stops them all
        logger.warning("runner process %d exited with code %d: stopping the others", runner.pid, code)
        self.failure = code or 1
        self.asked += 1

    def _forward(self, running: list[_RunnerProcess]) -> None:
        while self.forwarded < self.wakeup.stops + self.asked:
            self.forwarded += 1
            for runner in running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(runner.pid, signal.SIGTERM)
