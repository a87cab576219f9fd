"""Bare RL loop for a real chat model on the calculator task: what ``examples/calc/train.py --model smollm2
--transition-mode per_call`` does in one iteration, without the framework (no store, runner, proxy, HTTP or agent).

Each rollout is the agent's conversation: the opening messages of ``--prompt-file`` and ``Q:<expr>=``, rendered by
the tokenizer's own chat template (`HFChatTemplate`, as the backend renders it, the agent's calculator tool
declared); a ``CALC(<expr>)`` answer is parsed into a tool call as the backend parses it, and the second call sends
what the agent sends (the assistant turn with the tool call, the calculator's value as a ``tool`` message). All
first calls of an iteration are sampled in one batch (`generate_batch`), then all second calls. Reward: ``A:<n>``
scored by ``calc_rules.score_text``. One training sample per LLM call (``per_call``), GRPO advantages per task
group as LightningRL computes them (identical credit: population std over the group's rollouts, each call gets its
rollout's advantage), equal groups dropped; one `ppo_update` of the LoRA policy with the trainer's `PPOConfig`
(KL to the base with the adapters off); the weights then go to a merged copy that generates, as the trainer syncs
its backend. Phases per iteration, wall and CPU: generation, transitions, update, sync. Ends with one JSON line.

    .venv/bin/python benchmarks/bare_loop_calc.py --model ~/.cache/agentlightning/models/smollm2-135m-instruct \\
        --prompt-file examples/calc/prompts/smollm2.json --iterations 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentlightning import CreditConfig, TrainingBatch, TrainingSample
from agentlightning_torch import (
    GenerationResult,
    HFChatTemplate,
    LoRASettings,
    PPOConfig,
    SamplingParams,
    eos_token_ids,
    generate_batch,
    load_model,
    make_optimizer,
    merged_model,
    merged_state_dict,
    ppo_update,
    prepare_policy,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "calc"))
from calc_rules import MAX_LLM_CALLS, PROMPT_ENV, TOOLS, evaluate, prompt_messages, score_text
from train import HERE as CALC
from train import SMOLLM2


@dataclass
class Rollout:
    """One task's conversation: its messages so far, its calls (prompt ids, generated result) and reward."""

    task: dict[str, Any]
    messages: list[dict[str, Any]]
    calls: list[tuple[list[int], GenerationResult]] = field(default_factory=lambda: [])
    reward: float = -0.1
    used_tool: bool = False
    done: bool = False


def _cut_at_eos(result: GenerationResult, eos: frozenset[int]) -> GenerationResult:
    """The result ended at its first eos id (`generate_batch` stops on one id; the backend on all of them)."""
    for index, token in enumerate(result.token_ids):
        if token in eos:
            result.token_ids, result.logprobs = result.token_ids[: index + 1], result.logprobs[: index + 1]
            result.finish_reason = "stop"
            break
    return result


def run_rollouts(
    model: Any,
    template: HFChatTemplate,
    opening: Sequence[dict[str, Any]],
    tasks: Sequence[dict[str, Any]],
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> list[Rollout]:
    """Every task's conversation, at most ``MAX_LLM_CALLS`` calls, each round of calls sampled in one batch."""
    tokenizer: Any = template.tokenizer
    eos = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
    rollouts = [Rollout(task, [*opening, {"role": "user", "content": task["question"]}]) for task in tasks]
    for _ in range(MAX_LLM_CALLS):
        pending = [r for r in rollouts if not r.done]
        if not pending:
            break
        prompts = [template.render(r.messages, tools=TOOLS) for r in pending]
        results = generate_batch(
            model,
            prompts,
            [params] * len(prompts),
            eos_token_id=int(tokenizer.eos_token_id),
            pad_token_id=int(tokenizer.pad_token_id),
            generator=generator,
        )
        for rollout, prompt, result in zip(pending, prompts, results, strict=True):
            result = _cut_at_eos(result, eos)
            rollout.calls.append((prompt, result))
            message = assistant_message(template, result, prompt)
            calls = message.get("tool_calls")
            if not calls:
                rollout.reward, rollout.done = score_text(message["content"] or "", int(rollout.task["answer"])), True
                continue
            rollout.used_tool = True
            rollout.messages.append(message)
            for call in calls:  # the calculator on its JSON arguments, as the agents run it
                expression = json.loads(call["function"]["arguments"]).get("expression")
                value = evaluate(expression) if isinstance(expression, str) else "E"
                rollout.messages.append({"role": "tool", "tool_call_id": call["id"], "content": value})
    return rollouts  # a rollout still calling the tool after the budget keeps reward -0.1, as the agents score it


def assistant_message(template: Any, result: Any, prompt: Sequence[int]) -> dict[str, Any]:
    """The assistant message of generated ids, as the backend answers: tool calls parsed by the chat template when
    the answer ended on its own (one cut off by ``max_tokens`` is not a complete call and stays text)."""
    text = template.decode(result.token_ids)
    parsed = template.parse_response(result.token_ids, tools=TOOLS, prompt_ids=prompt, text=text)
    if parsed.tool_calls and result.finish_reason == "stop":
        return {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}
    return {"role": "assistant", "content": text if parsed.tool_calls else parsed.content}


def per_call_samples(rollouts: Sequence[Rollout], samples_per_task: int) -> tuple[list[TrainingSample], int]:
    """One sample per LLM call with GRPO advantages per task group (LightningRL's ``identical`` credit and
    ``grpo`` estimator, groups of equal rewards dropped); returns the samples and the number of groups dropped."""
    config = CreditConfig(drop_equal_groups=True)
    samples: list[TrainingSample] = []
    dropped = 0
    for start in range(0, len(rollouts), samples_per_task):
        group = rollouts[start : start + samples_per_task]
        rewards = [r.reward for r in group]
        if max(rewards) - min(rewards) <= config.equal_tolerance:
            dropped += 1
            continue
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))  # population std, as grpo
        for offset, rollout in enumerate(group):
            advantage = (rollout.reward - mean) / (std + config.eps)
            for step, (prompt, result) in enumerate(rollout.calls):
                samples.append(
                    TrainingSample(
                        prompt_token_ids=prompt,
                        response_token_ids=list(result.token_ids),
                        response_mask=[1] * len(result.token_ids),
                        response_logprobs=list(result.logprobs),
                        credit=rollout.reward,
                        advantage=advantage,
                        group_id=f"g{start}",
                        rollout_id=f"r{start + offset}",
                        attempt_id=f"a{start + offset}",
                        step_index=step,
                    )
                )
    return samples, dropped


