"""Rollouts/s of the calculator agent with N runner processes placed by Ray vs N ``agl runner`` started by hand.

    python benchmarks/ray_runners_bench.py [--counts 1,2,4] [--iterations 3] [--no-local]

Per count N, three ``agl train`` runs (toy model, 8 tasks x 4 samples per iteration, 8 concurrent rollouts per
runner process), each serving its store on loopback (``--serve-store``) so that every runner talks to it over HTTP:

- ``ray``: ``--runners ray --runner-processes N --runner-cpus 0.1`` (a Ray head started by the trainer);
- ``hand``: ``--runners 0`` and N ``agl runner --store-url ...`` processes this script starts, as
  docs/several-machines.md shows for runners on other machines;
- ``local`` (unless ``--no-local``): ``agl train``'s own ``--runners N`` (one ``agl runner --processes N``).

Rollouts/s is the store's succeeded attempts over the run's RL seconds (its summary line). Prints a table and, last,
one JSON object with every figure and the ratios Ray/hand per count.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
AGL = [sys.executable, "-m", "agentlightning.cli"]
WORKERS = 8  # concurrent rollouts per runner process, in every mode


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _train_cmd(out: Path, port: int, iterations: int, runners: list[str]) -> list[str]:
    return [
        *AGL, "train", "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CALC / "checkpoint"),
        "--tasks", str(CALC / "data" / "train.jsonl"), "--tool-parser", "calc", "--iterations", str(iterations),
        "--output", str(out), "--tasks-per-iteration", "8", "--samples-per-task", "4", "--workers", str(WORKERS),
        "--max-tokens", "24", "--quiet", "--serve-store", f"127.0.0.1:{port}", *runners,
    ]  # fmt: skip


def _hand_runners(port: int, count: int, env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """``count`` ``agl runner`` processes against the trainer's served store, as a user starts them by hand."""
    cmd = [
        *AGL, "runner", "--store-url", f"http://127.0.0.1:{port}", "--app-dir", str(CALC),
        "--agent", "calc_agent:calc_agent", "--workers", str(WORKERS),
    ]  # fmt: skip
    return [
        subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(count)
    ]


def run(mode: str, count: int, iterations: int, out: Path) -> float:
    """One ``agl train`` run; returns its rollouts/s."""
    port = _free_port()
    env = {**os.environ, "AGL_STORE_TOKEN": secrets.token_urlsafe(24), "OMP_NUM_THREADS": "1"}
    runners = {
        "ray": ["--runners", "ray", "--runner-processes", str(count), "--runner-cpus", "0.1"],
        "hand": ["--runners", "0"],
        "local": ["--runners", str(count)],
    }[mode]
    trainer = subprocess.Popen(
        _train_cmd(out, port, iterations, runners), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    # agl runner retries until the store answers: started now, they are ready when the model has loaded
    hand = _hand_runners(port, count, env) if mode == "hand" else []
    try:
        stdout, stderr = trainer.communicate(timeout=1800)
    finally:
        for process in hand:  # SIGTERM: a runner drains and exits
            process.send_signal(signal.SIGTERM)
        for process in hand:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    if trainer.returncode != 0:
        raise SystemExit(f"agl train failed ({mode}, {count}): {stderr[-2000:]}")
    summary = json.loads(stdout.strip().splitlines()[-1])
    with sqlite3.connect(out / "store.db") as conn:
        (succeeded,) = conn.execute("SELECT count(*) FROM attempts WHERE status = 'succeeded'").fetchone()
    return succeeded / float(summary["rl_seconds"])


def _run_retried(mode: str, count: int, iterations: int, out: Path, tries: int = 3) -> float:
    """`run`, again after a failure (on a loaded machine a Ray head can time out while it starts: Ray waits 30 s)."""
    for attempt in range(1, tries + 1):
        try:
            return run(mode, count, iterations, out.with_name(f"{out.name}-{attempt}"))
        except SystemExit as failure:
            if attempt == tries:
                raise
            print(f"retrying {mode} {count}: {str(failure).strip().splitlines()[-1]}", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--no-local", action="store_true", help="skip agl train's own local runners")
    args = parser.parse_args()
    modes = ["ray", "hand"] + ([] if args.no_local else ["local"])
    figures: dict[str, float] = {}
    header = f"{'runners':>7}  " + "  ".join(f"{m + ' rollouts/s':>17}" for m in modes) + f"  {'ray/hand':>8}"
    print(header, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(c) for c in args.counts.split(",")]:
            for mode in modes:
                figures[f"{mode}_{n}"] = round(_run_retried(mode, n, args.iterations, Path(tmp) / f"{mode}{n}"), 2)
            figures[f"ratio_ray_hand_{n}"] = round(figures[f"ray_{n}"] / figures[f"hand_{n}"], 3)
            cells = "  ".join(f"{figures[f'{m}_{n}']:17.2f}" for m in modes)
            print(f"{n:7d}  {cells}  {figures[f'ratio_ray_hand_{n}']:8.3f}", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
