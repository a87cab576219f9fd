"""Train the text-to-SQL writer and rewriter agents (LangGraph) with RL on a CPU; the checker stays untrained.

    python examples/sql/train.py                  # 10 minutes of RL, then a summary, a plot and a JSON line
    python examples/sql/train.py --minutes 2      # shorter
    python examples/sql/sql_eval.py --base-url http://127.0.0.1:8000/v1 --model NAME   # score any served model

What runs: this process serves the warm-started model (``checkpoint/``, local batched backend) behind the LLM proxy
and trains it (`agl.RLLoop` over a `TorchEngine`); runner processes (``run_agents.py``, i.e. ``agl runner``)
run the three-agent graph of ``sql_agent.py`` on rollouts from the SQLite store. Each iteration turns spans + token
records into transitions of the ``writer`` and ``rewriter`` only (``agent_filter``: the ``checker``'s calls are
filtered out, though it runs on the same model), LightningRL credit (GRPO), a PPO step, and a new model version
served back. Every update checks its batch: a sample of any other agent stops the run; the metrics count the trained
samples per agent (``samples_writer``, ``samples_rewriter``, ``samples_checker`` = 0) and the filtered calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sql_agent import TRAINED_AGENTS
from sql_data import load_tasks

HERE = Path(__file__).resolve().parent
AGENTS = ("writer", "checker", "rewriter")
"""Every agent of the graph (LangGraph node names, which the LangChain adapter records as agent names)."""


class UsageError(Exception):
    """Bad input from the command line or a task file; printed as one clear line, exit code 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=HERE / "checkpoint", help="warm-started model folder")
    parser.add_argument("--train-tasks", type=Path, default=HERE / "data" / "train.jsonl", help="JSONL tasks")
    parser.add_argument("--val-tasks", type=Path, default=HERE / "data" / "val.jsonl", help="JSONL held-out tasks")
    parser.add_argument("--output", type=Path, default=Path("runs") / "sql", help="run folder (store, metrics, plot)")
    parser.add_argument("--minutes", type=float, default=10.0, help="RL time budget in minutes")
    parser.add_argument("--iterations", type=int, default=1000, help="most RL iterations")
    parser.add_argument("--tasks-per-iteration", type=int, default=8)
    parser.add_argument("--samples-per-task", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4, help="policy learning rate")
    parser.add_argument("--max-tokens", type=int, default=40, help="most tokens per LLM call")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (few is faster on small machines)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--workers", type=int, default=128, help="concurrent rollouts, over all local runner processes")
    parser.add_argument("--runners", type=int, default=2, help="local runner processes")
    parser.add_argument("--eval-size", type=int, default=100, help="held-out questions for greedy accuracy")
    parser.add_argument("--rollout-timeout", type=float, default=180.0, help="seconds an iteration waits for rollouts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Any:
    """The trainer's settings from the command line (bad values: `UsageError`)."""
    from pydantic import ValidationError

    from agentlightning_torch import PPOConfig, TorchTrainerConfig

    if args.minutes <= 0:
        raise UsageError(f"--minutes must be positive, got {args.minutes}")
    if args.workers < 1 or args.eval_size < 1 or args.runners < 1:
        raise UsageError("--workers, --runners and --eval-size must be at least 1")
    if not (args.model_dir / "config.json").is_file():
        raise UsageError(f"--model-dir {str(args.model_dir)!r} is not a model folder (no config.json)")
    try:
        return TorchTrainerConfig(
            model_dir=args.model_dir,
            model_name="sql-tiny",
            tool_parser="hermes",  # the agents call no tools; hermes is the chat template's format
            output_dir=args.output,
            device=args.device,
            num_threads=args.threads,
            iterations=args.iterations,
            time_budget_s=args.minutes * 60,
            tasks_per_iteration=args.tasks_per_iteration,
            samples_per_task=args.samples_per_task,
            max_tokens=args.max_tokens,
            agent_filter=TRAINED_AGENTS,  # writer + rewriter; the checker runs on the same model, untrained
            ppo=PPOConfig(lr=args.lr, num_threads=args.threads),
            seed=args.seed,
            checkpoint_every=0,
            rollout_timeout_s=args.rollout_timeout,
        )
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in error.errors())
        raise UsageError(f"invalid setting: {problems}") from None


