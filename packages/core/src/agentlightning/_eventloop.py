"""`run_async`: the event loop the framework's processes run on (uvloop's when installed, else asyncio's)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["UVLOOP_ENV", "run_async"]

T = TypeVar("T")

UVLOOP_ENV = "AGL_UVLOOP"
"""Set to ``0`` to run on asyncio's own event loop even when uvloop is installed."""


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new event loop, as `asyncio.run` does, and return its result.

    The loop is uvloop's when uvloop is installed (it comes with ``uvicorn[standard]``, a dependency of this
    package, except on Windows): the trainer's proxy and the runners' agents spend much of their CPU in the event
    loop, and uvloop's costs less (measured: 5% less wall time per iteration of the CPU quickstart). ``AGL_UVLOOP=0``
    in the environment turns it off.
    """
    if os.environ.get(UVLOOP_ENV, "1").strip() != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)
