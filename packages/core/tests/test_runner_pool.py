"""`agentlightning.cli.guarded` and `stop_children` on real child processes: a runner that dies fails the wait at
once with `RunnerDied`, and a cancelled wait leaves no watcher behind to raise into nowhere."""

from __future__ import annotations

import asyncio
import sys

import pytest

from agentlightning.cli import RunnerDied, guarded, start_runners, stop_children

SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]


async def test_a_runner_that_exits_fails_the_wait_with_its_exit_code() -> None:
    runners = start_runners([SLEEPER, [sys.executable, "-c", "import sys; sys.exit(3)"]])
    try:
        with pytest.raises(RunnerDied, match="exited with code 3"):
            await guarded(runners, asyncio.Event().wait())  # work that would never end by itself
    finally:
        stop_children(runners)
    assert all(r.returncode is not None for r in runners)


async def test_a_cancelled_wait_leaves_no_task_to_raise_later() -> None:
    runners = start_runners([SLEEPER])
    try:
        wait = asyncio.ensure_future(guarded(runners, asyncio.Event().wait()))
        await asyncio.sleep(0)  # let it start its watcher
        wait.cancel()  # what Ctrl-C or SIGTERM does to the trainer's main task
        with pytest.raises(asyncio.CancelledError):
            await wait
        # A watcher left running would see the runner stop below and raise "Task exception was never retrieved".
        assert asyncio.all_tasks() == {asyncio.current_task()}
    finally:
        stop_children(runners)


async def test_work_that_finishes_returns_its_result() -> None:
    runners = start_runners([SLEEPER])
    try:
        assert await guarded(runners, asyncio.sleep(0, result=42)) == 42
        assert await guarded([], asyncio.sleep(0, result=7)) == 7
    finally:
        stop_children(runners)
