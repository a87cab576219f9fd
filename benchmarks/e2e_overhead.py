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

``--model smollm2`` (or ``--model-dir DIR`` with it) measures a real pretrained model instead: ``train.py --model
smollm2 --transition-mode per_call`` (LoRA, KL to the base, the prompt file's opening messages, one sample per LLM
call) against ``bare_loop_calc.py --model DIR --prompt-file FILE`` (``bare_loop_chat.py``: the same generation, the
same samples and the same update in one process), with the same tasks, samples, temperature, max tokens, iterations
and threads; the goal is a ratio <= 1.10, and a phase table (generation, transitions, update, sync, the rest: bare
vs framework and the difference) says where any excess goes. ``commands`` builds both command lines.

    .venv/bin/python benchmarks/e2e_overhead.py --model smollm2 --iterations 4 --repeats 3
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "calc"))
from train import SMOLLM2, SMOLLM2_FOLDER, SMOLLM2_PROMPT  # the preset both sides of a real-model run use

ROOT = Path(__file__).resolve().parent.parent
TOY_ROLLOUTS = (16 * 8, 8)
"""The toy run's training rollouts per iteration (train.py's defaults) and held-out tasks per evaluation."""


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
WORK = ("tokens_generated", "n_samples")
"""The work of an iteration (tokens generated, samples trained): sampling makes it differ between two runs."""


def phases(metrics_file: Path) -> dict[str, dict[str, float]]:
    """Mean seconds per phase of the run's training iterations: ``first`` iteration, the ``rest`` and ``all``."""
    rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    train = [row for row in rows if row.get("kind") == "train"]
    groups = {"first": train[:1], "rest": train[1:], "all": train}
    out: dict[str, dict[str, float]] = {}
    for name, group in groups.items():
        if group:
            out[name] = {
                "seconds": round(sum(float(r["seconds"]) for r in group) / len(group), 3),
                **{
                    p: round(sum(float(r["metrics"].get(p, 0.0)) for r in group) / len(group), 3)
                    for p in PHASES + BACKEND + WORK
                },
            }
    return out


AGENTS = ("openai", "langgraph")


def model_folder(args: argparse.Namespace) -> Path | None:
    """The real model's folder (``--model-dir``, else where ``scripts/dev.py smollm2`` put it); ``None`` for toy."""
    if args.model == "toy":
        return None
    if args.model_dir is not None:
        return args.model_dir.resolve()
    from agentlightning_torch.models import models_dir  # imports torch: only for this mode

    return models_dir() / SMOLLM2_FOLDER


def framework_output(args: argparse.Namespace, agent: str) -> str:
    """The framework run's folder (relative to the repository)."""
    return f"runs/e2e-overhead-{agent}" if args.model == "toy" else f"runs/e2e-overhead-{args.model}-{agent}"


def _toy_commands(args: argparse.Namespace, agent: str) -> tuple[list[str], list[str]]:
    bare = [sys.executable, "benchmarks/bare_loop_calc.py", "--iterations", str(args.iterations), "--seconds", "3600"]
    bare += ["--eval-tasks", "8", "--threads", str(args.threads)]
    framework = [sys.executable, "examples/calc/train.py", "--iterations", str(args.iterations), "--minutes", "60"]
    framework += ["--eval-size", "8", "--quiet", "--output", framework_output(args, agent)]
    framework += ["--runners", str(args.runners), "--transition-mode", args.transition_mode, "--agent", agent]
    framework += ["--threads", str(args.threads), "--max-staleness", str(args.max_staleness)]
    return bare, framework


