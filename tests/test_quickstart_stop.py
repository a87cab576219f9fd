"""The quickstart (``examples/calc/train.py``) stopped mid-run: a ``kill`` (SIGTERM) ends it through its cleanup with
one clean line and none of its runner processes left.

A ``kill -9`` of it is not run here: its runners end on their lifeline, started by the same run kit (`RunSettings`,
the same checkpoint, agent and two runner processes) as ``agl train``'s, whose ``kill -9`` test
(``tests/test_agl_train.py::test_killed_agl_train_leaves_no_process_behind``) checks that no process is left."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")
psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "calc" / "train.py"
TOY = ["--tasks-per-iteration", "4", "--samples-per-task", "4", "--workers", "8", "--eval-size", "4", "--quiet"]


def _children(pid: int) -> list[int]:
    """The process's descendants (its runners and anything they started)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _attempts(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
            return int(conn.execute("SELECT count(*) FROM attempts").fetchone()[0])
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


def _start_quickstart(out: Path, log: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A long quickstart run, once both runners said they run and rollouts are claimed; with its children.

    Its stderr goes to the file ``log``, not a pipe: the runners inherit it, and a pipe would stay open while any of
    them lives.
    """
    cmd = [sys.executable, str(TRAIN), "--iterations", "1000", "--minutes", "600", "--runners", "2", *TOY]
    cmd += ["--output", str(out), "--no-dashboard"]
    with log.open("w") as stderr:
        trainer = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)

    def started() -> bool:  # both runners printed their line, the evaluation before RL is done, rollouts run
        lines = log.read_text().splitlines()
        runners = [line for line in lines if line.startswith("runner: ")]
        evaluated = any(" before RL: " in line for line in lines)  # the run's last line before it goes quiet
        return len(runners) == 2 and evaluated and _attempts(out / "store.db") > 0

    deadline = time.monotonic() + 600  # bounds a hang only: the loop ends when the runners run
    try:
        while len(children := _children(trainer.pid)) < 2 or not started():
            assert trainer.poll() is None, f"train.py exited with code {trainer.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "train.py never started its runner processes"
            time.sleep(0.2)
    except BaseException:
        trainer.kill()
        trainer.wait()
        raise
    return trainer, children


@pytest.mark.timeout(900)
def test_terminated_quickstart_stops_its_runners_and_says_one_line(tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    trainer, children = _start_quickstart(tmp_path / "run", log)
    try:
        before = log.stat().st_size  # what it printed while it ran
        trainer.send_signal(signal.SIGTERM)  # what a `kill` does
        trainer.wait(timeout=120)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    left = [pid for pid in children if _alive(pid)]
    for pid in left:  # only when the test fails: do not leave them claiming rollouts
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    printed = log.read_bytes()  # bytes: ``before`` counts bytes, and the progress bars print multi-byte characters
    assert trainer.returncode == 143, printed.decode()[-3000:]
    assert left == [], f"runner processes left running after train.py exited: {left}"
    # a clean stop says one line: no traceback, no "Task exception was never retrieved", no runner's complaint
    assert printed[before:].decode().split() == ["terminated"], printed.decode()[-3000:]
