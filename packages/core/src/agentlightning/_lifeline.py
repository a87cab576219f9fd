"""Child processes that end when their parent dies, however it dies (``kill -9`` included).

The parent starts each child with `start_child`: the child inherits the read end of a pipe whose only write end
stays in the parent. Nothing is ever written; when the parent process ends, for any reason, the kernel closes that
write end and the child's read returns end-of-file. The child's side, `watch_parent` (run by the ``agl`` entry
point), then stops the child as SIGTERM would (a runner drains, a store server shuts down) and, should that not
finish within a grace period, ends it outright.

A pipe rather than ``prctl(PR_SET_PDEATHSIG)``: it works on macOS too, and the death signal fires when the parent
*thread* that started the child ends, not the process. One caveat: a process forked (not exec'd) from the parent
inherits the write end and keeps the pipe open while it lives.

A child that is not an ``agl`` command (a command agent: ``node agent.mjs``) cannot watch a pipe itself: the runner
hands its process group to a watcher that does (`agentlightning.runner._reaper`, the same pipe rule).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import weakref
from collections.abc import Sequence
from typing import Any, cast

__all__ = ["LIFELINE_ENV", "start_child", "take_lifeline", "watch_fd", "watch_parent"]

logger = logging.getLogger(__name__)

LIFELINE_ENV = "AGL_LIFELINE_FD"
"""Environment variable naming the inherited pipe descriptor a child watches (removed once read)."""

_GRACE_S = 20.0
"""Seconds an orphaned child has to stop cleanly after its SIGTERM before it is ended with ``os._exit``."""


def start_child(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, pass_fds: Sequence[int] = (), **popen_kwargs: Any
) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, ...)`` for an ``agl`` command that ends when this process dies.

    Args:
        cmd: The command line; its program must call `watch_parent` (every ``agl`` command does).
        env: The child's environment (default: this process's); the pipe's descriptor is added to it.
        pass_fds: More descriptors the child inherits (a listening socket it serves, say).
        **popen_kwargs: Passed to `subprocess.Popen` (not ``close_fds``).

    Returns:
        The child. Keep it while the child should run: the pipe's write end is closed when the object is
        garbage-collected, and the child then stops as it would at this process's death.
    """
    read_end, write_end = os.pipe()  # both non-inheritable: only the child gets read_end, by pass_fds
    try:
        child_env = {**(os.environ if env is None else env), LIFELINE_ENV: str(read_end)}
        process = cast(  # bytes unless popen_kwargs ask for text, which pyright cannot see through **kwargs
            "subprocess.Popen[bytes]",
            subprocess.Popen(list(cmd), env=child_env, pass_fds=(read_end, *pass_fds), **popen_kwargs),
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    # The write end lives as long as the Popen object (nobody can wait for the child without it); at this process's
    # exit the kernel closes it whatever happens.
    weakref.finalize(process, os.close, write_end)
    return process


def watch_parent(grace_s: float = _GRACE_S) -> bool:
    """In a child started by `start_child`: stop this process when the parent dies (a daemon thread watches).

    On the parent's death the process gets SIGTERM (its own handlers drain and stop it), and is ended with exit
    code 1 if it is still running ``grace_s`` seconds later. Does nothing without `LIFELINE_ENV`; the variable
    is removed so that this process's own children do not watch a descriptor that is not theirs.

    Returns:
        Whether a watch was started.
    """
    fd = take_lifeline()
    if fd is None:
        return False
    watch_fd(fd, os.getppid(), grace_s)
    return True


def take_lifeline() -> int | None:
    """The inherited lifeline descriptor of `LIFELINE_ENV` (removed from the environment), or ``None``.

    For a process that watches it itself (a forking runner polls it in its own loop) instead of `watch_parent`'s
    thread; a variable that names no open descriptor is warned about and gives ``None``.
    """
    value = os.environ.pop(LIFELINE_ENV, None)
    if value is None:
        return None
    try:
        fd = int(value)
        os.fstat(fd)
    except (ValueError, OSError):
        logger.warning("%s=%r names no open descriptor: this process will not end with its parent", LIFELINE_ENV, value)
        return None
    return fd


def watch_fd(fd: int, parent: int, grace_s: float = _GRACE_S) -> None:
    """Stop this process as `watch_parent` does when ``fd`` (the read end of a pipe whose write end only
    ``parent`` holds) reaches end-of-file: SIGTERM to the main thread, exit code 1 after ``grace_s`` seconds."""
    threading.Thread(target=_watch, args=(fd, parent, grace_s), name="agentlightning-lifeline", daemon=True).start()


def _watch(fd: int, parent: int, grace_s: float) -> None:
    try:
        while os.read(fd, 64):  # the parent never writes: this returns only at end-of-file
            pass
    except OSError:
        pass
    logger.warning("parent process %d is gone: stopping (pid %d)", parent, os.getpid())
    # To the main thread: a signal the kernel hands to another thread would not interrupt the main thread's
    # blocking wait (a join, a sleep), so its handler would run only when that wait ended by itself.
    main = threading.main_thread().ident
    assert main is not None  # the main thread has started: it started this one
    signal.pthread_kill(main, signal.SIGTERM)
    # Not a sleep for synchronisation: a deadline after which a child that ignored its SIGTERM is ended anyway.
    threading.Event().wait(grace_s)
    logger.error("still running %.0f s after the parent died: exiting", grace_s)
    os._exit(1)