def make_trainer(config: Any, on_iteration: Any = None) -> Any:
    """An `RLLoop` whose `TorchEngine` checks every training batch holds only the trained agents' samples (counted)."""
    from agentlightning import RLLoop, TrainingBatch
    from agentlightning_torch import TorchEngine

    class FilteredEngine(TorchEngine):
        def update(self, batch: TrainingBatch) -> dict[str, float]:
            counts = Counter(sample.agent_name or "(none)" for sample in batch.samples)
            stray = sorted(set(counts) - set(TRAINED_AGENTS))
            if stray:
                raise RuntimeError(f"the agent filter let samples of {stray} into the batch: {dict(counts)}")
            metrics = super().update(batch)
            metrics.update({f"samples_{agent}": float(counts.get(agent, 0)) for agent in AGENTS})
            return metrics

    return RLLoop(config.loop_config(), FilteredEngine(config), on_iteration=on_iteration)


def start_runners(where: list[str], workers: int, runners: int) -> list[subprocess.Popen[bytes]]:
    """``runners`` local runner processes (``run_agents.py``, i.e. ``agl runner``) sharing ``workers`` rollouts.

    Tied to this process (`agentlightning.cli.start_runners`): even a ``kill -9`` of the trainer ends them.
    """
    from agentlightning.cli import start_runners as start_runner_processes

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    shares = [workers // runners + (1 if i < workers % runners else 0) for i in range(runners)]
    run_agents = str(HERE / "run_agents.py")
    commands = [[sys.executable, run_agents, *where, "--workers", str(max(n, 1))] for n in shares]
    return start_runner_processes(commands, env)


def plot(history: list[Any], evals: list[tuple[float, float]], path: Path) -> None:
    """The reward curve: sampled training reward and rewriter use per iteration, held-out accuracy before/after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    elapsed, total = [], 0.0
    for report in history:
        total += report.seconds
        elapsed.append(total / 60)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(elapsed, [r.reward_mean for r in history], label="mean sampled reward (training)")
    ax.plot(elapsed, [r.multi_call_rate for r in history], label="rollouts using the rewriter", linestyle="--")
    ax.plot([m for m, _ in evals], [a for _, a in evals], "o-", label="held-out greedy accuracy")
    ax.set_xlabel("RL time (minutes)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Text-to-SQL writer + rewriter (LangGraph) trained with Agent Lightning on CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def shape_accuracy(store: Any) -> dict[str, float]:
    """Held-out accuracy per query shape of the latest evaluation, read back from the store."""
    from agentlightning.transitions import TransitionConfig, results_from_store

    rollouts = [r for r in await store.query_rollouts(status=["succeeded"]) if r.mode == "val"]
    if not rollouts:
        return {}
    latest = max(rollouts, key=lambda r: r.created_at).rollout_id.rsplit("-t", 1)[0]
    shapes = {r.rollout_id: str(r.input.get("shape", "?")) for r in rollouts if r.rollout_id.startswith(latest + "-")}
    by_shape: dict[str, list[float]] = {}
    for result in await results_from_store(store, list(shapes), TransitionConfig(on_missing="skip")):
        by_shape.setdefault(shapes[str(result.rollout_id)], []).append(result.final_reward or 0.0)
    return {shape: round(sum(v) / len(v), 3) for shape, v in sorted(by_shape.items())}


async def train(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """Evaluate, train for the time budget, evaluate again; returns the run's figures."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    import agentlightning as agl
    from agentlightning.cli import cancel_on_sigterm, guarded, stop_children

    cancel_on_sigterm()  # a `kill` ends the run like Ctrl-C: through the cleanup below, then one line
    console = Console(stderr=True)
    train_tasks, val_tasks = load_tasks(args.train_tasks), load_tasks(args.val_tasks)[: args.eval_size]
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "metrics.jsonl").unlink(missing_ok=True)
    opened = await agl.StoreServing().open(args.output / "store.db", fresh=True)
    store = opened.store
    runners = start_runners(opened.runner_args, args.workers, args.runners)
    progress = Progress(
        TextColumn("[bold]RL"), BarColumn(), TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
        console=console, disable=args.quiet,
    )  # fmt: skip
    bar = progress.add_task("rl", total=config.time_budget_s, status="starting")
    started = time.monotonic()

    def on_iteration(report: Any) -> None:
        m = report.metrics
        status = (
            f"it {report.iteration:3d}  reward {report.reward_mean:.2f}  rewriter {report.multi_call_rate:.2f}  "
            f"trained w/r/c {m.get('samples_writer', 0):.0f}/{m.get('samples_rewriter', 0):.0f}/"
            f"{m.get('samples_checker', 0):.0f}  {report.seconds:.1f}s/it"
        )
        progress.update(bar, completed=min(time.monotonic() - started, config.time_budget_s), status=status)

    trainer = make_trainer(config, on_iteration)
    try:
        await trainer.start(store)
        console.print(f"[bold]evaluating[/] the warm-started agents greedily on {len(val_tasks)} held-out questions")
        before = await guarded(runners, trainer.evaluate(store, val_tasks))
        shapes_before = await shape_accuracy(store)
        console.print(f"held-out execution accuracy before RL: {before.reward_mean:.2f} {shapes_before}")
        started = time.monotonic()
        with progress:
            await guarded(runners, trainer.run(store, train_tasks))
        rl_seconds = time.monotonic() - started
        after = await guarded(runners, trainer.evaluate(store, val_tasks))
        shapes_after = await shape_accuracy(store)
    finally:
        # The runners first, while the proxy still answers them (they hand their rollouts back as they drain), and
        # from a thread: the proxy runs on this loop.
        await asyncio.to_thread(stop_children, runners)
        await trainer.stop()
        await opened.close()
    history = trainer.history
    if not history:
        raise UsageError("no RL iteration finished within the time budget; raise --minutes")
    plot(history, [(0.0, before.reward_mean), (rl_seconds / 60, after.reward_mean)], args.output / "reward_curve.png")
    tail = history[-5:]
    trained = {agent: int(sum(r.metrics.get(f"samples_{agent}", 0) for r in history)) for agent in AGENTS}
    return {
        "reward_before": round(before.reward_mean, 4),
        "reward_after": round(after.reward_mean, 4),
        "sampled_reward_first": round(history[0].reward_mean, 4),
        "sampled_reward_last": round(sum(r.reward_mean for r in tail) / len(tail), 4),
        "rewriter_rate_first": round(history[0].multi_call_rate, 4),
        "rewriter_rate_last": round(sum(r.multi_call_rate for r in tail) / len(tail), 4),
        "accuracy_by_shape_before": shapes_before,
        "accuracy_by_shape_after": shapes_after,
        "trained_samples": trained,
        "filtered_calls": int(sum(r.metrics.get("calls_filtered", 0) for r in history)),
        "rl_seconds": round(rl_seconds, 1),
        "iterations": len(history),
        "seconds_per_iteration": round(sum(r.seconds for r in history) / len(history), 3),
        "plot": str(args.output / "reward_curve.png"),
        "metrics": str(args.output / "metrics.jsonl"),
    }


