"""Command line for the tiny calculator model: ``python -m agentlightning_torch.tiny warmstart|evaluate``.

``warmstart --out DIR`` trains the deterministic warm start and saves model + tokenizer into ``DIR``;
``evaluate --model DIR`` reports tool use, sampled reward and greedy accuracy on held-out tasks.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from agentlightning_torch._calc import make_calc_tasks
from agentlightning_torch._episodes import run_calc_episodes, summarize_episodes
from agentlightning_torch._generate import SamplingParams
from agentlightning_torch._model import count_parameters, load_tiny, save_tiny
from agentlightning_torch._template import CalcChatTemplate
from agentlightning_torch._warmstart import WarmStartConfig, warm_start

__all__ = ["evaluate_checkpoint", "main"]

EVAL_SEED = 1_000_003
"""Seed of the held-out evaluation tasks (training tasks are drawn from other seeds)."""


def evaluate_checkpoint(
    model: PreTrainedModel, template: CalcChatTemplate, *, tasks: int = 256, seed: int = EVAL_SEED
) -> dict[str, float]:
    """Sampled (temperature 1) and greedy figures of ``model`` on ``tasks`` held-out questions."""
    held_out = make_calc_tasks(tasks, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    sampled = summarize_episodes(
        run_calc_episodes(
            model, template, held_out, SamplingParams(temperature=1.0, max_tokens=24), generator=generator
        )
    )
    greedy = summarize_episodes(
        run_calc_episodes(model, template, held_out, SamplingParams(temperature=0.0, max_tokens=24))
    )
    return {
        "sampled_reward": sampled["reward"],
        "sampled_tool_use": sampled["tool_use"],
        "sampled_accuracy": sampled["accuracy"],
        "greedy_accuracy": greedy["accuracy"],
        "greedy_tool_use": greedy["tool_use"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m agentlightning_torch.tiny", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warmstart", help="train the warm start and save it")
    warm.add_argument("--out", required=True, type=Path, help="directory to write model + tokenizer into")
    warm.add_argument("--steps", type=int, default=WarmStartConfig().steps)
    warm.add_argument("--seed", type=int, default=WarmStartConfig().seed)
    warm.add_argument("--batch-size", type=int, default=WarmStartConfig().batch_size)
    warm.add_argument("--threads", type=int, default=1)
    warm.add_argument("--eval-tasks", type=int, default=256, help="held-out tasks to evaluate on (0 to skip)")
    evaluate = commands.add_parser("evaluate", help="measure a saved checkpoint")
    evaluate.add_argument("--model", required=True, type=Path)
    evaluate.add_argument("--tasks", type=int, default=256)
    evaluate.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    if args.command == "warmstart":
        config = WarmStartConfig(steps=args.steps, seed=args.seed, batch_size=args.batch_size, num_threads=args.threads)
        model, tokenizer, metrics = warm_start(config)
        save_tiny(model, tokenizer, args.out)
        report: dict[str, float] = {"parameters": float(count_parameters(model)), **metrics}
        if args.eval_tasks:
            report.update(evaluate_checkpoint(model, CalcChatTemplate(tokenizer), tasks=args.eval_tasks))
    else:
        model, tokenizer = load_tiny(args.model)
        report = evaluate_checkpoint(model, CalcChatTemplate(tokenizer), tasks=args.tasks)
    sys.stdout.write(json.dumps({k: round(v, 4) for k, v in report.items()}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
