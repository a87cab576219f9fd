"""An agent that blocks its worker (a tool that spins the CPU, big-int arithmetic holding the GIL) cannot freeze its
runner: the runner's own process sees the worker stuck past the rollout timeout, kills it, ends that attempt as
``timeout`` with the frame it was stuck in, and the other rollouts of the batch finish in a new worker process.

The agents are module-level functions: the worker processes import them from this file.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import agentlightning as agl
from agentlightning.store import SqliteStore
from agentlightning.testing import wait_until

TIMEOUT = 4.0
"""The rollout timeout: short, so the test is quick; the healthy rollouts take milliseconds."""


def spin_forever() -> int:
    """A tool that never returns and never yields: pure Python, the CPU busy."""
    n = 0
    while True:
        n += 1


def hold_the_gil() -> int:
    """A tool that holds the GIL for hours in one C call (9^(9^10): no other thread of the process runs)."""
    return 9 ** (9**10)


async def async_spinning_agent(task: dict[str, object]) -> float:
    if task["block"]:
        spin_forever()
    await asyncio.sleep(0.01)
    return 1.0


def sync_gil_holding_agent(task: dict[str, object]) -> float:
    if task["block"]:
        hold_the_gil()
    return 1.0


def sync_spinning_agent(task: dict[str, object]) -> float:
    if task["block"]:
        spin_forever()
    return 1.0


def _store(tmp_path: Path) -> SqliteStore:
    return SqliteStore(tmp_path / "store.db", retry_policy=agl.RetryPolicy(max_attempts=1, heartbeat_timeout=600))


async def _enqueue(store: SqliteStore, blocked_at: int, count: int) -> list[str]:
    ids: list[str] = []
    for i in range(count):
        rollout = await store.enqueue_rollout({"i": i, "block": i == blocked_at})
        ids.append(rollout.rollout_id)
    return ids


def _check_the_run(store: SqliteStore, ids: list[str], blocked_at: int, frame: str, tries: int = 1) -> None:
    async def check() -> None:
        for i, rollout_id in enumerate(ids):
            attempts = await store.query_attempts(rollout_id)
            if i == blocked_at:
                # each attempt ended once, by the runner's watchdog (agl runner's store retries it: max_attempts 3)
                assert len(attempts) == tries
                for attempt in attempts:
                    assert attempt.status == "timeout"
                    where = rf"{frame} \(.*test_runner_blocking\.py:\d+\)"
                    pattern = rf"the agent blocked its worker for \d+(\.\d+)? s in {where}"
                    assert re.fullmatch(pattern, attempt.error or ""), attempt.error
                assert (await store.get_rollout(rollout_id)).status == "failed"
            else:
                # finished once: a rollout released from the killed worker has a cancelled attempt before it
                assert [a.status for a in attempts if a.status != "cancelled"] == ["succeeded"], attempts
                assert (await store.get_rollout(rollout_id)).status == "succeeded"
        await store.close()

    asyncio.run(check())


def test_an_async_agent_that_spins_the_cpu_times_out_and_the_others_finish(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ids = asyncio.run(_enqueue(store, blocked_at=1, count=6))
    runner = agl.Runner(async_spinning_agent, store, n_workers=3, rollout_timeout=TIMEOUT, stop_when_idle=True)
    assert runner.hosted  # the async workers run in a watched process
    runner.run()  # returns: the run goes on past the blocked agent and ends
    assert runner.workers_replaced == 1
    assert multiprocessing.active_children() == []  # the stuck process was killed, the new one ended
    _check_the_run(store, ids, 1, "spin_forever")


@pytest.mark.parametrize(
    ("agent", "frame"),
    [(sync_gil_holding_agent, "hold_the_gil"), (sync_spinning_agent, "spin_forever")],
    ids=["holding-the-gil", "spinning"],
)
def test_a_blocked_process_worker_is_replaced(tmp_path: Path, agent: Callable[..., float], frame: str) -> None:
    # Holding the GIL, the whole worker process is stuck: the runner kills it. Spinning in pure Python, its own
    # timeout abandons the agent's thread and the process asks to be replaced (the thread would go on spinning).
    store = _store(tmp_path)
    ids = asyncio.run(_enqueue(store, blocked_at=0, count=4))
    runner = agl.Runner(agent, store, n_workers=2, worker_mode="process", rollout_timeout=TIMEOUT, stop_when_idle=True)
    runner.run()
    assert runner.workers_replaced == 1
    assert multiprocessing.active_children() == []
    _check_the_run(store, ids, 0, frame)


def test_agl_runner_with_a_rollout_timeout_survives_an_agent_that_blocks(tmp_path: Path) -> None:
    # What `agl train` starts: `agl runner --rollout-timeout` in a session of its own, stopped with SIGTERM.
    store = _store(tmp_path)
    ids = asyncio.run(_enqueue(store, blocked_at=2, count=6))
    cmd = [sys.executable, "-m", "agentlightning.cli", "runner", "--db", str(tmp_path / "store.db"), "--no-instrument"]
    cmd += ["--app-dir", str(Path(__file__).parent), "--agent", "test_runner_blocking:async_spinning_agent"]
    cmd += ["--workers", "3", "--rollout-timeout", str(TIMEOUT), "--poll-interval", "0.02"]
    runner = subprocess.Popen(cmd, start_new_session=True)
    try:
        statuses = ("succeeded", "failed")
        wait_until(
            lambda: all(r.status in statuses for r in asyncio.run(store.query_rollouts(rollout_ids=ids))),
            "every rollout to end",
            timeout=240,
        )
        children = psutil.Process(runner.pid).children(recursive=True)
        runner.terminate()
        assert runner.wait(timeout=120) == 0
        psutil.wait_procs(children, timeout=60)
        assert not [child for child in children if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    _check_the_run(store, ids, 2, "spin_forever", tries=agl.RetryPolicy().max_attempts)