def commands(args: argparse.Namespace, agent: str) -> tuple[list[str], list[str]]:
    """The bare loop's and the framework's command lines (run from the repository root) for ``agent``.

    With a real model both get the same model folder, prompt file, tasks x samples, temperature, max tokens, policy
    settings (lr, KL, LoRA rank), held-out tasks, threads and seed; the framework trains one sample per call.
    """
    folder = model_folder(args)
    if folder is None:
        return _toy_commands(args, agent)
    common = [
        "--iterations", str(args.iterations), "--temperature", str(args.temperature),
        "--max-tokens", str(args.max_tokens), "--lr", str(args.lr), "--kl-coef", str(args.kl_coef),
        "--lora-rank", str(args.lora_rank), "--threads", str(args.threads), "--seed", str(args.seed),
        "--prompt-file", str(args.prompt_file.resolve()),
    ]  # fmt: skip
    bare = [sys.executable, "benchmarks/bare_loop_calc.py", "--model", str(folder), *common, "--seconds", "36000"]
    bare += ["--prompts", str(args.tasks), "--samples", str(args.samples), "--eval-tasks", str(args.eval_size)]
    framework = [sys.executable, "examples/calc/train.py", "--model", args.model, "--model-dir", str(folder), *common]
    framework += ["--tasks-per-iteration", str(args.tasks), "--samples-per-task", str(args.samples)]
    framework += ["--eval-size", str(args.eval_size), "--eval-every", "0", "--minutes", "600"]
    framework += ["--transition-mode", "per_call", "--agent", agent, "--runners", str(args.runners)]
    framework += ["--max-staleness", str(args.max_staleness), "--quiet", "--output", framework_output(args, agent)]
    return bare, framework


def run_framework(args: argparse.Namespace, agent: str) -> tuple[dict[str, Any], float, dict[str, dict[str, float]]]:
    """One framework run with ``agent``: its summary, CPU seconds and phases."""
    summary, cpu = run(commands(args, agent)[1], f"framework ({agent} agent)")
    return summary, cpu, phases(ROOT / framework_output(args, agent) / "metrics.jsonl")


