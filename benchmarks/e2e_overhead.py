"""Framework overhead per RL iteration: the quickstart through the full stack vs the same recipe as a bare loop.

Runs, one after the other on the same machine, ``benchmarks/bare_loop_calc.py`` (model, batched sampling and
``ppo_update`` in one process: no store, runner, proxy, HTTP or LangGraph) and ``examples/calc/train.py`` (LangGraph
agent in a runner process → adapter spans → proxy → local backend → SQLite store → transitions → LightningRL →
the same ``ppo_update``), each for ``--iterations`` iterations of 16 tasks × 8 samples, and prints seconds per
iteration of each and their ratio, then where the framework's iterations spent their time (the phases its
``metrics.jsonl`` records: waiting for rollouts, building the batch, the update, the weight sync, and how much of
it the backend was generating), for the first iteration and for the rest (the first one also pays each runner
slot's first HTTP client), the backend's admission groups (requests prefilled together) and decode-step rows, the
CPU seconds each run used (its processes and their children: on a shared machine the load-independent figure), and
the load average. Ends with one JSON line of all figures.

The framework trains one sample per episode (``--transition-mode trajectory``: the agent's calls merged, the
calculator's answer masked out), as the bare loop does; ``--transition-mode per_call`` measures the quickstart's
default recipe instead (one sample per LLM call: about 1.5x the samples and tokens in the update).

    .venv/bin/python benchmarks/e2e_overhead.py --iterations 10
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _last_json(output: str, what: str) -> dict[str, Any]:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{what} printed no JSON summary; its output ended with:\n{output[-2000:]}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], what: str) -> tuple[dict[str, Any], float]:
    """Run ``cmd``; its JSON summary and the CPU seconds it (and every process it waited for) used."""
    print(f"running {what}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    before = _children_cpu()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    return _last_json(done.stdout, what), _children_cpu() - before


PHASES = ("time_rollouts", "time_generating", "time_batch", "time_update", "time_sync")
BACKEND = ("backend_mean_batch", "backend_mean_rows", "backend_steps")


def phases(metrics_file: Path) -> dict[str, dict[str, float]]:
    """Mean seconds per phase of the run's training iterations: ``first`` iteration and the ``rest``."""
    rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    train = [row for row in rows if row.get("kind") == "train"]
    groups = {"first": train[:1], "rest": train[1:]}
    out: dict[str, dict[str, float]] = {}
    for name, group in groups.items():
        if group:
            out[name] = {
                "seconds": round(sum(float(r["seconds"]) for r in group) / len(group), 3),
                **{
                    p: round(sum(float(r["metrics"].get(p, 0.0)) for r in group) / len(group), 3)
                    for p in PHASES + BACKEND
                },
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runners", type=int, default=2, help="runner processes of the framework run")
    parser.add_argument("--transition-mode", choices=("trajectory", "per_call"), default="trajectory")
    args = parser.parse_args()
    common = ["--threads", str(args.threads)]
    load_before = os.getloadavg()[0]
    bare, bare_cpu = run(
        [
            sys.executable,
            "benchmarks/bare_loop_calc.py",
            "--iterations",
            str(args.iterations),
            "--seconds",
            "3600",
            "--eval-tasks",
            "8",
            *common,
        ],
        "bare loop",
    )
    framework, framework_cpu = run(
        [
            sys.executable,
            "examples/calc/train.py",
            "--iterations",
            str(args.iterations),
            "--minutes",
            "60",
            "--eval-size",
            "8",
            "--quiet",
            "--output",
            "runs/e2e-overhead",
            "--runners",
            str(args.runners),
            "--transition-mode",
            args.transition_mode,
            *common,
        ],
        "framework (quickstart)",
    )
    bare_s = float(bare["seconds_per_iteration"])
    framework_s = float(framework["seconds_per_iteration"])
    figures = {
        "iterations": args.iterations,
        "bare_seconds_per_iteration": bare_s,
        "bare_sample_seconds": bare.get("sample_seconds_per_iteration"),
        "bare_update_seconds": bare.get("update_seconds_per_iteration"),
        "framework_seconds_per_iteration": framework_s,
        "ratio": round(framework_s / bare_s, 2),
        "bare_reward_last5": bare.get("reward_last5"),
        "framework_reward_after": framework.get("reward_after"),
        "runners": args.runners,
        "transition_mode": args.transition_mode,
        "bare_cpu_seconds": round(bare_cpu, 1),
        "framework_cpu_seconds": round(framework_cpu, 1),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    framework_phases = phases(ROOT / "runs" / "e2e-overhead" / "metrics.jsonl")
    figures["framework_phases"] = framework_phases
    if "rest" in framework_phases:  # after the first iteration: the runner slots' HTTP clients are built
        figures["ratio_after_first"] = round(framework_phases["rest"]["seconds"] / bare_s, 2)
    print(f"{'':32}{'s/iteration':>12}")
    print(f"{'bare loop':32}{bare_s:>12.3f}")
    print(f"{'framework (LangGraph quickstart)':32}{framework_s:>12.3f}")
    print(f"{'ratio (target <= 1.5)':32}{figures['ratio']:>12.2f}")
    if "ratio_after_first" in figures:
        print(f"{'ratio after the first iteration':32}{figures['ratio_after_first']:>12.2f}")
    print(
        f"CPU seconds, whole run (startup and evaluations included): bare {bare_cpu:.1f}, framework "
        f"{framework_cpu:.1f} (trainer + runners); load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    print(f"framework phases, s/iteration: {'  '.join(p.removeprefix('time_') for p in PHASES)}")
    for name, row in framework_phases.items():
        print(f"  {name:6} {row['seconds']:7.3f} total  " + "  ".join(f"{row[p]:.3f}" for p in PHASES))
    print("backend: requests per admission group, rows per decode step, decode steps (per iteration)")
    for name, row in framework_phases.items():
        print(f"  {name:6} " + "  ".join(f"{row[p]:.1f}" for p in BACKEND))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
