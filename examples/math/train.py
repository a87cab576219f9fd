"""Teach an AutoGen math agent to use its calculator (and ignore distractor numbers) with RL, on a laptop CPU.

    python examples/math/train.py                      # ~10 minutes of RL, then a table, a plot and a JSON line
    python examples/math/train.py --minutes 3          # shorter
    python examples/math/train.py eval --base-url http://localhost:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct

What runs: this process serves the warm-started ~2M-parameter model (local batched backend) behind the LLM proxy
and trains it; runner processes (``run_agents.py``, i.e. ``agl runner --instrument autogen``) run the AutoGen
assistant on rollouts taken from the SQLite store. Every model call goes agent -> proxy (records token ids) ->
backend; each iteration turns spans + token records into transitions, GRPO credit, a PPO step and a new model
version served back. Held-out problems (never trained on) are scored greedily before and after.

``eval`` scores the held-out problems with the same agent against any OpenAI-compatible endpoint (vLLM, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from math_task import MathProblem, load_problems, split_problems, tasks_of  # noqa: E402

DEFAULT_MODEL = HERE / "checkpoint"
MODEL_NAME = "math-tiny"


class UsageError(Exception):
    """Bad input from the command line or a task file; printed as one clear line, exit code 2."""


# ----- data -------------------------------------------------------------------------------------------------------


def problems_from(args: argparse.Namespace) -> tuple[list[MathProblem], list[MathProblem]]:
    """Training and held-out problems: generated (seeded, disjoint), or read from local JSONL files."""
    if args.train_size < 1 or args.eval_size < 1:
        raise UsageError("--train-size and --eval-size must be at least 1")
    train, held_out = split_problems(args.train_size, args.eval_size, seed=args.data_seed)
    try:
        if args.train_file is not None:
            train = load_problems(args.train_file)
        if args.eval_file is not None:
            held_out = load_problems(args.eval_file, limit=args.eval_size)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return train, held_out


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train-size", type=int, default=2000, help="generated training problems")
    parser.add_argument("--eval-size", type=int, default=128, help="held-out problems scored before and after")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the generated problems")
    parser.add_argument("--train-file", type=Path, help="JSONL training problems (GSM8K format or question/answer)")
    parser.add_argument("--eval-file", type=Path, help="JSONL held-out problems (GSM8K format or question/answer)")


# ----- training ---------------------------------------------------------------------------------------------------


def parse_train_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL, help="warm-started model folder")
    parser.add_argument("--output", type=Path, default=Path("runs") / "math", help="run folder (store, metrics, plot)")
    parser.add_argument("--minutes", type=float, default=10.0, help="RL time budget in minutes")
    parser.add_argument("--iterations", type=int, default=1000, help="most RL iterations")
    parser.add_argument("--tasks-per-iteration", type=int, default=8)
    parser.add_argument("--samples-per-task", type=int, default=8)
    parser.add_argument("--lr", type=float, default=4e-4, help="policy learning rate")
    parser.add_argument("--max-tokens", type=int, default=48, help="most tokens per model call")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of training rollouts")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (few is faster on small machines)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--workers", type=int, default=64, help="concurrent rollouts over all local runner processes")
    parser.add_argument("--runners", type=int, default=2, help="local runner processes")
    parser.add_argument("--rollout-timeout", type=float, default=180.0, help="seconds an iteration waits for rollouts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_data_arguments(parser)
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from agentlightning_torch import PPOConfig, TorchTrainerConfig

    if args.minutes <= 0:
        raise UsageError(f"--minutes must be positive, got {args.minutes}")
    if args.workers < 1 or args.runners < 1:
        raise UsageError("--workers and --runners must be at least 1")
    try:
        return TorchTrainerConfig(
            model_dir=args.model_dir,
            model_name=MODEL_NAME,
            tool_parser="hermes",
            output_dir=args.output,
            device=args.device,
            num_threads=args.threads,
            iterations=args.iterations,
            time_budget_s=args.minutes * 60,
            tasks_per_iteration=args.tasks_per_iteration,
            samples_per_task=args.samples_per_task,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            ppo=PPOConfig(lr=args.lr, num_threads=args.threads),
            seed=args.seed,
            checkpoint_every=0,
            rollout_timeout_s=args.rollout_timeout,
        )
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in error.errors())
        raise UsageError(f"invalid setting: {problems}") from None


def start_runners(db: Path, workers: int, runners: int) -> list[subprocess.Popen[bytes]]:
    """``runners`` local runner processes (``run_agents.py``) sharing ``workers`` concurrent rollouts.

    Tied to this process (`agentlightning.cli.start_runners`): even a ``kill -9`` of the trainer ends them.
    """
    from agentlightning.cli import start_runners as start_runner_processes

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    commands = []
    for index in range(runners):
        share = workers // runners + (1 if index < workers % runners else 0)
        commands.append([sys.executable, str(HERE / "run_agents.py"), "--db", str(db), "--workers", str(max(share, 1))])
    return start_runner_processes(commands, env)


def plot(history: list[Any], held_out: tuple[float, float], path: Path) -> None:
    """Sampled accuracy and calculator use per iteration against RL minutes; held-out accuracy at both ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = list(itertools.accumulate(r.seconds / 60 for r in history))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(minutes, [r.reward_mean for r in history], label="sampled accuracy (training reward)")
    ax.plot(minutes, [r.multi_call_rate for r in history], "--", label="calculator-use rate")
    ax.plot([0, minutes[-1]], held_out, "ko:", label="held-out accuracy (greedy)")
    ax.set(xlabel="RL time (minutes)", ylim=(-0.05, 1.05), title="AutoGen math agent trained with Agent Lightning")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def train(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    from rich.console import Console

    import agentlightning as agl
    from agentlightning.cli import cancel_on_sigterm, guarded, stop_children
    from agentlightning_torch import TorchTrainer

    cancel_on_sigterm()  # a `kill` ends the run like Ctrl-C: through the cleanup below, then one line
    console = Console(stderr=True)
    train_problems, held_out = problems_from(args)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "metrics.jsonl").unlink(missing_ok=True)
    db = args.output / "store.db"
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)
    store = agl.SqliteStore(db)
    runners = start_runners(db, args.workers, args.runners)

    def on_iteration(report: Any) -> None:
        """One line per iteration: sampled accuracy (the 0/1 reward) and how often the calculator was used."""
        failed = report.metrics.get("rollouts_failed", 0.0)
        line = f"iteration {report.iteration:3d}  accuracy {report.reward_mean:.2f}"
        line += f"  calculator use {report.multi_call_rate:.2f}  {report.seconds:.1f} s"
        if not args.quiet:
            console.print(line + (f"  [red]{failed:.0f} rollouts failed[/]" if failed else ""))

    trainer = TorchTrainer(config, on_iteration=on_iteration)
    try:
        await trainer.start(store)
        console.print(f"[bold]evaluating[/] the warm-started policy greedily on {len(held_out)} held-out problems")
        before = await guarded(runners, trainer.evaluate(store, tasks_of(held_out)))
        console.print(f"held-out accuracy before RL: {_accuracy(before):.2f}, tool rate {before.multi_call_rate:.2f}")
        started = time.monotonic()
        await guarded(runners, trainer.run(store, tasks_of(train_problems)))
        rl_seconds = time.monotonic() - started
        after = await guarded(runners, trainer.evaluate(store, tasks_of(held_out)))
    finally:
        # The runners first, while the proxy still answers them (they hand their rollouts back as they drain), and
        # from a thread: the proxy runs on this loop.
        await asyncio.to_thread(stop_children, runners)
        await trainer.stop()
        await store.close()
    history = trainer.history
    if not history:
        raise UsageError("no RL iteration finished within the time budget; raise --minutes")
    tail = history[-5:]
    plot(history, (_accuracy(before), _accuracy(after)), args.output / "reward_curve.png")
    return {
        "reward_before": round(_accuracy(before), 4),
        "reward_after": round(_accuracy(after), 4),
        "tool_rate_before": round(before.multi_call_rate, 4),
        "tool_rate_after": round(after.multi_call_rate, 4),
        "sampled_reward_first": round(history[0].reward_mean, 4),
        "sampled_reward_last5": round(sum(r.reward_mean for r in tail) / len(tail), 4),
        "rl_seconds": round(rl_seconds, 1),
        "iterations": len(history),
        "seconds_per_iteration": round(sum(r.seconds for r in history) / len(history), 3),
        "held_out": len(held_out),
        "plot": str(args.output / "reward_curve.png"),
        "metrics": str(args.output / "metrics.jsonl"),
    }


