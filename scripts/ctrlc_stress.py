"""Ctrl-C stress run of ``agl train``: SIGINT to its PID at varied moments, and how many runs stopped in time.

    python scripts/ctrlc_stress.py --tries 20 [--within 30] [--sigint default|ignored|alternate] [--load 1]

Each try starts ``agl train`` on the calculator (as ``tests/test_agl_train.py`` does: two runners, ``--max-tokens
24``), waits until both runners said they run and rollouts are claimed, then waits a varied delay (cycling through
``--delays``) and sends one SIGINT to ``agl train``'s PID (not its process group). A run that is still running
``--within`` seconds later counts as hung: every thread's stack (py-spy, when installed) and its signal masks are
written next to its log, then it and its children are killed. ``--load N`` runs N niced busy loops meanwhile (a busy
machine). ``--sigint ignored`` starts ``agl train`` with SIGINT ignored, as a script's background job (``cmd &``
without job control, ``nohup cmd &`` from a script) inherits it; ``default`` as a terminal starts it; ``alternate``
takes turns. Prints one line per try and a summary; a measurement, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"


def _command(out: Path) -> list[str]:
    return [
        sys.executable, "-m", "agentlightning.cli", "train",
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CALC / "checkpoint"),
        "--tasks", str(CALC / "data" / "train.jsonl"), "--iterations", "1000", "--runners", "2",
        "--tool-parser", "calc", "--output", str(out), "--tasks-per-iteration", "4", "--samples-per-task", "4",
        "--workers", "8", "--max-tokens", "24", "--quiet",
    ]  # fmt: skip


def _attempts(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
            return int(conn.execute("SELECT count(*) FROM attempts").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def _descendants(pid: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return []


def _dump(pid: int, path: Path) -> None:
    """Signal masks and every thread's stack of a process that did not stop."""
    lines = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Sig")]
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is not None:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=120)
        lines.append(dump.stdout + dump.stderr)
    path.write_text("\n".join(lines))


def _kill_all(pid: int, children: list[int]) -> None:
    for each in [pid, *children, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def one_try(folder: Path, delay: float, within: float, sigint: str) -> tuple[str, float | None, int | None]:
    """One run: started, SIGINT ``delay`` s after its rollouts are claimed; ``(outcome, seconds to stop, code)``."""
    folder.mkdir(parents=True, exist_ok=True)
    out, log = folder / "run", folder / "stderr.txt"
    disposition = signal.SIG_IGN if sigint == "ignored" else signal.SIG_DFL  # whatever this script inherited

    def inherit() -> None:
        signal.signal(signal.SIGINT, disposition)

    with log.open("w") as stderr:
        agl = subprocess.Popen(_command(out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=inherit)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 900
        while True:  # both runners said they run, and rollouts are claimed
            if agl.poll() is not None:
                return "exited-early", None, agl.returncode
            if time.monotonic() > deadline:
                return "never-started", None, None
            runners = [line for line in log.read_text().splitlines() if line.startswith("runner: ")]
            if len(runners) == 2 and _attempts(out / "store.db") > 0:
                break
            time.sleep(0.2)
        time.sleep(delay)  # the moment of the Ctrl-C: varied on purpose
        children = _descendants(agl.pid)
        sent = time.monotonic()
        agl.send_signal(signal.SIGINT)
        try:
            code = agl.wait(timeout=within)
        except subprocess.TimeoutExpired:
            _dump(agl.pid, folder / "hung.txt")
            return "hung", None, None
        return ("stopped" if code == 130 else f"exit-{code}"), time.monotonic() - sent, code
    finally:
        _kill_all(agl.pid, children)
        agl.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--within", type=float, default=30.0, help="seconds a run has to stop after its SIGINT")
    parser.add_argument("--delays", default="0,1,3,6,10,15", help="seconds after rollouts are claimed (cycled)")
    parser.add_argument("--sigint", choices=("default", "ignored", "alternate"), default="default")
    parser.add_argument("--load", type=int, default=0, help="niced busy-loop processes running meanwhile")
    parser.add_argument("--out", default="/tmp/agl-ctrlc-stress", help="a folder per try (logs, stacks of hangs)")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    burn = "import os\nos.nice(19)\nwhile True: pass"
    load = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(args.load)]
    stopped = 0
    try:
        for n in range(args.tries):
            delay = delays[n % len(delays)]
            sigint = args.sigint if args.sigint != "alternate" else ("default", "ignored")[n % 2]
            began = time.monotonic()
            outcome, seconds, code = one_try(root / f"try-{n:02d}", delay, args.within, sigint)
            stopped += outcome == "stopped"
            took = f"{seconds:5.1f} s" if seconds is not None else "   -  "
            print(
                f"try {n:2d}  SIGINT ({sigint:<7}) {delay:4.1f} s after claims: {outcome:<13} {took}  exit {code}  "
                f"({time.monotonic() - began:.0f} s in all)",
                flush=True,
            )
    finally:
        for process in load:
            process.kill()
            process.wait()
    print(f"{stopped}/{args.tries} stopped within {args.within:.0f} s (exit 130); stacks of hangs under {root}")


if __name__ == "__main__":
    main()
