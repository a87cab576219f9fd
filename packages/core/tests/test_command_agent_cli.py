"""``agl runner --agent-command``: a Ctrl-C or a ``kill -9`` of the runner leaves none of its commands running.

Real parts: an ``agl runner`` process over a SQLite file, running a Python command that forks a child ignoring
SIGTERM; the test waits on the processes themselves, never on a clock.
"""

from __future__ import annotations

import asyncio
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

import agentlightning as agl
from agentlightning.testing import wait_until

AGENT = """
import os, signal, sys, time
pids = open(sys.argv[1], "a")
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it
    pids.write(f"{os.getpid()}\\n"); pids.flush()
    time.sleep(600)
    os._exit(0)
pids.write(f"{os.getpid()}\\n"); pids.flush()
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[int], Path]:
    """An ``agl runner`` running two rollouts' commands, once all four of their processes run."""
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    db, pids = tmp_path / "store.db", tmp_path / "pids"

    async def enqueue() -> None:
        store = agl.SqliteStore(db)
        for i in range(2):
            await store.enqueue_rollout({"i": i})
        await store.close()

    asyncio.run(enqueue())
    command = f"{shlex.quote(sys.executable)} agent.py {shlex.quote(str(pids))}"
    agl_runner = [sys.executable, "-m", "agentlightning.cli", "runner", "--db", str(db), "--app-dir", str(tmp_path)]
    runner = subprocess.Popen(
        [*agl_runner, "--agent-command", command, "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "runner.log").open("w"),
    )

    def four() -> bool:
        assert runner.poll() is None, (tmp_path / "runner.log").read_text()[-3000:]
        return pids.exists() and len(pids.read_text().split()) == 4

    wait_until(four, "both commands and their children to run")
    return runner, [int(pid) for pid in pids.read_text().split()], db


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_a_stopped_or_killed_runner_leaves_no_command_running(tmp_path: Path, sig: signal.Signals) -> None:
    runner, started, db = _start(tmp_path)
    try:
        runner.send_signal(sig)
        runner.wait(timeout=120)
        wait_until(lambda: not any(_alive(pid) for pid in started), f"the commands to end after {sig.name}")
    finally:
        for pid in started:  # only when the test failed
            if _alive(pid):
                psutil.Process(pid).kill()
        if runner.poll() is None:
            runner.kill()
    if sig is signal.SIGINT:  # a drain: the rollouts go back to the queue for another runner
        assert runner.returncode == 0, (tmp_path / "runner.log").read_text()[-3000:]

        async def statuses() -> list[str]:
            store = agl.SqliteStore(db)
            try:
                return [r.status for r in await store.query_rollouts()]
            finally:
                await store.close()

        assert asyncio.run(statuses()) == ["queuing", "queuing"]


def test_a_command_that_cannot_run_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentlightning.cli", "runner", "--db", str(tmp_path / "s"), "--agent-command", "x y"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "'x' was not found on PATH" in done.stderr
