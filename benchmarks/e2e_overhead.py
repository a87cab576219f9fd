"""Framework overhead per RL iteration: the quickstart through the full stack vs the same recipe as a bare loop.

Runs, one after the other on the same machine, ``benchmarks/bare_loop_calc.py`` (model, batched sampling and
``ppo_update`` in one process: no store, runner, proxy, HTTP or LangGraph) and ``examples/calc/train.py`` (LangGraph
agent in a runner process → adapter spans → proxy → local backend → SQLite store → transitions → LightningRL →
the same ``ppo_update``), each for ``--iterations`` iterations of 16 tasks × 8 samples, and prints seconds per
iteration of each and their ratio, then where the framework's iterations spent their time (the phases its
``metrics.jsonl`` records: waiting for rollouts, building the batch, the update, the weight sync, and how much of
it the backend was generating, in wall time and in its generation thread's CPU, next to the bare loop's sampling
CPU), for the first iteration and for the rest (the first one also pays each runner
slot's first HTTP client), the backend's admission groups (requests prefilled together) and decode-step rows, the
CPU seconds each run used (its processes and their children: on a shared machine the load-independent figure), and
the load average. Ends with one JSON line of all figures.

The framework trains one sample per episode (``--transition-mode trajectory``: the agent's calls merged, the
calculator's answer masked out), as the bare loop does; ``--transition-mode per_call`` measures the quickstart's
default recipe instead (one sample per LLM call: about 1.5x the samples and tokens in the update).

The framework runs once per agent (``--agent``): ``openai``, the calculator agent as plain OpenAI SDK calls
(``calc_openai_agent.py``: the framework's own overhead, with only the openai client's CPU on the agent side), and
``langgraph``, the quickstart's LangGraph graph (``calc_agent.py``: the same calls, plus LangGraph's and
langchain's CPU per episode, which the bare loop does not have). Each run's runner CPU per rollout is printed.

``--repeats N`` alternates bare and framework runs N times (the speed of a shared machine drifts between runs);
each repeat's ratios (wall clock and CPU seconds) are against its own bare run; the medians of both are printed,
and the repeat with the median wall ratio is reported in full.

    .venv/bin/python benchmarks/e2e_overhead.py --iterations 10 --repeats 3
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


PHASES = ("time_rollouts", "time_generating", "time_batch", "time_update", "time_sync", "cpu_generating")
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


AGENTS = ("openai", "langgraph")


def run_framework(args: argparse.Namespace, agent: str) -> tuple[dict[str, Any], float, dict[str, dict[str, float]]]:
    """One framework run of the quickstart with ``agent``: its summary, CPU seconds and phases."""
    output = f"runs/e2e-overhead-{agent}"
    summary, cpu = run(
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
            output,
            "--runners",
            str(args.runners),
            "--transition-mode",
            args.transition_mode,
            "--agent",
            agent,
            "--threads",
            str(args.threads),
            "--max-staleness",
            str(args.max_staleness),
        ],
        f"framework ({agent} agent)",
    )
    return summary, cpu, phases(ROOT / output / "metrics.jsonl")


def run_bare(args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    """One bare-loop run: its summary and CPU seconds."""
    return run(
        [
            sys.executable,
            "benchmarks/bare_loop_calc.py",
            "--iterations",
            str(args.iterations),
            "--seconds",
            "3600",
            "--eval-tasks",
            "8",
            "--threads",
            str(args.threads),
        ],
        "bare loop",
    )


def framework_row(args: argparse.Namespace, agent: str, bare_s: float, bare_cpu: float) -> dict[str, Any]:
    """One framework run with ``agent``, as figures (its ratios against the bare run of the same repeat)."""
    summary, cpu, agent_phases = run_framework(args, agent)
    seconds = float(summary["seconds_per_iteration"])
    rollouts = args.iterations * 128 + 2 * 8  # training episodes plus the two evaluations
    row: dict[str, Any] = {
        "seconds_per_iteration": seconds,
        "ratio": round(seconds / bare_s, 2),
        "reward_after": summary.get("reward_after"),
        "cpu_seconds": round(cpu, 1),
        "cpu_ratio": round(cpu / bare_cpu, 2) if bare_cpu > 0 else float("nan"),
        "trainer_cpu_seconds": summary.get("trainer_cpu_seconds"),
        "runner_cpu_seconds": summary.get("runner_cpu_seconds"),
        "runner_cpu_ms_per_rollout": round(1000 * float(summary.get("runner_cpu_seconds", 0.0)) / rollouts, 1),
        "phases": agent_phases,
    }
    if "rest" in agent_phases:  # after the first iteration: the runner slots' HTTP clients are built
        row["ratio_after_first"] = round(agent_phases["rest"]["seconds"] / bare_s, 2)
    return row


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else round((ordered[mid - 1] + ordered[mid]) / 2, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runners", type=int, default=2, help="runner processes of the framework run")
    parser.add_argument("--transition-mode", choices=("trajectory", "per_call"), default="trajectory")
    parser.add_argument("--agent", choices=(*AGENTS, "both"), default="both", help="the agent of the framework run(s)")
    parser.add_argument(
        "--max-staleness", type=int, choices=(0, 1), default=0, help="the framework runs' LoopConfig.max_staleness"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="alternate bare and framework runs this many times; ratios are per repeat, the median is reported "
        "(a shared machine's speed drifts between runs)",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    agents = list(AGENTS) if args.agent == "both" else [args.agent]
    load_before = os.getloadavg()[0]
    repeats: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        bare, bare_cpu = run_bare(args)
        bare_s = float(bare["seconds_per_iteration"])
        repeat: dict[str, Any] = {
            "bare_seconds_per_iteration": bare_s,
            "bare_sample_seconds": bare.get("sample_seconds_per_iteration"),
            "bare_sample_cpu_seconds": bare.get("sample_cpu_seconds_per_iteration"),
            "bare_update_seconds": bare.get("update_seconds_per_iteration"),
            "bare_reward_last5": bare.get("reward_last5"),
            "bare_cpu_seconds": round(bare_cpu, 1),
        }
        for agent in agents:
            repeat[agent] = framework_row(args, agent, bare_s, bare_cpu)
        repeats.append(repeat)
    median = repeats[sorted(range(len(repeats)), key=lambda i: repeats[i][agents[0]]["ratio"])[len(repeats) // 2]]
    figures: dict[str, Any] = {
        "iterations": args.iterations,
        "runners": args.runners,
        "transition_mode": args.transition_mode,
        "max_staleness": args.max_staleness,
        "repeats": args.repeats,
        **median,  # the repeat whose first agent's ratio is the median, whole (its bare run included)
        "ratios": {agent: [r[agent]["ratio"] for r in repeats] for agent in agents},
        "ratios_after_first": {agent: [r[agent].get("ratio_after_first") for r in repeats] for agent in agents},
        "cpu_ratios": {agent: [r[agent]["cpu_ratio"] for r in repeats] for agent in agents},
        "median_ratio": {agent: _median([r[agent]["ratio"] for r in repeats]) for agent in agents},
        "median_cpu_ratio": {agent: _median([r[agent]["cpu_ratio"] for r in repeats]) for agent in agents},
        # each repeat's CPU seconds: the bare loop, the framework's trainer process, its runner processes
        "cpu_split": {
            agent: [
                [r["bare_cpu_seconds"], r[agent]["trainer_cpu_seconds"], r[agent]["runner_cpu_seconds"]]
                for r in repeats
            ]
            for agent in agents
        },
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    bare_s, bare_cpu = figures["bare_seconds_per_iteration"], figures["bare_cpu_seconds"]
    print(f"{args.repeats} alternating repeat(s); each repeat's ratios against its own bare run (wall and CPU):")
    for agent in agents:
        print(
            f"  {agent:10} wall {figures['ratios'][agent]} (median {figures['median_ratio'][agent]:.2f})"
            f"  CPU {figures['cpu_ratios'][agent]} (median {figures['median_cpu_ratio'][agent]:.2f})"
            f"  wall after 1st {figures['ratios_after_first'][agent]}"
        )
        print(f"  {'':10} CPU s [bare, trainer, runners] {figures['cpu_split'][agent]}")
    if args.repeats > 1:
        print(f"the repeat with the median wall ratio (of the {agents[0]} agent) in full:")
    header = f"{'s/iteration':>12}{'ratio':>8}{'after 1st':>11}{'CPU s':>8}{'CPU ratio':>10}{'runner ms/rollout':>19}"
    print(f"{'':34}{header}")
    print(f"{'bare loop':34}{bare_s:>12.3f}{1.0:>8.2f}{'':>11}{bare_cpu:>8.1f}{1.0:>10.2f}{'':>19}")
    for agent in agents:
        row = figures[agent]
        print(
            f"{'framework, ' + agent + ' agent':34}{row['seconds_per_iteration']:>12.3f}{row['ratio']:>8.2f}"
            f"{row.get('ratio_after_first', float('nan')):>11.2f}{row['cpu_seconds']:>8.1f}{row['cpu_ratio']:>10.2f}"
            f"{row['runner_cpu_ms_per_rollout']:>19.1f}"
        )
    print("target: wall and CPU ratio <= 1.5; CPU s: the whole run's processes (startup and evaluations included)")
    print(f"load average {figures['load_average'][0]:.2f} -> {figures['load_average'][1]:.2f}")
    print(
        f"bare loop, s/iteration: sampling {figures['bare_sample_seconds']} (CPU {figures['bare_sample_cpu_seconds']})"
        f", update {figures['bare_update_seconds']}"
    )
    for agent in agents:
        print(f"{agent} agent, phases in s/iteration: {'  '.join(p.removeprefix('time_') for p in PHASES)}")
        for name, row in figures[agent]["phases"].items():
            print(f"  {name:6} {row['seconds']:7.3f} total  " + "  ".join(f"{row[p]:.3f}" for p in PHASES))
        print("  backend: requests per admission group, rows per decode step, decode steps (per iteration)")
        for name, row in figures[agent]["phases"].items():
            print(f"  {name:6} " + "  ".join(f"{row[p]:.1f}" for p in BACKEND))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
