"""A run stopped by Ctrl-C or SIGTERM ends even when its work swallows the first cancellation (as Python 3.11's
``asyncio.wait_for`` can): `guarded` cancels the work again until it has ended."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from agentlightning.cli import guarded


async def test_guarded_work_that_swallows_a_cancellation_is_cancelled_again() -> None:
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    swallowed = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()  # lost on its way in: the work goes on
        await asyncio.sleep(3600)

    try:
        run = asyncio.ensure_future(guarded([runner], work()))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        run.cancel()  # Ctrl-C
        await swallowed.wait()
        done, _ = await asyncio.wait({run}, timeout=120)  # bounds a hang only (the old code waited for ever)
        assert run in done and run.cancelled()
    finally:
        runner.kill()
        runner.wait()
