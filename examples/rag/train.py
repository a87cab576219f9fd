"""Train the RAG agent (OpenAI Agents SDK + a search tool) with RL on a CPU, or score any served model with it.

    python examples/rag/train.py                       # the README's run: 20 iterations, a table, a plot, JSON
    python examples/rag/train.py --iterations 60       # longer (held-out points every --eval-every 10)
    python examples/rag/train.py eval --base-url http://localhost:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct
    python examples/rag/train.py eval --model-dir examples/rag/checkpoint       # serve a folder locally and score it

What runs in training: this process serves the small model (local batched backend) behind the LLM proxy and trains it;
runner processes (``agl runner --agent rag_agent:rag_agent --instrument openai_agents``) run the Agents SDK agent on
rollouts taken from the SQLite store. Every LLM call goes agent -> proxy (records token ids) -> backend; spans go to the
store; each iteration turns spans + token records into transitions, LightningRL credit (GRPO), a PPO step and a new
model version served back. Each rollout also annotates its searches (how many, and whether they retrieved the gold
document of hop 1 and hop 2); this script averages them per iteration into ``metrics.jsonl``. Every ``--eval-every``
iterations the held-out questions are scored greedily, the best weights kept in ``checkpoint/best``; the scaffolding is
`agentlightning_torch.runkit`.
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

from rag_task import DataError, RagTask, best_f1, read_tasks  # noqa: E402

from agentlightning_torch.runkit import (  # noqa: E402
    SCRIPT_DEFAULTS,
    STABLE_RL,
    AgentRunners,
    RunResult,
    RunSettings,
    TrainingRun,
    UsageError,
    add_run_arguments,
    plot_run,
    print_table,
    ray_settings,
    run_main,
    total_workers,
)

STABLE: dict[str, Any] = {**STABLE_RL, "iterations": 20}  # the README's run: the same figures on any machine
"""The RL settings the README measured (3 seeds, and a run 3x as long): see the README's "Stable" section."""

