"""Rollouts/s of the calculator agent under ``agl train`` with N runner processes placed by Ray vs N local ones.

    python benchmarks/ray_runners_bench.py [--counts 1,2,4] [--iterations 3]

Each configuration is one ``agl train`` run (toy model, small batches); rollouts/s is the store's succeeded attempts
over the run's RL seconds (its summary line). Prints a table and, last, one JSON object with every figure and the
ratio Ray/local per count.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"


def run(runners: list[str], iterations: int, out: Path) -> float:
    cmd = [
        sys.executable, "-m", "agentlightning.cli", "train", "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC),
        "--model", str(CALC / "checkpoint"), "--tasks", str(CALC / "data" / "train.jsonl"), "--tool-parser", "calc",
        "--iterations", str(iterations), "--output", str(out), "--tasks-per-iteration", "8", "--samples-per-task", "4",
        "--workers", "8", "--max-tokens", "24", "--quiet", *runners,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"agl train failed ({' '.join(runners)}): {done.stderr[-2000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    with sqlite3.connect(out / "store.db") as conn:
        (succeeded,) = conn.execute("SELECT count(*) FROM attempts WHERE status = 'succeeded'").fetchone()
    return succeeded / float(summary["rl_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(c) for c in args.counts.split(",")]:
            local = run(["--runners", str(n)], args.iterations, Path(tmp) / f"local{n}")
            ray = run(["--runners", "ray", "--runner-processes", str(n), "--runner-cpus", "0.1"], args.iterations,
                      Path(tmp) / f"ray{n}")  # fmt: skip
            figures[f"local_{n}"], figures[f"ray_{n}"] = round(local, 2), round(ray, 2)
            figures[f"ratio_{n}"] = round(ray / local, 3)
            ratio = ray / local
            print(f"{n} runner(s): local {local:7.2f} rollouts/s   ray {ray:7.2f} rollouts/s   ray/local {ratio:.3f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