def run_bare(args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    """One bare-loop run: its summary and CPU seconds."""
    return run(commands(args, "langgraph")[0], "bare loop")


def framework_row(args: argparse.Namespace, agent: str, bare_s: float, bare_cpu: float) -> dict[str, Any]:
    """One framework run with ``agent``, as figures (its ratios against the bare run of the same repeat)."""
    summary, cpu, agent_phases = run_framework(args, agent)
    seconds = float(summary["seconds_per_iteration"])
    per_iteration, held_out = TOY_ROLLOUTS if args.model == "toy" else (args.tasks * args.samples, args.eval_size)
    rollouts = args.iterations * per_iteration + 2 * held_out  # training episodes plus the two evaluations
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; a real model's defaults are ``train.py --model smollm2``'s preset."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("toy", "smollm2"), default="toy", help="the shipped toy, or SmolLM2")
    parser.add_argument("--model-dir", type=Path, default=None, help="--model smollm2: this folder instead")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runners", type=int, default=2, help="runner processes of the framework run")
    parser.add_argument(
        "--transition-mode",
        choices=("trajectory", "per_call"),
        default=None,
        help="toy: trajectory (default) or per_call; smollm2: per_call only (its template cannot merge the turns)",
    )
    parser.add_argument(
        "--agent",
        choices=(*AGENTS, "both"),
        default=None,
        help="the agent of the framework run(s) (default: both for toy, langgraph for smollm2)",
    )
    parser.add_argument(
        "--max-staleness", type=int, default=0, help="the framework runs' LoopConfig.max_staleness (any K >= 0)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="alternate bare and framework runs this many times; ratios are per repeat, the median is reported "
        "(a shared machine's speed drifts between runs)",
    )
    real = parser.add_argument_group("a real model (--model smollm2; defaults: train.py's preset)")
    real.add_argument("--prompt-file", type=Path, default=SMOLLM2_PROMPT)
    real.add_argument("--tasks", type=int, default=SMOLLM2["tasks_per_iteration"], help="tasks per iteration")
    real.add_argument("--samples", type=int, default=SMOLLM2["samples_per_task"], help="rollouts per task")
    real.add_argument("--temperature", type=float, default=SMOLLM2["temperature"])
    real.add_argument("--max-tokens", type=int, default=16)
    real.add_argument("--lr", type=float, default=SMOLLM2["lr"])
    real.add_argument("--kl-coef", type=float, default=SMOLLM2["kl_coef"])
    real.add_argument("--lora-rank", type=int, default=16)
    real.add_argument("--eval-size", type=int, default=8, help="held-out tasks evaluated before and after")
    real.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.model == "toy":
        args.transition_mode = args.transition_mode or "trajectory"
        args.agent = args.agent or "both"
    else:
        if args.transition_mode == "trajectory":
            parser.error("--model smollm2 trains one sample per call: its template renders a tool-call turn empty")
        args.transition_mode, args.agent = "per_call", args.agent or "langgraph"
    return args


BARE_PHASES = {"generation": "time_rollouts", "transitions": "time_batch", "update": "time_update", "sync": "time_sync"}
"""The bare loop's phase -> the framework's (``metrics.jsonl``) phase that does the same work."""


def phase_table(bare: dict[str, Any], framework: dict[str, float]) -> dict[str, dict[str, float]]:
    """Seconds per iteration of each phase, bare and framework (all its iterations), and the framework's excess;
    ``other``: what no phase covers (the loop's own bookkeeping, publishing resources, the report)."""
    table: dict[str, dict[str, float]] = {}
    for name, theirs in BARE_PHASES.items():
        ours = float(bare.get(f"{name}_seconds_per_iteration", 0.0))
        table[name] = {"bare": ours, "framework": framework.get(theirs, 0.0)}
    table["total"] = {"bare": float(bare["seconds_per_iteration"]), "framework": framework["seconds"]}
    table["other"] = {
        side: round(table["total"][side] - sum(table[n][side] for n in BARE_PHASES), 3)
        for side in ("bare", "framework")
    }
    for row in table.values():
        row["excess"] = round(row["framework"] - row["bare"], 3)
    table["work"] = {
        "bare_tokens": float(bare.get("tokens_per_iteration", 0.0)),
        "framework_tokens": framework.get("tokens_generated", 0.0),
        "bare_samples": float(bare.get("samples_per_iteration", 0.0)),
        "framework_samples": framework.get("n_samples", 0.0),
    }
    return table


def print_phase_table(agent: str, table: dict[str, dict[str, float]], framework: dict[str, float]) -> None:
    """Where the framework's iteration spends its time, next to the bare loop's (the median repeat)."""
    excess = table["total"]["excess"]
    print(f"{agent} agent vs bare loop, s/iteration (all iterations):")
    print(f"  {'phase':12}{'bare':>9}{'framework':>11}{'excess':>9}{'of excess':>11}")
    for name, row in table.items():
        if name == "work":
            continue
        share = f"{row['excess'] / excess:>10.0%}" if excess > 0 and name != "total" else ""
        print(f"  {name:12}{row['bare']:>9.3f}{row['framework']:>11.3f}{row['excess']:>9.3f} {share}")
    bare_samples, samples = table["work"]["bare_samples"], table["work"]["framework_samples"]
    print(
        f"  work per iteration: bare {table['work']['bare_tokens']:.0f} tokens generated, {bare_samples:.1f} samples "
        f"trained; framework {table['work']['framework_tokens']:.0f} tokens, {samples:.1f} samples (update s per "
        f"sample: bare {table['update']['bare'] / max(bare_samples, 1e-9):.3f}, "
        f"framework {table['update']['framework'] / max(samples, 1e-9):.3f})"
    )
    print(
        f"  framework generation: the backend generated {framework.get('time_generating', 0.0):.3f} s "
        f"(its thread's CPU {framework.get('cpu_generating', 0.0):.3f} s) of the "
        f"{table['generation']['framework']:.3f} s the rollouts took"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
        if args.model != "toy":  # the bare loop's phases, wall and CPU, per iteration
            repeat["bare_phases"] = {k: v for k, v in bare.items() if k.endswith("seconds_per_iteration")}
        for agent in agents:
            repeat[agent] = framework_row(args, agent, bare_s, bare_cpu)
            if args.model != "toy":
                repeat[agent]["phase_table"] = phase_table(bare, repeat[agent]["phases"]["all"])
        repeats.append(repeat)
    median = repeats[sorted(range(len(repeats)), key=lambda i: repeats[i][agents[0]]["ratio"])[len(repeats) // 2]]
    target = 1.5 if args.model == "toy" else 1.1
    figures: dict[str, Any] = {
        "model": args.model,
        "model_dir": None if args.model == "toy" else str(model_folder(args)),
        "target_ratio": target,
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
    print(
        f"target: wall and CPU ratio <= {target}; CPU s: the whole run's processes (startup and evaluations included)"
    )
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
        if "phase_table" in figures[agent]:
            print_phase_table(agent, figures[agent]["phase_table"], figures[agent]["phases"]["all"])
    if args.model != "toy":
        cpu = figures["bare_phases"]
        print(
            "bare loop CPU s/iteration: "
            + "  ".join(f"{name} {cpu.get(f'{name}_cpu_seconds_per_iteration', 0.0):.3f}" for name in BARE_PHASES)
        )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