SEARCH_KEYS = ("searches", "hop1_hit", "hop2_hit", "all_hops_hit")
"""The per-rollout annotations of `rag_agent.rag_agent`, averaged per iteration."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data", type=Path, default=HERE / "data", help="folder with corpus/train/val .jsonl")
    common.add_argument("--eval-size", type=int, default=64, help="held-out questions to evaluate on")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common]
    )
    parser.add_argument("--model-dir", type=Path, default=HERE / "checkpoint", help="warm-started model folder")
    add_run_arguments(parser, output=Path("runs") / "rag", **{**SCRIPT_DEFAULTS, "runners": 1, "workers": 64, **STABLE})
    parser.add_argument(
        "--keep-equal-groups", action="store_true", help="train on groups whose rollouts all scored alike too"
    )
    commands = parser.add_subparsers(dest="command")
    scoring = commands.add_parser("eval", parents=[common], help="score a model on the held-out questions")
    where = scoring.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="an OpenAI-compatible endpoint (vLLM, ...), e.g. http://host:8000/v1")
    where.add_argument("--model-dir", type=Path, help="serve this model folder locally and score it")
    scoring.add_argument("--model", help="model name at --base-url")
    scoring.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or "not-needed")
    scoring.add_argument("--temperature", type=float, default=0.0)
    scoring.add_argument("--max-tokens", type=int, default=64)
    scoring.add_argument("--concurrency", type=int, default=32)
    scoring.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    scoring.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    return parser.parse_args(argv)


def load_data(folder: Path, eval_size: int) -> tuple[Path, list[RagTask], list[RagTask]]:
    """The corpus file and the train / held-out tasks of a data folder (``make_data.py`` writes one)."""
    try:
        train, val = read_tasks(folder / "train.jsonl"), read_tasks(folder / "val.jsonl")
    except DataError as error:
        raise UsageError(str(error)) from None
    corpus = folder / "corpus.jsonl"
    if not corpus.is_file():
        raise UsageError(f"corpus file {str(corpus)!r} does not exist (run examples/rag/make_data.py)")
    if eval_size < 1:
        raise UsageError("--eval-size must be at least 1")
    return corpus, train, val[:eval_size]


# ----- evaluation against any OpenAI-compatible endpoint ----------------------------------------------------------


async def score(base_url: str, model: str, tasks: list[RagTask], args: argparse.Namespace) -> dict[str, float]:
    """Run the agent on every task against ``base_url`` (no store, no proxy); mean F1 and search figures."""
    from agents import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI
    from rag_agent import SearchLog, answer_question, retrieval_hits, search_index

    client = AsyncOpenAI(base_url=base_url, api_key=args.api_key, max_retries=2)
    chat_model = OpenAIChatCompletionsModel(model=model, openai_client=client)
    limit = asyncio.Semaphore(max(args.concurrency, 1))
    rows: list[dict[str, float]] = []

    async def one(task: RagTask) -> None:
        async with limit:
            log = SearchLog(index=search_index())
            answer = await answer_question(
                task.question, chat_model, log, temperature=args.temperature, max_tokens=args.max_tokens
            )
        hits = retrieval_hits(log, list(task.gold_titles))
        rows.append(
            {
                "f1": best_f1(answer, [task.answer, *task.aliases]),
                "searches": float(len(log.queries)),
                "hop1_hit": float(hits[0]),
                "hop2_hit": float(len(hits) > 1 and hits[1]),
                "all_hops_hit": float(all(hits)),
            }
        )

    await asyncio.gather(*(one(task) for task in tasks))
    return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}


async def evaluate_endpoint(args: argparse.Namespace) -> dict[str, Any]:
    corpus, _, val = load_data(args.data, args.eval_size)
    os.environ["RAG_CORPUS"] = str(corpus)
    if args.base_url is not None:
        if not args.model:
            raise UsageError("eval --base-url needs --model (the served model's name)")
        figures = await score(args.base_url, args.model, val, args)
        return {"model": args.model, "base_url": args.base_url, "tasks": len(val), **figures}
    from agentlightning_torch import BackendServer, LocalBackend, load_model

    if not args.model_dir.is_dir():
        raise UsageError(f"model folder {str(args.model_dir)!r} does not exist")
    import torch

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model_dir, device=args.device)
    backend = LocalBackend(
        loaded.model,
        loaded.tokenizer,
        device=args.device,
        model_name="rag",
        tool_parser="hermes",
        generation_config=loaded.generation_config,
        num_threads=args.threads,
    )
    server = BackendServer(backend).start()
    try:
        figures = await score(server.url + "/v1", "rag", val, args)
    finally:
        server.stop()
    return {"model_dir": str(args.model_dir), "tasks": len(val), **figures}


# ----- training ------------------------------------------------------------------------------------------------


async def search_figures(store: Any, rollout_ids: list[str]) -> dict[str, float]:
    """Means of the rollouts' search annotations (`SEARCH_KEYS`) over ``rollout_ids``."""
    from agentlightning import semconv

    totals = dict.fromkeys(SEARCH_KEYS, 0.0)
    counted = 0
    for rollout_id in rollout_ids:
        spans = await store.query_spans(rollout_id)
        notes = [s.attributes for s in spans if s.attributes.get(semconv.SPAN_KIND) == semconv.KIND_ANNOTATION]
        if not notes:
            continue
        counted += 1
        for key in SEARCH_KEYS:
            totals[key] += float(notes[-1].get(semconv.ANNOTATION_PREFIX + key, 0))
    return {key: value / counted for key, value in totals.items()} if counted else {}


async def search_figures_per_line(store: Any) -> tuple[dict[int, dict[str, float]], list[dict[str, float]]]:
    """The search figures of every training iteration (by iteration) and every evaluation (in order), from the ids
    the loop gives rollouts: ``it{N}-{ns}-t..`` for iteration N + 1, ``eval{N}-{ns}-t..`` for an evaluation."""
    groups: dict[str, list[str]] = {}
    for rollout in await store.query_rollouts():
        groups.setdefault(rollout.rollout_id.rsplit("-t", 1)[0], []).append(rollout.rollout_id)
    train = {int(key.split("-")[0][2:]) + 1: await search_figures(store, ids) for key, ids in groups.items()
             if key.startswith("it")}  # fmt: skip
    evals = sorted((key for key in groups if key.startswith("eval")), key=lambda key: int(key.split("-")[1]))
    return train, [await search_figures(store, groups[key]) for key in evals]


def build_config(args: argparse.Namespace) -> Any:
    from agentlightning_torch.runkit import trainer_config

    if args.runners < 1 and not args.runners_ray:
        raise UsageError("--workers and --runners must be at least 1")
    return trainer_config(
        args,
        model_dir=args.model_dir,
        model_name="rag",
        tool_parser="hermes",
        max_tokens=48,
        transition_mode="trajectory",
        drop_equal_groups=not args.keep_equal_groups,
    )


