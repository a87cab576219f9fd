"""A run stopped by Ctrl-C or SIGTERM while rollouts finish must stop: the cancellation of a task waiting for
rollouts (or for the proxy to drain, or for a resume) reaches it even when it lands in the same turn of the event loop
as the change that wakes it. Python 3.11's ``asyncio.wait_for`` returned normally there, swallowing the cancellation,
and ``agl train`` went on training after a Ctrl-C (seen once in a full test run)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentlightning.store._common import ChangeNotifier, wait_until_finished


async def _until_done(task: asyncio.Task[Any]) -> None:
    for _ in range(50):  # loop turns, not time: a cancelled task ends within a few
        if task.done():
            return
        await asyncio.sleep(0)


async def test_a_wait_for_rollouts_cancelled_as_a_change_lands_is_cancelled() -> None:
    notifier = ChangeNotifier()
    polls = 0

    async def poll() -> tuple[list[Any], bool]:
        nonlocal polls
        polls += 1
        return [], False  # never all done: only the cancellation ends the wait

    task = asyncio.create_task(wait_until_finished(notifier, poll, None, 3600.0))
    while polls == 0:
        await asyncio.sleep(0)
    for _ in range(5):  # into its wait on the change event
        await asyncio.sleep(0)
    notifier.notify()  # a rollout finished: the waiter's event is set in the next callback...
    asyncio.get_running_loop().call_soon(task.cancel)  # ...and Ctrl-C cancels the waiter right after it
    await _until_done(task)
    assert task.cancelled(), f"the wait went on after its cancellation ({polls} polls)"
