"""Helpers started with `agentlightning.cli.start_child` end when their parent dies, ``kill -9`` included.

Real processes: a parent that starts ``agl store serve`` and ``agl runner`` on a SQLite file as a trainer does, a
real SIGKILL, and the children (and the runner's worker processes) waited for until they are gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning.store import RELEASED, SqliteStore
from agentlightning.testing import free_port, wait_until

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")

NEVER = agl.RetryPolicy(max_attempts=3, heartbeat_timeout=3600)  # a rollout back in the queue was released

AGENTS = """
import asyncio, time
import agentlightning as agl

@agl.rollout
async def stall_async(task):
    await asyncio.Event().wait()

@agl.rollout
def stall_sync(task):
    time.sleep(3600)
"""

PARENT = """
import sys
from agentlightning.cli import start_child

db, port, app_dir, agent, mode = sys.argv[1:]
agl = [sys.executable, "-m", "agentlightning.cli"]
runner = agl + ["runner", "--db", db, "--app-dir", app_dir, "--agent", agent, "--workers", "2", "--worker-mode", mode,
                "--no-instrument", "--poll-interval", "0.02"]
server = agl + ["store", "serve", "--db", db, "--port", port]
for cmd in (runner, server):
    start_child(cmd, start_new_session=True)  # own sessions, as agl train starts them: no signal reaches them
print("started", flush=True)
sys.stdin.read()  # until killed
"""


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()  # fields after the command name: state, ppid, ...


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")  # a zombie has ended; its reaper may be slow


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _holders(path: Path) -> list[int]:
    """Processes with ``path`` (or its WAL files) open."""
    holders: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            links = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if any(link.startswith(str(path)) for link in links):
            holders.append(int(entry))
    return holders


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("mode", "agent"), [("async", "stall_async"), ("process", "stall_sync")])
def test_children_end_when_their_parent_is_killed(tmp_path: Path, mode: str, agent: str) -> None:
    (tmp_path / "agents.py").write_text(AGENTS)
    (tmp_path / "parent.py").write_text(PARENT)
    db = tmp_path / "s.db"
    store = SqliteStore(db, NEVER)
    ids = [(asyncio.run(store.enqueue_rollout({"i": i}))).rollout_id for i in range(3)]
    port = free_port()
    args = [str(db), str(port), str(tmp_path), f"agents:{agent}", mode]
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), *args], stdin=subprocess.PIPE)
    children: set[int] = set()
    try:

        def two_running() -> bool:
            assert parent.poll() is None, "the parent exited"
            return asyncio.run(store.stats()).rollouts.get("running", 0) == 2

        wait_until(two_running, "the runner's two claims")
        children = _descendants(parent.pid)
        assert len(children) >= 2 + (2 if mode == "process" else 0)  # runner, server (and the worker processes)
        parent.kill()  # kill -9: nothing of the parent's own runs
        parent.wait()
        wait_until(lambda: not any(_alive(pid) for pid in children), "the parent's children to end")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in children:  # only if the test failed: do not leave them behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert set(_holders(db)) <= {os.getpid()}  # only this test's own store may still have the file open
    # the runner drained on its way out: its claims went back to the queue at once
    rollouts = asyncio.run(store.query_rollouts(rollout_ids=ids))
    assert [r.status for r in rollouts] == ["queuing"] * 3
    attempts = [a for rid in ids for a in asyncio.run(store.query_attempts(rid))]
    assert len(attempts) == 2 and all(a.status == "cancelled" and a.error == RELEASED for a in attempts)
    asyncio.run(store.close())


def test_orphan_that_ignores_sigterm_is_ended_after_the_grace(tmp_path: Path) -> None:
    child_code = (
        "import signal, sys, threading\n"
        "from agentlightning._lifeline import watch_parent\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "assert watch_parent(grace_s=0.5)\n"
        "threading.Event().wait()\n"
    )
    parent_code = (
        "import sys\n"
        "from agentlightning.cli import start_child\n"
        f"child = start_child([sys.executable, '-c', {child_code!r}])\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    wait_until(lambda: not _alive(child), "the orphan to end")


def test_without_a_lifeline_nothing_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentlightning._lifeline import LIFELINE_ENV, watch_parent

    monkeypatch.delenv(LIFELINE_ENV, raising=False)
    assert watch_parent() is False
    monkeypatch.setenv(LIFELINE_ENV, "not-a-number")
    assert watch_parent() is False
    assert LIFELINE_ENV not in os.environ  # not handed on to this process's own children


@pytest.mark.timeout(600)
def test_worker_processes_end_when_their_runner_is_killed(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(AGENTS)
    db = tmp_path / "s.db"
    store = SqliteStore(db, NEVER)
    ids = [(asyncio.run(store.enqueue_rollout({"i": i}))).rollout_id for i in range(3)]
    cmd = [sys.executable, "-m", "agentlightning.cli", "runner", "--db", str(db), "--app-dir", str(tmp_path)]
    cmd += ["--agent", "agents:stall_sync", "--workers", "2", "--worker-mode", "process", "--no-instrument"]
    runner = subprocess.Popen(cmd)
    workers: set[int] = set()
    try:
        wait_until(lambda: asyncio.run(store.stats()).rollouts.get("running", 0) == 2, "the workers' two claims")
        workers = _descendants(runner.pid)
        assert len(workers) >= 2
        runner.kill()  # the runner cannot stop its workers: they notice on their own
        runner.wait()
        wait_until(lambda: not any(_alive(pid) for pid in workers), "the worker processes to end")
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    # each worker gave its claim back on its way out
    attempts = [a for rid in ids for a in asyncio.run(store.query_attempts(rid))]
    assert len(attempts) == 2 and all(a.status == "cancelled" and a.error == RELEASED for a in attempts)
    asyncio.run(store.close())
