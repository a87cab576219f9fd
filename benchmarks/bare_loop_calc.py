"""Bare RL loop on the calculator task, without the framework: the baseline the torch trainer is compared with.

Model, template, batched sampling and `ppo_update` come from ``agentlightning_torch``; there is no store, no
runner, no proxy and no HTTP. Each iteration samples ``prompts x samples`` episodes in two batched turns,
normalises rewards within each prompt's group (GRPO), drops groups whose rewards are all equal, and makes one
PPO step. Prints a table per iteration and ends with one JSON line of all figures.

    .venv/bin/python benchmarks/bare_loop_calc.py --model examples/calc/checkpoint --seconds 90

With ``--prompt-file`` it is the real-model mode (``bare_loop_chat.py``): a chat model's own template, the opening
messages of the prompt file, one sample per LLM call, LoRA with KL (what ``train.py --model smollm2`` trains).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_torch import PPOConfig, SamplingParams, make_optimizer, ppo_update

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "calc"))
from calc_model import build_model, build_tokenizer, run_calc_episodes, summarize_episodes
from calc_task import make_calc_tasks


def grpo_batch(episodes: list, samples_per_prompt: int) -> tuple[list[TrainingSample], int]:
    """Group-normalised advantages; returns the samples of groups with unequal rewards and the number of groups."""
    kept: list[TrainingSample] = []
    groups = 0
    for start in range(0, len(episodes), samples_per_prompt):
        group = episodes[start : start + samples_per_prompt]
        rewards = [e.reward for e in group]
        groups += 1
        if max(rewards) == min(rewards):
            continue
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        for index, episode in enumerate(group):
            advantage = (episode.reward - mean) / (std + 1e-4)
            kept.append(
                TrainingSample(
                    prompt_token_ids=episode.prompt_ids,
                    response_token_ids=episode.response_ids,
                    response_mask=episode.response_mask,
                    response_logprobs=episode.logprobs,
                    credit=episode.reward,
                    advantage=advantage,
                    group_id=f"g{start}",
                    rollout_id=f"r{start + index}",
                    attempt_id=f"a{start + index}",
                    step_index=0,
                )
            )
    return kept, groups


def main() -> int:
    if "--prompt-file" in sys.argv[1:] or any(a.startswith("--prompt-file=") for a in sys.argv[1:]):
        from bare_loop_chat import main as chat_main  # the real-model mode (its own options)

        return chat_main(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", type=Path, default=Path("examples/calc/checkpoint"), help="'random' for a fresh model"
    )
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=90.0, help="stop after this much wall time")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-tasks", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if str(args.model) == "random":
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, seed=args.seed)
    else:  # the same general path as any user model
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    config = PPOConfig(lr=args.lr, num_threads=args.threads, micro_batch_size=128)
    optimizer = make_optimizer(model, config)
    generator = torch.Generator().manual_seed(args.seed)
    sampling = SamplingParams(temperature=1.0, max_tokens=24)
    held_out = make_calc_tasks(args.eval_tasks, seed=1_000_003)

    def greedy_accuracy() -> float:
        episodes = run_calc_episodes(model, tokenizer, held_out, SamplingParams(temperature=0.0, max_tokens=24))
        return summarize_episodes(episodes)["accuracy"]

    start_accuracy = greedy_accuracy()
    print(
        f"{'iter':>4} {'t(s)':>6} {'s/iter':>6} {'sample':>6} {'update':>6} {'reward':>6} {'tool':>5} {'acc':>5} "
        f"{'kept':>4} {'loss':>7} {'clip':>5}"
    )
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    for iteration in range(args.iterations):
        if time.perf_counter() - started > args.seconds:
            break
        tick, tick_cpu = time.perf_counter(), time.thread_time()
        tasks = make_calc_tasks(args.prompts, seed=args.seed * 1_000_000 + iteration)
        episodes = run_calc_episodes(
            model, tokenizer, [t for t in tasks for _ in range(args.samples)], sampling, generator=generator
        )
        sampled, sample_cpu = time.perf_counter(), time.thread_time() - tick_cpu
        samples, groups = grpo_batch(episodes, args.samples)
        if not samples:
            print(f"warning: all {groups} groups had equal rewards; no learning signal this iteration", file=sys.stderr)
        metrics = ppo_update(model, optimizer, TrainingBatch(samples=samples), config)
        done = time.perf_counter()
        summary = summarize_episodes(episodes)
        row = {
            "iteration": iteration,
            "elapsed_s": done - started,
            "iteration_s": done - tick,
            "sample_s": sampled - tick,
            "sample_cpu_s": sample_cpu,
            "update_s": done - sampled,
            "kept": len(samples),
            "loss": metrics["loss"],
            "clip_fraction": metrics["clip_fraction"],
            **summary,
        }
        history.append(row)
        print(
            f"{iteration:>4} {row['elapsed_s']:>6.1f} {row['iteration_s']:>6.2f} {row['sample_s']:>6.2f} "
            f"{row['update_s']:>6.2f} {summary['reward']:>6.3f} {summary['tool_use']:>5.2f} "
            f"{summary['accuracy']:>5.2f} "
            f"{len(samples):>4} {metrics['loss']:>7.4f} {metrics['clip_fraction']:>5.2f}",
            flush=True,
        )
    end_accuracy = greedy_accuracy()
    first, last = history[:5], history[-5:]
    figures = {
        "iterations": len(history),
        "seconds": round(time.perf_counter() - started, 1),
        "seconds_per_iteration": round(statistics.fmean(r["iteration_s"] for r in history), 3),
        "sample_seconds_per_iteration": round(statistics.fmean(r["sample_s"] for r in history), 3),
        "sample_cpu_seconds_per_iteration": round(statistics.fmean(r["sample_cpu_s"] for r in history), 3),
        "update_seconds_per_iteration": round(statistics.fmean(r["update_s"] for r in history), 3),
        "reward_first5": round(statistics.fmean(r["reward"] for r in first), 3),
        "reward_last5": round(statistics.fmean(r["reward"] for r in last), 3),
        "tool_use_first5": round(statistics.fmean(r["tool_use"] for r in first), 3),
        "tool_use_last5": round(statistics.fmean(r["tool_use"] for r in last), 3),
        "greedy_accuracy_start": round(start_accuracy, 3),
        "greedy_accuracy_end": round(end_accuracy, 3),
        "prompts": args.prompts,
        "samples_per_prompt": args.samples,
        "threads": args.threads,
    }
    print(f"greedy held-out accuracy: {start_accuracy:.3f} -> {end_accuracy:.3f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
