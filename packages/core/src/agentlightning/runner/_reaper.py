"""Command agents' process groups end with their runner, however it ends (``kill -9`` included).

A command agent (`agentlightning.runner.CommandAgent`) runs each rollout's program in a process group of its own and
ends that group itself when the rollout ends, is cancelled or times out. What it cannot do is outlive a runner killed
outright (``kill -9``, the OOM killer). For that, the first command a runner process starts also starts one small
watcher, this file run as a script (standard library only, ``python -I -S``: no site-packages, a few milliseconds):
its stdin is a pipe whose only write end stays in the runner, on which the runner writes ``+PGID`` when a command
starts and ``-PGID`` once its group is gone. When the runner dies, however it dies, the kernel closes the write end;
the watcher reads end-of-file, sends SIGTERM to every group still listed, SIGKILL to those still there after a grace
period, and exits. It sits in a session of its own, so a Ctrl-C at the terminal (SIGINT to the foreground group)
does not end it before it has done its work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time

__all__ = ["GroupReaper", "kill_group", "reaper"]

logger = logging.getLogger(__name__)

_GRACE_S = 5.0
"""Seconds the groups of a dead runner have between SIGTERM and SIGKILL."""


def kill_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the process group ``pgid``; whether any process of it was still there."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its user: nothing more we can do for it
        return True
    return True


class GroupReaper:
    """The runner process's side: starts the watcher on first use and tells it which groups to end with it."""

    def __init__(self, grace_s: float = _GRACE_S) -> None:
        self.grace_s = grace_s
        self._process: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None
        self._pid = 0  # the process that started the watcher (a forked child starts its own)
        self._lock = threading.Lock()
        self._warned = False

    def _ensure(self) -> int | None:
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        read_end, write_end = os.pipe()  # both non-inheritable: only the watcher gets read_end, as its stdin
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", __file__, str(self.grace_s)],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(write_end)
            self._warn(f"cannot start the process-group watcher ({exc})")
            return None
        finally:
            os.close(read_end)
        self._fd, self._pid = write_end, os.getpid()
        return write_end

    def _send(self, line: str) -> None:
        with self._lock:
            fd = self._ensure()
            if fd is None:
                return
            try:
                os.write(fd, line.encode())
            except OSError as exc:  # the watcher died: start a new one next time
                self._fd = None
                os.close(fd)
                self._warn(f"the process-group watcher is gone ({exc})")

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("%s: command agents will not be stopped should this runner be killed outright", why)

    def watch(self, pgid: int) -> None:
        """End the group ``pgid`` should this process die before `forget` is called."""
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        """The group ``pgid`` is gone (ended by the runner itself)."""
        self._send(f"-{pgid}\n")


reaper = GroupReaper()
"""This process's watcher (started on the first command)."""


def _main(grace_s: float) -> None:
    """The watcher: read ``+PGID`` / ``-PGID`` lines until end-of-file, then end the groups still listed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip()
        with contextlib.suppress(ValueError):
            pgid = int(line[1:])
            if pgid > 1:
                (groups.add if line[:1] == b"+" else groups.discard)(pgid)
    groups = {pgid for pgid in groups if kill_group(pgid, signal.SIGTERM)}
    deadline = time.monotonic() + grace_s
    while groups and time.monotonic() < deadline:
        time.sleep(0.05)  # polling: the groups are not this process's children, nothing to wait on
        groups = {pgid for pgid in groups if kill_group(pgid, 0)}
    for pgid in groups:
        kill_group(pgid, signal.SIGKILL)


if __name__ == "__main__":
    _main(float(sys.argv[1]) if len(sys.argv) > 1 else _GRACE_S)
