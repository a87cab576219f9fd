"""``agl runner --processes N``: runner processes forked after one import, supervised by the process that forked them.

Real processes on a real SQLite file: the rollouts run in N forked runners (not in the supervisor), a stop reaches
each runner once however it is sent (to the supervisor, or to its process group as a trainer's `stop_children` does),
a runner that dies stops the rest and the supervisor exits with its code, and a ``kill -9`` of the supervisor or of
its parent stops every runner, their claims released.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning.cli import start_child, stop_children
from agentlightning.cli._fork import shares
from agentlightning.store import RELEASED, SqliteStore
from agentlightning.testing import wait_until

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")

NEVER = agl.RetryPolicy(max_attempts=3, heartbeat_timeout=3600)  # a rollout back in the queue was released
AGL = [sys.executable, "-m", "agentlightning.cli"]

AGENTS = """
import asyncio, os, pathlib
import agentlightning as agl

HERE = pathlib.Path(__file__).parent

def _log(name):
    with open(HERE / name, "a") as log:
        log.write(f"{os.getpid()}\\n")

@agl.rollout
async def done(task):
    _log("done.log")
    return 1.0

@agl.rollout
async def stall(task):
    _log("started.log")
    await asyncio.Event().wait()

@agl.rollout
async def until_go(task):
    _log("started.log")
    while not (HERE / "go").exists():  # the test creates it once it has stopped the runners
        await asyncio.sleep(0.02)
    return 1.0

@agl.rollout
async def dies_or_stalls(task):
    _log("started.log")
    if task["die"]:
        os._exit(3)
    await asyncio.Event().wait()
"""

THREADED = """
import threading
import agentlightning as agl

threading.Thread(target=threading.Event().wait, name="left-by-import", daemon=True).start()

@agl.rollout
async def done(task):
    return 1.0
"""

PARENT = """
import sys
from agentlightning.cli import start_child

