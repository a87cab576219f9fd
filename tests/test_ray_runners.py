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


@pytest.mark.timeout(600)
def test_agl_train_with_two_ray_runners_trains_and_reports_where_they_ran(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(_train_cmd(out, 2), cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    places = {int(index): (node, int(pid)) for index, node, pid, _ in PLACE.findall(done.stderr)}
    assert sorted(places) == [0, 1], done.stderr[-3000:]
    pids = {pid for _, pid in places.values()}
    assert len(pids) == 2
    assert [line for line in (out / "metrics.jsonl").read_text().splitlines() if line]  # two iterations reported
    ran = {int(worker.split(":")[1]) for _, worker, _ in _attempts(out / "store.db")}
    assert ran <= pids and ran, (ran, pids)  # every rollout ran in one of the Ray runners
    _no_rollout_twice(out / "store.db")
    counts = re.findall(r"ray runner (\d+): claimed (\d+) finished (\d+) failed (\d+)", done.stderr)
    assert sorted(int(index) for index, *_ in counts) == [0, 1], done.stderr[-3000:]
    finished = sum(int(f) for _, _, f, _ in counts)
    assert finished == sum(1 for *_, status in _attempts(out / "store.db") if status == "succeeded")
    for pid in pids:  # stopped when training ended
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    # each runner's output reaches the trainer's, named by runner (not through Ray's own log files), and its log file
    for index in (0, 1):
        assert re.search(rf"^ray runner {index} \| runner: \d+ async worker", done.stderr, re.M), done.stderr[-3000:]
        assert "async worker" in (out / "runners" / f"ray-runner-{index}.log").read_text()
    assert not re.search(r"_RunnerActor.*async worker", done.stderr)
    # after each iteration, every runner's counts so far
    iterations = re.findall(r"^it +(\d+) runners: (.*)$", done.stderr, re.M)
    assert [int(i) for i, _ in iterations] == [1, 2], done.stderr[-3000:]
    assert all(
        re.search(r"ray runner \d \(\S+:\d+\) claimed \d+ finished \d+ failed \d+", line) for _, line in iterations
    )


@pytest.mark.timeout(600)
def test_a_ray_runner_killed_mid_iteration_is_restarted_and_nothing_is_recorded_twice(tmp_path: Path) -> None:
    """SIGKILL of one runner actor while it runs an attempt: Ray restarts it, and the restarted runner claims work.

    The run is long (the test stops it with Ctrl-C once the restarted runner has claimed an attempt): a short run
    could end on the surviving runner before Ray brought the other back on a busy machine.
    """
    out = tmp_path / "run"
    trainer = subprocess.Popen(
        _train_cmd(out, 1000), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    placed = threading.Event()

    def read() -> None:
        assert trainer.stderr is not None
        for line in trainer.stderr:
            lines.append(line)
            if len(PLACE.findall("".join(lines))) >= 2:
                placed.set()

    readers = [threading.Thread(target=read, daemon=True), threading.Thread(target=trainer.stdout.read, daemon=True)]  # type: ignore[union-attr]
    for reader in readers:
        reader.start()
    db = out / "store.db"
    try:
        assert placed.wait(300), "".join(lines)[-3000:]
        first = {int(i): (int(pid), int(actor)) for i, _, pid, actor in PLACE.findall("".join(lines))}
        victim_pid, victim_actor = first[0]
        _poll(trainer, lines, lambda: any(s == "running" and w and _pid(w) == victim_pid for _, w, s in _attempts(db)))
        os.kill(victim_actor, signal.SIGKILL)
        started = {pid for pid, _ in first.values()}
        # Ray restarts the actor: a runner process that is neither of the first two claims an attempt
        _poll(trainer, lines, lambda: bool({_pid(w) for _, w, _ in _attempts(db) if w} - started))
        trainer.send_signal(signal.SIGINT)  # Ctrl-C: the run stops, and with it every runner
        trainer.wait(timeout=240)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    for reader in readers:
        reader.join(timeout=30)
    log = "".join(lines)
    assert trainer.returncode == 130, log[-3000:]
    _no_rollout_twice(db)
    for pid in {_pid(w) for _, w, _ in _attempts(db) if w}:  # every runner process is gone
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
