"""`run_async`: the event loop the framework's processes run on (uvloop's when installed, else asyncio's)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["UVLOOP_ENV", "run_async", "sigint_taken"]

T = TypeVar("T")

UVLOOP_ENV = "AGL_UVLOOP"
"""Set to ``0`` to run on asyncio's own event loop even when uvloop is installed."""


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new event loop, as `asyncio.run` does, and return its result.

    The loop is uvloop's when uvloop is installed (it comes with ``uvicorn[standard]``, a dependency of this
    package, except on Windows): the trainer's proxy and the runners' agents spend much of their CPU in the event
    loop, and uvloop's costs less (measured: 5% less wall time per iteration of the CPU quickstart). ``AGL_UVLOOP=0``
    in the environment turns it off.

    Ctrl-C (SIGINT) cancels ``main``, which ends through its cleanup, and then raises `KeyboardInterrupt`, as with
    `asyncio.run`; unlike `asyncio.run`, also in a process started with SIGINT ignored (a script's background job),
    where Python leaves it ignored: a training run stops on Ctrl-C however it was started. A SIGINT handler the
    application installed is left alone.
    """
    with sigint_taken():
        if os.environ.get(UVLOOP_ENV, "1").strip() != "0":
            try:
                import uvloop
            except ImportError:
                pass
            else:
                return uvloop.run(main)
        return asyncio.run(main)


@contextlib.contextmanager
def sigint_taken() -> Generator[None, None, None]:
    """Python's own SIGINT handler for the duration of the run in a process that inherited SIGINT ignored.

    A background job of a script (``cmd &`` in a shell without job control, ``nohup cmd &`` in a script) starts
    with SIGINT ignored, and the interpreter then leaves it ignored; `asyncio.Runner` installs its handler (the one
    that cancels the main task) only over Python's default one, so a SIGINT to such a process did nothing at all:
    ``agl train`` went on training, and a test that sent it SIGINT waited in vain. A training run is stopped with
    Ctrl-C however it was started, so the default handler goes back for the run (the ignored disposition after it);
    a handler of the application's own is left alone.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