class RagRun(TrainingRun):
    """Also scores the held-out questions sampled (before and after RL), and adds every line's search figures."""

    def __init__(self, trainer: Any, settings: RunSettings) -> None:
        super().__init__(trainer, settings)
        self.sampled: dict[str, Any] = {}  # the sampled evaluations' reports, "before" and "after"

    def status(self, report: Any) -> str:
        return super().status(report) + f"  model calls per episode {report.calls_per_rollout:.2f}"

    async def evaluated(self, report: Any, when: str) -> None:
        self.sampled[when] = await self.evaluate(greedy=False)

    async def finished(self, result: RunResult) -> None:
        train, evals = await search_figures_per_line(self.store)
        for report in result.history:
            report.metrics.update(train.get(report.iteration, {}))
        for report, figures in zip(result.evaluations, evals, strict=False):
            report.metrics.update(figures)
        metrics = self.settings.output / "metrics.jsonl"  # the loop's lines, with the search figures merged in
        lines = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
        eval_lines = iter(evals)
        for line in lines:
            figures = train.get(line["iteration"], {}) if line["kind"] == "train" else next(eval_lines, {})
            line["metrics"].update(figures)
        metrics.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        result.extra["sampled"] = self.sampled


async def train(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate, train within the budget (held-out points every --eval-every), evaluate again; the run's figures."""
    from agentlightning_torch import TorchTrainer

    config = build_config(args)
    corpus, train_tasks, val_tasks = load_data(args.data, args.eval_size)
    settings = RunSettings(
        output=args.output,
        train_tasks=[t.to_dict() for t in train_tasks],
        val_tasks=[t.to_dict() for t in val_tasks],
        runners=AgentRunners(
            "rag_agent:rag_agent",
            app_dir=HERE,
            instrument="openai_agents",
            worker_mode="async",
            env={"RAG_CORPUS": str(corpus)},
        ),
        processes=args.runners,
        ray=ray_settings(args),  # --runners ray: runner actors placed by Ray
        workers=total_workers(args),  # --workers is per runner process
        quiet=args.quiet,
    )
    result = await RagRun(TorchTrainer(config), settings).execute()
    history, before, after = result.history, result.before, result.after
    assert before is not None and after is not None  # held-out questions always exist (load_data)
    plot = args.output / "reward_curve.png"
    curves = [
        ("mean F1 (sampled)", lambda r: r.reward_mean),
        ("hop-2 document retrieved", lambda r: r.metrics.get("hop2_hit", 0.0)),
        ("searches per episode / 2", lambda r: r.metrics.get("searches", 0.0) / 2),
    ]
    title = "Two-hop RAG agent (OpenAI Agents SDK) trained with Agent Lightning on CPU"
    plot_run(result, plot, title=title, curves=curves, ylim=(-0.05, 1.05))
    sampled = result.extra["sampled"]
    summary = result.summary()
    figures: dict[str, Any] = {
        "reward_before": summary["held_out_before"],
        "reward_best": summary["held_out_best"],
        "reward_after": summary["held_out_last"],
        "sampled_reward_before": round(sampled["before"].reward_mean, 4),
        "sampled_reward_after": round(sampled["after"].reward_mean, 4),
    }
    for key in SEARCH_KEYS:
        figures[f"{key}_before"] = round(before.metrics.get(key, 0.0), 4)
        figures[f"{key}_after"] = round(after.metrics.get(key, 0.0), 4)
    tail = history[-5:]
    return {
        **figures,
        "train_reward_first": round(history[0].reward_mean, 4),
        "train_reward_last5": round(sum(r.reward_mean for r in tail) / len(tail), 4),
        "rl_seconds": summary["seconds"],
        **summary,
        "eval_tasks": len(val_tasks),
        "plot": str(plot),
    }


def show(summary: dict[str, Any]) -> None:
    """The before / best / last table on stderr."""
    from rich.console import Console

    s = summary
    rows: list[tuple[str, float | None, float | None, float | None]] = [
        ("mean F1, greedy", s["reward_before"], s["reward_best"], s["reward_after"])
    ]
    rows.append(("mean F1, sampled", s["sampled_reward_before"], None, s["sampled_reward_after"]))
    labels = ("searches per question", "hop-1 document retrieved", "hop-2 document retrieved", "both retrieved")
    for label, key in zip(labels, SEARCH_KEYS, strict=True):
        rows.append((label, s[f"{key}_before"], None, s[f"{key}_after"]))
    print_table("Two-hop RAG agent on held-out questions: before and after RL", rows)
    Console(stderr=True).print(
        f"{s['iterations']} iterations in {s['seconds']:.0f} s of RL; best held-out at iteration {s['best_iteration']}"
        f"; plot: {s['plot']}"
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.command == "eval":
        try:
            summary = asyncio.run(evaluate_endpoint(args))
        except UsageError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(json.dumps(summary))
        return 0
    return run_main(lambda: train(args), show)


if __name__ == "__main__":
    from agentlightning_torch.runkit import exit_process

    exit_process(main())  # no interpreter teardown of torch's objects (~1.5 s of CPU)
