"""The engine's update, run in a worker thread: a stop that arrives meanwhile says that it waits for it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

__all__ = ["update_in_thread"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
B = TypeVar("B")


async def update_in_thread(update: Callable[[B], T], batch: B) -> T:
    """``update(batch)`` in a worker thread (the event loop keeps serving meanwhile), its result returned.

    A thread cannot be interrupted: a Ctrl-C or SIGTERM during the update cancels the loop at once, but the process
    ends only once the update returns (minutes for a real model on a CPU). Rather than a silent wait, one line says
    so; the update's result is then dropped (the checkpoint keeps the weights of the last finished iteration).
    """
    work = asyncio.ensure_future(asyncio.to_thread(update, batch))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        if not work.done():
            logger.warning("stopping: the model update in progress finishes first (its result is not kept)")
        raise
