"""``agl train --runners ray``: the calculator agent's runners as Ray actors (a real Ray head started by the trainer).

The trainer prints where each runner ran (``ray runner I: node ... pid ... actor ...``); the store's attempts carry
the runner process's pid in their worker id, so the test sees which runner ran which rollout.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")
pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
SMALL = ["--tasks-per-iteration", "4", "--samples-per-task", "4", "--workers", "8", "--max-tokens", "24", "--quiet"]
PLACE = re.compile(r"ray runner (\d+): node (\w+) host \S+ pid (\d+) actor (\d+)")


def _train_cmd(out: Path, iterations: int) -> list[str]:
    return [
        sys.executable, "-m", "agentlightning.cli", "train", "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC),
        "--model", str(CALC / "checkpoint"), "--tasks", str(CALC / "data" / "train.jsonl"), "--tool-parser", "calc",
        "--iterations", str(iterations), "--runners", "ray", "--runner-processes", "2", "--runner-cpus", "0.5",
        "--lr", "3e-4", "--output", str(out), "--heartbeat-timeout", "5", *SMALL,
    ]  # fmt: skip


def _attempts(db: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT rollout_id, worker_id, status FROM attempts").fetchall()


def _no_rollout_twice(db: Path) -> None:
    succeeded = [rollout for rollout, _, status in _attempts(db) if status == "succeeded"]
    assert succeeded and len(succeeded) == len(set(succeeded)), "a rollout was recorded twice"


class _Run:
    """``agl train`` with two Ray runners for as many iterations as the test wants: started long (1000 iterations) and
    stopped with Ctrl-C once what the test waits for has happened, so no check depends on how fast a busy machine
    brings up the second runner. Its stderr is collected in `lines` as it comes."""

    def __init__(self, out: Path) -> None:
        self.out, self.db = out, out / "store.db"
        self.trainer = subprocess.Popen(
            _train_cmd(out, 1000), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.placed = threading.Event()
        self.readers = [threading.Thread(target=self._read, daemon=True)]
        self.readers.append(threading.Thread(target=self.trainer.stdout.read, daemon=True))  # type: ignore[union-attr]
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.trainer.stderr is not None
        for line in self.trainer.stderr:
            self.lines.append(line)
            if len(PLACE.findall(self.log)) >= 2:
                self.placed.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def poll(self, done: Callable[[], bool]) -> None:
        _poll(self.trainer, self.lines, done)

    def stop(self) -> None:
        """Ctrl-C, and the trainer's end (killed, with its process group, if it outlives the test)."""
        try:
            if self.trainer.poll() is None:
                self.trainer.send_signal(signal.SIGINT)  # Ctrl-C: the run stops, and with it every runner
                self.trainer.wait(timeout=240)
        finally:
            if self.trainer.poll() is None:
                os.killpg(self.trainer.pid, signal.SIGKILL)
                self.trainer.wait()
            for reader in self.readers:
                reader.join(timeout=30)


def _runner_pids(db: Path, status: str | None = None) -> set[int]:
    """The runner processes with an attempt in the store (of ``status``, if given)."""
    return {_pid(w) for _, w, s in _attempts(db) if w and (status is None or s == status)}


@pytest.mark.timeout(600)
def test_agl_train_with_two_ray_runners_trains_and_reports_where_they_ran(tmp_path: Path) -> None:
    run = _Run(tmp_path / "run")
    try:
        assert run.placed.wait(300), run.log[-3000:]
        places = {int(index): (node, int(pid)) for index, node, pid, _ in PLACE.findall(run.log)}
        pids = {pid for _, pid in places.values()}
        # the event: each runner has finished an attempt, its output reached the trainer's, two iterations ended
        run.poll(
            lambda: (
                _runner_pids(run.db, "succeeded") == pids
                and all(re.search(rf"^ray runner {i} \| runner: \d+ async worker", run.log, re.M) for i in (0, 1))
                and len(re.findall(r"^it +\d+ runners: ", run.log, re.M)) >= 2
            )
        )
    finally:
        run.stop()
    log = run.log
    assert run.trainer.returncode == 130, log[-3000:]
    assert sorted(places) == [0, 1] and len(pids) == 2, log[-3000:]
    assert len([line for line in (run.out / "metrics.jsonl").read_text().splitlines() if line]) >= 2
    assert _runner_pids(run.db) == pids  # every rollout ran in one of the Ray runners
    _no_rollout_twice(run.db)
    counts = re.findall(r"ray runner (\d+): claimed (\d+) finished (\d+) failed (\d+)", log)
    assert sorted(int(index) for index, *_ in counts) == [0, 1], log[-3000:]
    finished = sum(int(f) for _, _, f, _ in counts)
    assert finished == sum(1 for *_, status in _attempts(run.db) if status == "succeeded")
    for pid in pids:  # stopped when training ended
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    # each runner's output reaches the trainer's, named by runner (not through Ray's own log files), and its log file
    for index in (0, 1):
        assert "async worker" in (run.out / "runners" / f"ray-runner-{index}.log").read_text()
    assert not re.search(r"_RunnerActor.*async worker", log)
    # after each iteration, every runner's counts so far
    iterations = re.findall(r"^it +(\d+) runners: (.*)$", log, re.M)
    assert [int(i) for i, _ in iterations] == list(range(1, len(iterations) + 1)), log[-3000:]
    assert all(
        re.search(r"ray runner \d \(\S+:\d+\) claimed \d+ finished \d+ failed \d+", line) for _, line in iterations
    )


@pytest.mark.timeout(600)
def test_a_ray_runner_killed_mid_iteration_is_restarted_and_nothing_is_recorded_twice(tmp_path: Path) -> None:
    """SIGKILL of one runner actor while it runs an attempt: Ray restarts it, and the restarted runner claims work.

    The run is long (the test stops it with Ctrl-C once the restarted runner has claimed an attempt): a short run
    could end on the surviving runner before Ray brought the other back on a busy machine.
    """
    run = _Run(tmp_path / "run")
    try:
        assert run.placed.wait(300), run.log[-3000:]
        first = {int(i): (int(pid), int(actor)) for i, _, pid, actor in PLACE.findall(run.log)}
        victim_pid, victim_actor = first[0]
        run.poll(lambda: any(s == "running" and w and _pid(w) == victim_pid for _, w, s in _attempts(run.db)))
        os.kill(victim_actor, signal.SIGKILL)
        started = {pid for pid, _ in first.values()}
        # Ray restarts the actor: a runner process that is neither of the first two claims an attempt
        run.poll(lambda: bool(_runner_pids(run.db) - started))
    finally:
        run.stop()
    assert run.trainer.returncode == 130, run.log[-3000:]
    _no_rollout_twice(run.db)
    for pid in _runner_pids(run.db):  # every runner process is gone
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def _pid(worker_id: str) -> int:
    return int(worker_id.split(":")[1])


def _poll(trainer: subprocess.Popen[str], lines: list[str], done: Callable[[], bool]) -> None:
    """Wait until ``done()`` (polled on the store every 0.1 s; bounded at 300 s), the trainer still running."""
    for _ in range(3000):
        if done():
            return
        assert trainer.poll() is None, "".join(lines)[-3000:]
        threading.Event().wait(0.1)
    raise AssertionError(f"waited 300 s in vain; the trainer's log ends: {''.join(lines)[-2000:]}")