def print_summary(summary: dict[str, Any]) -> None:
    """The before/after table and the per-agent sample counts, on stderr."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Text-to-SQL agents: before and after RL")
    table.add_column("measure")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    rows = [
        ("held-out execution accuracy (greedy)", "reward_before", "reward_after"),
        ("sampled training reward", "sampled_reward_first", "sampled_reward_last"),
        ("rollouts using the rewriter", "rewriter_rate_first", "rewriter_rate_last"),
    ]
    for label, first, last in rows:
        table.add_row(label, f"{summary[first]:.2f}", f"{summary[last]:.2f}")
    for shape, value in summary["accuracy_by_shape_after"].items():
        table.add_row(f"  held-out {shape}", f"{summary['accuracy_by_shape_before'].get(shape, 0):.2f}", f"{value:.2f}")
    console = Console(stderr=True)
    console.print(table)
    trained = summary["trained_samples"]
    console.print(
        f"trained samples per agent: writer {trained['writer']}, rewriter {trained['rewriter']}, checker "
        f"{trained['checker']} ({summary['filtered_calls']} checker calls filtered out); {summary['iterations']} "
        f"iterations in {summary['rl_seconds']:.0f} s of RL; plot: {summary['plot']}"
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from agentlightning.cli import RunnerDied

    try:
        config = build_config(args)
        for path in (args.train_tasks, args.val_tasks):
            try:
                load_tasks(path)
            except ValueError as error:
                raise UsageError(str(error)) from None
        from agentlightning import run_async  # uvloop when installed

        summary = run_async(train(args, config))
    except (UsageError, RunnerDied) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except asyncio.CancelledError:  # SIGTERM (cancel_on_sigterm)
        print("terminated", file=sys.stderr)
        return 143
    print_summary(summary)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