start_child(sys.argv[1:], start_new_session=True)
print("started", flush=True)
sys.stdin.read()  # until killed
"""


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return text[text.rindex(")") + 2 :].split()[0] not in ("Z", "X")  # a zombie has ended; its reaper may be slow


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _runner(tmp_path: Path, agent: str, *extra: str) -> list[str]:
    cmd = [*AGL, "runner", "--db", str(tmp_path / "s.db"), "--app-dir", str(tmp_path), "--agent", f"agents:{agent}"]
    return [*cmd, "--workers", "2", "--processes", "2", "--no-instrument", "--poll-interval", "0.02", *extra]


def _setup(tmp_path: Path, tasks: list[dict[str, object]]) -> tuple[SqliteStore, list[str]]:
    (tmp_path / "agents.py").write_text(AGENTS)
    store = SqliteStore(tmp_path / "s.db", NEVER)
    return store, [asyncio.run(store.enqueue_rollout(task)).rollout_id for task in tasks]


def _running(
    store: SqliteStore, process: subprocess.Popen[bytes] | subprocess.Popen[str], log: Path
) -> Callable[[], bool]:
    """Two claims running, and their agents started (a claim runs in the store before its agent starts)."""

    def check() -> bool:
        assert process.poll() is None, "the supervisor exited"
        return asyncio.run(store.stats()).rollouts.get("running", 0) == 2 and len(_pids(log)) == 2

    return check


def _assert_released(store: SqliteStore, ids: list[str], released: int) -> None:
    rollouts = asyncio.run(store.query_rollouts(rollout_ids=ids))
    assert [r.status for r in rollouts] == ["queuing"] * len(ids)
    attempts = [a for rid in ids for a in asyncio.run(store.query_attempts(rid))]
    assert len(attempts) == released and all(a.status == "cancelled" and a.error == RELEASED for a in attempts)


def _kill_left(pids: list[int]) -> None:
    for pid in pids:  # only if the test failed: do not leave them behind
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_shares_split_the_workers_evenly_each_at_least_one() -> None:
    assert shares(128, 2) == [64, 64]
    assert shares(5, 2) == [3, 2]
    assert shares(1, 3) == [1, 1, 1]


@pytest.mark.timeout(300)
def test_forked_runners_run_the_rollouts_and_drain_on_sigterm(tmp_path: Path) -> None:
    store, ids = _setup(tmp_path, [{"i": i} for i in range(3)])
    supervisor = subprocess.Popen(_runner(tmp_path, "stall"))
    runners: list[int] = []
    try:
        wait_until(_running(store, supervisor, tmp_path / "started.log"), "two claims")
        runners = _pids(tmp_path / "started.log")
        # two runner processes, one claim each, neither of them the supervisor
        assert len(set(runners)) == 2 and supervisor.pid not in runners
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(120) == 0
        assert not any(_alive(pid) for pid in runners)  # the supervisor waited for its runners
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        _kill_left(runners)
    _assert_released(store, ids, released=2)
    asyncio.run(store.close())


@pytest.mark.timeout(300)
def test_forked_runners_share_the_rollouts(tmp_path: Path) -> None:
    store, ids = _setup(tmp_path, [{"i": i} for i in range(40)])
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        supervisor = subprocess.Popen(_runner(tmp_path, "done"), stderr=stderr)
    try:
        finished = asyncio.run(store.wait_for_rollouts(ids, timeout=240))
        assert [r.status for r in finished] == ["succeeded"] * len(ids)
        pids = _pids(tmp_path / "done.log")
        assert len(pids) == len(ids) and supervisor.pid not in pids and len(set(pids)) <= 2
        wait_until(lambda: log.read_text().count("runner: 1 async worker(s)") == 2, "both runners to start")
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(120)
    assert supervisor.returncode == 0, log.read_text()
    asyncio.run(store.close())


@pytest.mark.timeout(300)
def test_a_stop_to_the_supervisors_group_reaches_each_runner_once(tmp_path: Path) -> None:
    # As a trainer stops its runners (`stop_children`: SIGTERM to the supervisor's process group). A runner that got
    # the signal twice (from the group and again from the supervisor) would release its rollout at once instead of
    # letting it finish within the drain timeout.
    store, ids = _setup(tmp_path, [{"i": i} for i in range(2)])
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        cmd = _runner(tmp_path, "until_go", "--drain-timeout", "600", "--log-level", "info")
        supervisor = start_child(cmd, start_new_session=True, stderr=stderr)
    runners: list[int] = []
    try:
        wait_until(_running(store, supervisor, tmp_path / "started.log"), "two claims")
        runners = _pids(tmp_path / "started.log")
        # the runners' own process group: a signal to the supervisor's group reaches them only through it
        groups = {os.getpgid(pid) for pid in runners}
        assert len(groups) == 1 and os.getpgid(supervisor.pid) not in groups
        stopping = threading.Thread(target=stop_children, args=([supervisor],))
        stopping.start()  # waits for the supervisor, which waits for its runners
        wait_until(lambda: log.read_text().count("SIGTERM: draining") == 2, "both runners to start draining")
        (tmp_path / "go").touch()  # now the agents may finish their rollouts, within the drain timeout
        stopping.join()
        assert supervisor.returncode == 0
    finally:
        _kill_left([supervisor.pid, *runners])
    assert "WARNING" not in log.read_text()  # a second signal is warned about
    rollouts = asyncio.run(store.query_rollouts(rollout_ids=ids))
    assert [r.status for r in rollouts] == ["succeeded"] * 2
    asyncio.run(store.close())


@pytest.mark.timeout(300)
def test_a_runner_that_dies_stops_the_others_and_the_supervisor_exits_with_its_code(tmp_path: Path) -> None:
    store, ids = _setup(tmp_path, [{"die": False}, {"die": True}])
    supervisor = subprocess.Popen(_runner(tmp_path, "dies_or_stalls", "--workers", "2"))
    try:
        assert supervisor.wait(240) == 3
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    runners = _pids(tmp_path / "started.log")
    assert not any(_alive(pid) for pid in runners)
    rollouts = {r.rollout_id: r for r in asyncio.run(store.query_rollouts(rollout_ids=ids))}
    assert rollouts[ids[0]].status == "queuing"  # the stalled one: released by the runner that was stopped
    asyncio.run(store.close())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("killed", ["supervisor", "parent"])
def test_a_kill_9_of_the_supervisor_or_its_parent_stops_every_runner(tmp_path: Path, killed: str) -> None:
    store, ids = _setup(tmp_path, [{"i": i} for i in range(3)])
    (tmp_path / "parent.py").write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py"), *_runner(tmp_path, "stall")], stdin=subprocess.PIPE
    )
    runners: list[int] = []
    try:
        wait_until(_running(store, parent, tmp_path / "started.log"), "two claims")
        runners = _pids(tmp_path / "started.log")
        supervisors = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in runners}
        assert len(supervisors) == 1 and parent.pid not in supervisors
        victim = parent.pid if killed == "parent" else supervisors.pop()
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: not any(_alive(pid) for pid in runners), "the runners to end")
    finally:
        parent.kill()
        parent.wait()
        _kill_left(runners)
    _assert_released(store, ids, released=2)  # each runner drained on its way out
    asyncio.run(store.close())


@pytest.mark.timeout(300)
def test_an_agent_whose_import_starts_threads_gets_fresh_runner_processes(tmp_path: Path) -> None:
    (tmp_path / "threaded.py").write_text(THREADED)
    store = SqliteStore(tmp_path / "s.db", NEVER)
    ids = [asyncio.run(store.enqueue_rollout({"i": i})).rollout_id for i in range(4)]
    cmd = [*AGL, "runner", "--db", str(tmp_path / "s.db"), "--app-dir", str(tmp_path), "--agent", "threaded:done"]
    cmd += ["--workers", "2", "--processes", "2", "--no-instrument", "--poll-interval", "0.02"]
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        supervisor = subprocess.Popen(cmd, stderr=stderr)
    try:
        finished = asyncio.run(store.wait_for_rollouts(ids, timeout=240))
        assert [r.status for r in finished] == ["succeeded"] * len(ids)
        # both runners up (one may have run every rollout while the other still started): then stop them
        wait_until(lambda: log.read_text().count("runner: 1 async worker(s)") == 2, "both runners to start")
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(120)
    err = log.read_text()
    assert supervisor.returncode == 0, err
    assert "runners start as fresh processes" in err and "left-by-import" in err
    asyncio.run(store.close())
