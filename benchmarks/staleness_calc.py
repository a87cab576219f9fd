"""Held-out accuracy per wall-clock second of RL at staleness bounds k = 0, 1, 2, 4: the real calc toy run.

Runs ``examples/calc/train.py`` (the toy model, the LangGraph agent, the embedded backend) once per (k, seed), the
same iterations and samples for every k, the runs of one seed back to back so the machine's load is alike within a
seed. Reports per k: the held-out greedy accuracy after the budget (mean over seeds, and each), the seconds of RL,
and accuracy per RL minute; the ratios are against k = 0 in the same run. On a 2-core CPU the update and the
generation share the cores, so overlap gains little there: the figure says which wins here, whichever it is
(`benchmarks/async_pipeline.py` measures the pipeline itself with fixed simulated costs).

    .venv/bin/python benchmarks/staleness_calc.py --iterations 8 --seeds 0 1 2 --ks 0 1 2 4

Prints a table, then one JSON line with every figure and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "calc" / "train.py"


def run_once(k: int, seed: int, args: argparse.Namespace, output: Path) -> dict[str, Any]:
    """One training run; its summary (the JSON line ``train.py`` ends with)."""
    command = [sys.executable, str(TRAIN), "--max-staleness", str(k), "--seed", str(seed)]
    command += ["--iterations", str(args.iterations), "--eval-size", str(args.eval_size), "--quiet"]
    command += ["--output", str(output / f"k{k}-s{seed}")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"k={k} seed={seed}: train.py exited {done.returncode}: {' | '.join(tail)}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4], help="staleness bounds (first: baseline)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=8, help="RL iterations of every run (same samples)")
    parser.add_argument("--eval-size", type=int, default=64, help="held-out tasks")
    args = parser.parse_args()
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in args.ks}
    with tempfile.TemporaryDirectory(prefix="staleness-calc-") as tmp:
        for seed in args.seeds:
            for k in args.ks:
                summary = run_once(k, seed, args, Path(tmp))
                runs[k].append(summary)
                print(f"k={k} seed={seed}: held-out {summary['greedy_after']:.2f} in {summary['rl_seconds']:.1f} s")
    figures: dict[str, Any] = {"iterations": args.iterations, "eval_size": args.eval_size, "seeds": args.seeds}
    print(f"\n{'k':>3} {'held-out (mean)':>16} {'per seed':>20} {'RL s (mean)':>12} {'acc/min':>9} {'ratio':>7}")
    base: float | None = None
    for k in args.ks:
        accuracy = statistics.mean(r["greedy_after"] for r in runs[k])
        seconds = statistics.mean(r["rl_seconds"] for r in runs[k])
        per_minute = accuracy / (seconds / 60) if seconds > 0 else 0.0
        base = per_minute if base is None else base
        ratio = per_minute / base if base else 0.0
        seeds = " ".join(f"{r['greedy_after']:.2f}" for r in runs[k])
        print(f"{k:>3} {accuracy:>16.3f} {seeds:>20} {seconds:>12.1f} {per_minute:>9.3f} {ratio:>6.2f}x")
        figures[f"k{k}"] = {
            "accuracy_mean": round(accuracy, 4),
            "accuracy": [r["greedy_after"] for r in runs[k]],
            "rl_seconds_mean": round(seconds, 2),
            "accuracy_per_minute": round(per_minute, 4),
            "ratio_vs_k0": round(ratio, 3),
        }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
