"""Teach an AutoGen math agent to use its calculator (and ignore distractor numbers) with RL, on a laptop CPU.

    python examples/math/train.py                      # the README's run: 30 iterations, a table, a plot, JSON
    python examples/math/train.py --iterations 90      # longer (held-out points every --eval-every 10)
    python examples/math/train.py eval --base-url http://localhost:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct

What runs: this process serves the warm-started ~2M-parameter model (local batched backend) behind the LLM proxy and
trains it; runner processes (``agl runner --app-dir examples/math --agent math_agent:math_agent --instrument autogen``)
run the AutoGen assistant on rollouts taken from the SQLite store. Every model call goes agent -> proxy (records token
ids) -> backend; each iteration turns spans + token records into transitions, GRPO credit, a PPO step and a new model
version served back. Held-out problems (never trained on) are scored greedily before and after, and every
``--eval-every`` iterations (the best weights kept in ``checkpoint/best``); the scaffolding is
`agentlightning_torch.runkit`.

``eval`` scores the held-out problems with the same agent against any OpenAI-compatible endpoint (vLLM, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from math_task import MathProblem, load_problems, split_problems, tasks_of  # noqa: E402

from agentlightning_torch.runkit import STABLE_RL, UsageError  # noqa: E402

DEFAULT_MODEL = HERE / "checkpoint"
STABLE: dict[str, Any] = {**STABLE_RL, "iterations": 30}  # the README's run: the same figures on any machine
"""The RL settings the README measured (3 seeds, and a run 3x as long): see the README's "Stable" section."""

MODEL_NAME = "math-tiny"


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
    from agentlightning_torch.runkit import SCRIPT_DEFAULTS, add_run_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL, help="warm-started model folder")
    parser.add_argument("--max-tokens", type=int, default=48, help="most tokens per model call")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of training rollouts")
    add_run_arguments(parser, output=Path("runs") / "math", **{**SCRIPT_DEFAULTS, **STABLE})
    add_data_arguments(parser)
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Any:
    from agentlightning_torch.runkit import UsageError, trainer_config

    if args.runners < 1 and not args.runners_ray:
        raise UsageError("--workers and --runners must be at least 1")
    return trainer_config(
        args,
        model_dir=args.model_dir,
        model_name=MODEL_NAME,
        tool_parser="hermes",
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        best_metric="accuracy",  # the 0/1 reward's success rate over the held-out problems
    )


async def train(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate, train within the budget (held-out points every --eval-every), evaluate again; the run's figures."""
    from agentlightning_torch import TorchTrainer
    from agentlightning_torch.runkit import (
        AgentRunners,
        RunSettings,
        TrainingRun,
        plot_run,
        ray_settings,
        total_workers,
    )

    config = build_config(args)
    train_problems, held_out = problems_from(args)

    class MathRun(TrainingRun):
        def status(self, report: Any) -> str:
            return super().status(report) + f"  calculator use {report.multi_call_rate:.2f}"

    settings = RunSettings(
        output=args.output,
        train_tasks=tasks_of(train_problems),
        val_tasks=tasks_of(held_out),
        runners=AgentRunners("math_agent:math_agent", app_dir=HERE, instrument="autogen", worker_mode="async"),
        processes=args.runners,
        ray=ray_settings(args),  # --runners ray: runner actors placed by Ray
        workers=total_workers(args),  # --workers is per runner process
        quiet=args.quiet,
    )
    result = await MathRun(TorchTrainer(config), settings).execute()
    history, tail = result.history, result.history[-5:]
    before, after = result.before, result.after
    assert before is not None and after is not None  # held-out problems always exist (problems_from)
    plot = args.output / "reward_curve.png"
    curves = [
        ("sampled accuracy (training reward)", lambda r: r.reward_mean),
        ("calculator-use rate", lambda r: r.multi_call_rate),
    ]
    plot_run(result, plot, title="AutoGen math agent trained with Agent Lightning", curves=curves, ylim=(-0.05, 1.05))
    summary = result.summary()
    return {
        "reward_before": summary["held_out_before"],
        "reward_best": summary["held_out_best"],
        "reward_after": summary["held_out_last"],
        "tool_rate_before": round(before.multi_call_rate, 4),
        "tool_rate_after": round(after.multi_call_rate, 4),
        "sampled_reward_first": round(history[0].reward_mean, 4),
        "sampled_reward_last5": round(sum(r.reward_mean for r in tail) / len(tail), 4),
        "rl_seconds": summary["seconds"],
        **summary,
        "held_out": len(held_out),
        "plot": str(plot),
        "metrics": str(args.output / "metrics.jsonl"),
    }


def show(summary: dict[str, Any]) -> None:
    """The before / best / last table on stderr."""
    from rich.console import Console

    from agentlightning_torch.runkit import print_table

    s = summary
    print_table(
        "AutoGen math agent: before and after RL (held-out, greedy)",
        [
            ("held-out accuracy", s["reward_before"], s["reward_best"], s["reward_after"]),
            ("calculator-use rate", s["tool_rate_before"], None, s["tool_rate_after"]),
            ("sampled training reward", s["sampled_reward_first"], None, s["sampled_reward_last5"]),
        ],
    )
    Console(stderr=True).print(
        f"{s['iterations']} iterations in {s['seconds']:.0f} s of RL; best held-out at iteration "
        f"{s['best_iteration']}; plot: {s['plot']}"
    )


def run_training(argv: list[str]) -> int:
    from agentlightning_torch.runkit import run_main

    args = parse_train_args(argv)
    return run_main(lambda: train(args), show)


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
    from agentlightning_torch.runkit import exit_process

    exit_process(main())  # no interpreter teardown of torch's objects (~1.5 s of CPU)