def _accuracy(report: Any) -> float:
    """Held-out mean reward: with 0/1 rewards it is the accuracy; rollouts that did not finish count as wrong."""
    return report.reward_mean * report.finished / max(report.rollouts, 1)


def run_training(argv: list[str]) -> int:
    args = parse_train_args(argv)
    from agentlightning.cli import RunnerDied

    try:
        problems_from(args)
        config = build_config(args)
        from agentlightning import run_async  # uvloop when installed

        summary = run_async(train(args, config))
    except (UsageError, RunnerDied) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except asyncio.CancelledError:  # SIGTERM (cancel_on_sigterm)
        print("terminated", file=sys.stderr)
        return 143
    from rich.console import Console
    from rich.table import Table

    table = Table(title="AutoGen math agent: before and after RL (held-out, greedy)")
    table.add_column("measure")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_row(
        "held-out accuracy (mean reward)", f"{summary['reward_before']:.2f}", f"{summary['reward_after']:.2f}"
    )
    table.add_row("calculator-use rate", f"{summary['tool_rate_before']:.2f}", f"{summary['tool_rate_after']:.2f}")
    table.add_row(
        "sampled training reward", f"{summary['sampled_reward_first']:.2f}", f"{summary['sampled_reward_last5']:.2f}"
    )
    console = Console(stderr=True)
    console.print(table)
    console.print(f"{summary['iterations']} iterations in {summary['rl_seconds']:.0f} s of RL; plot: {summary['plot']}")
    print(json.dumps(summary))
    return 0


# ----- evaluation against any endpoint ----------------------------------------------------------------------------


def run_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="train.py eval", description="Score the held-out problems with the same AutoGen agent."
    )
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://localhost:8000/v1")
    parser.add_argument("--model", required=True, help="model name the endpoint serves")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    add_data_arguments(parser)
    args = parser.parse_args(argv)
    from math_eval import evaluate_endpoint

    try:
        _, held_out = problems_from(args)
        if args.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        report = asyncio.run(
            evaluate_endpoint(
                args.base_url,
                args.model,
                held_out,
                api_key=args.api_key,
                concurrency=args.concurrency,
                temperature=args.temperature,
                max_tokens=args.max_tokens,
            )
        )
    except (UsageError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"model": args.model, **{k: round(v, 4) for k, v in report.items()}}))
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["eval"]:
        return run_eval(args[1:])
    try:
        return run_training(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