def ppo_config(args: argparse.Namespace) -> PPOConfig:
    """The `PPOConfig` ``train.py --model smollm2`` builds from the same options (LoRA on q/k/v/o, KL to the base)."""
    lora = LoRASettings(r=args.lora_rank, alpha=2 * args.lora_rank)
    return PPOConfig(
        lr=args.lr,
        kl_coef=args.kl_coef,
        epochs=SMOLLM2["ppo_epochs"],
        entropy_coef=SMOLLM2["entropy_coef"],
        num_threads=args.threads,
        lora=lora,
    )


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _timed(phases: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, its wall and process CPU seconds set as ``phases[name]`` and ``phases[name + '_cpu']``."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    phases[name] = time.perf_counter() - wall
    phases[name + "_cpu"] = time.process_time() - cpu
    return out


@dataclass
class Learner:
    """The policy (LoRA), its optimizer, the merged copy that generates, and how it samples."""

    policy: Any
    optimizer: torch.optim.Optimizer
    served: Any
    template: HFChatTemplate
    config: PPOConfig
    opening: list[dict[str, Any]]
    sampling: SamplingParams
    generator: torch.Generator

    def iteration(self, tasks: list[dict[str, Any]], samples_per_task: int) -> tuple[dict[str, float], list[Rollout]]:
        """One iteration on ``tasks`` (each repeated ``samples_per_task`` times, a group): its phases and rollouts."""
        phases: dict[str, float] = dict.fromkeys(("update", "update_cpu", "sync", "sync_cpu"), 0.0)
        grouped = [task for task in tasks for _ in range(samples_per_task)]
        rollouts: list[Rollout] = _timed(phases, "generation", lambda: self.rollouts(grouped, self.sampling))
        samples, dropped = _timed(phases, "transitions", lambda: per_call_samples(rollouts, samples_per_task))
        phases.update(samples=float(len(samples)), groups_dropped=float(dropped), optimizer_steps=0.0)
        if samples:  # as RLLoop: no sample, no update and no sync
            batch = TrainingBatch(samples=samples)
            metrics = _timed(phases, "update", lambda: ppo_update(self.policy, self.optimizer, batch, self.config))
            phases["optimizer_steps"] = metrics["optimizer_steps"]
            _timed(phases, "sync", lambda: self.served.load_state_dict(merged_state_dict(self.policy)))
        return phases, rollouts

    def rollouts(self, tasks: Sequence[dict[str, Any]], params: SamplingParams) -> list[Rollout]:
        """The tasks' conversations with the served copy (greedy ones need no generator)."""
        generator = self.generator if params.temperature > 0 else None
        return run_rollouts(self.served, self.template, self.opening, tasks, params, generator)


def build_learner(args: argparse.Namespace) -> Learner:
    """Load the model as `TorchEngine` does: the LoRA policy, its optimizer, a merged copy for generation."""
    torch.set_num_threads(args.threads)
    os.environ[PROMPT_ENV] = str(args.prompt_file)
    config = ppo_config(args)
    loaded = load_model(args.model)
    policy = prepare_policy(loaded.model, config)
    return Learner(
        policy=policy,
        optimizer=make_optimizer(policy, config),
        served=merged_model(policy),  # the adapters merged into a plain copy, as the backend serves them
        template=HFChatTemplate(loaded.tokenizer, tool_parser="calc"),
        config=config,
        opening=prompt_messages(),
        sampling=SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens),
        generator=torch.Generator().manual_seed(args.seed),
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options (defaults: ``train.py --model smollm2``'s preset)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a chat model folder (e.g. SmolLM2's)")
    parser.add_argument("--prompt-file", type=Path, required=True, help="JSON messages that open each conversation")
    parser.add_argument("--iterations", type=int, default=SMOLLM2["iterations"])
    parser.add_argument("--seconds", type=float, default=3600.0, help="stop after this much wall time")
    parser.add_argument("--prompts", type=int, default=SMOLLM2["tasks_per_iteration"], help="tasks per iteration")
    parser.add_argument("--samples", type=int, default=SMOLLM2["samples_per_task"], help="rollouts per task")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=SMOLLM2["lr"])
    parser.add_argument("--kl-coef", type=float, default=SMOLLM2["kl_coef"])
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-tasks", type=int, default=8, help="held-out tasks evaluated greedily before/after")
    parser.add_argument("--train-tasks", type=Path, default=CALC / "data" / "train.jsonl")
    parser.add_argument("--val-tasks", type=Path, default=CALC / "data" / "val.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Train for ``--iterations`` (or ``--seconds``); a table row per iteration, then one JSON line."""
    args = parse_args(argv)
    learner = build_learner(args)
    train_tasks, val_tasks = _jsonl(args.train_tasks), _jsonl(args.val_tasks)[: args.eval_tasks]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    rng = random.Random(args.seed)  # the tasks RLLoop picks: task_order "random" with the same seed

    def accuracy() -> float:
        rollouts = learner.rollouts(val_tasks, greedy)
        return sum(r.reward == 1.0 for r in rollouts) / max(len(rollouts), 1)

    before = accuracy()
    columns = ("iter", "s/iter", "gen", "trans", "update", "sync", "reward", "tool", "kept")
    print(" ".join(f"{c:>7}" for c in columns))
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    for iteration in range(args.iterations):
        if time.perf_counter() - started > args.seconds:
            break
        tick = time.perf_counter()
        phases, rollouts = learner.iteration([rng.choice(train_tasks) for _ in range(args.prompts)], args.samples)
        calls = [result for r in rollouts for _, result in r.calls]
        row = {
            "iteration_s": time.perf_counter() - tick,
            **phases,
            "reward": statistics.fmean(r.reward for r in rollouts),
            "tool_use": statistics.fmean(r.used_tool for r in rollouts),
            "calls": float(len(calls)),
            "tokens": float(sum(len(c.token_ids) for c in calls)),
        }
        history.append(row)
        keys = ("iteration_s", "generation", "transitions", "update", "sync", "reward", "tool_use", "samples")
        print(f"{iteration:>7} " + " ".join(f"{row[k]:>7.3f}" for k in keys), flush=True)
    after = accuracy()
    print(json.dumps(summary(args, history, before, after, learner.policy)))
    return 0


def summary(
    args: argparse.Namespace, history: list[dict[str, float]], before: float, after: float, policy: Any
) -> dict[str, Any]:
    """The run's figures: means per iteration (wall and CPU of each phase), rewards, held-out accuracy."""

    def mean(key: str) -> float:
        return round(statistics.fmean(r[key] for r in history), 3) if history else 0.0

    lora_b = [p.detach() for name, p in policy.named_parameters() if "lora_B" in name]
    return {
        "mode": "chat",
        "model": str(args.model),
        "iterations": len(history),
        "seconds_per_iteration": mean("iteration_s"),
        **{f"{p}_seconds_per_iteration": mean(p) for p in ("generation", "transitions", "update", "sync")},
        **{f"{p}_cpu_seconds_per_iteration": mean(p + "_cpu") for p in ("generation", "transitions", "update", "sync")},
        "sample_seconds_per_iteration": mean("generation"),  # the toy mode's names for the same phase
        "sample_cpu_seconds_per_iteration": mean("generation_cpu"),
        "calls_per_iteration": mean("calls"),
        "tokens_per_iteration": mean("tokens"),
        "samples_per_iteration": mean("samples"),
        "samples_total": int(sum(r["samples"] for r in history)),
        "optimizer_steps": int(sum(r["optimizer_steps"] for r in history)),
        "groups_dropped": int(sum(r["groups_dropped"] for r in history)),
        # LoRA's B matrices start at zero: non-zero once an update has run
        "lora_b_norm": round(float(sum(float(b.norm()) for b in lora_b)), 6),
        "reward_first5": round(statistics.fmean(r["reward"] for r in history[:5]), 3) if history else 0.0,
        "reward_last5": round(statistics.fmean(r["reward"] for r in history[-5:]), 3) if history else 0.0,
        "tool_use_mean": mean("tool_use"),
        "greedy_accuracy_start": round(before, 3),
        "greedy_accuracy_end": round(after, 3),
        "prompts": args.prompts,
        "samples_per_prompt": args.samples,
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
    }


if __name__ == "__main__":
    raise SystemExit(main())
