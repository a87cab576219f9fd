"""Train the RAG agent (OpenAI Agents SDK + a search tool) with RL on a CPU, or score any served model with it.

    python examples/rag/train.py                       # ~10 minutes of RL, then a table, a plot and a JSON line
    python examples/rag/train.py --minutes 2           # shorter
    python examples/rag/train.py eval --base-url http://localhost:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct
    python examples/rag/train.py eval --model-dir examples/rag/checkpoint       # serve a folder locally and score it

What runs in training: this process serves the small model (local batched backend) behind the LLM proxy and trains
it; runner processes (``run_agents.py``, i.e. ``agl runner``) run the Agents SDK agent on rollouts taken from the
SQLite store. Every LLM call goes agent -> proxy (records token ids) -> backend; spans go to the store; each
iteration turns spans + token records into transitions, LightningRL credit (GRPO), a PPO step and a new model
version served back. Each rollout also annotates its searches (how many, and whether they retrieved the gold
document of hop 1 and hop 2); this script averages them per iteration into ``metrics.jsonl``.
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rag_task import DataError, RagTask, best_f1, read_tasks  # noqa: E402

SEARCH_KEYS = ("searches", "hop1_hit", "hop2_hit", "all_hops_hit")
"""The per-rollout annotations of `rag_agent.rag_agent`, averaged per iteration."""


class UsageError(Exception):
    """Bad input from the command line or a data file; printed as one clear line, exit code 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data", type=Path, default=HERE / "data", help="folder with corpus/train/val .jsonl")
    common.add_argument("--eval-size", type=int, default=64, help="held-out questions to evaluate on")
    common.add_argument("--threads", type=int, default=1, help="torch CPU threads (few is faster on small machines)")
    common.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common]
    )
    parser.add_argument("--model-dir", type=Path, default=HERE / "checkpoint", help="warm-started model folder")
    parser.add_argument("--output", type=Path, default=Path("runs") / "rag", help="run folder (store, metrics, plot)")
    parser.add_argument("--minutes", type=float, default=10.0, help="RL time budget in minutes")
    parser.add_argument("--iterations", type=int, default=1000, help="most RL iterations")
    parser.add_argument("--tasks-per-iteration", type=int, default=8)
    parser.add_argument("--samples-per-task", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4, help="policy learning rate")
    parser.add_argument("--workers", type=int, default=64, help="concurrent rollouts over all runner processes")
    parser.add_argument("--runners", type=int, default=1, help="local runner processes")
    parser.add_argument("--rollout-timeout", type=float, default=180.0, help="seconds an iteration waits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep-equal-groups", action="store_true", help="train on groups whose rollouts all scored alike too"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
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


async def new_rollouts(store: Any, seen: set[str], prefix: str) -> list[str]:
    """Ids of finished rollouts whose id starts with ``prefix`` not in ``seen`` (added to it)."""
    rollouts = await store.query_rollouts(status=["succeeded"])
    fresh = [r.rollout_id for r in rollouts if r.rollout_id.startswith(prefix) and r.rollout_id not in seen]
    seen.update(fresh)
    return fresh


def build_config(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from agentlightning_torch import PPOConfig, TorchTrainerConfig

    if args.minutes <= 0 or args.workers < 1 or args.runners < 1:
        raise UsageError("--minutes must be positive and --workers, --runners at least 1")
    try:
        return TorchTrainerConfig(
            model_dir=args.model_dir,
            model_name="rag",
            tool_parser="hermes",
            output_dir=args.output,
            device=args.device,
            num_threads=args.threads,
            iterations=args.iterations,
            time_budget_s=args.minutes * 60,
            tasks_per_iteration=args.tasks_per_iteration,
            samples_per_task=args.samples_per_task,
            max_tokens=48,
            transition_mode="trajectory",
            drop_equal_groups=not args.keep_equal_groups,
            ppo=PPOConfig(lr=args.lr, num_threads=args.threads),
            seed=args.seed,
            checkpoint_every=0,
            rollout_timeout_s=args.rollout_timeout,
        )
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in error.errors())
        raise UsageError(f"invalid setting: {problems}") from None


def start_runners(db: Path, workers: int, runners: int, corpus: Path) -> list[subprocess.Popen[bytes]]:
    """``runners`` local runner processes (``run_agents.py``) sharing ``workers`` concurrent rollouts.

    Tied to this process (`agentlightning.cli.start_runners`): even a ``kill -9`` of the trainer ends them.
    """
    from agentlightning.cli import start_runners as start_runner_processes

    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAG_CORPUS": str(corpus)}
    commands = []
    for index in range(runners):
        share = workers // runners + (1 if index < workers % runners else 0)
        commands.append([sys.executable, str(HERE / "run_agents.py"), "--db", str(db), "--workers", str(max(share, 1))])
    return start_runner_processes(commands, env)


def plot(history: list[Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    elapsed, total = [], 0.0
    for report in history:
        total += report.seconds
        elapsed.append(total / 60)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(elapsed, [r.reward_mean for r in history], label="mean F1 (sampled)")
    ax.plot(elapsed, [r.metrics.get("hop2_hit", 0.0) for r in history], label="hop-2 document retrieved", ls="--")
    ax.plot(elapsed, [r.metrics.get("searches", 0.0) / 2 for r in history], label="searches per episode / 2", ls=":")
    ax.set_xlabel("RL time (minutes)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Two-hop RAG agent (OpenAI Agents SDK) trained with Agent Lightning on CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def train(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    import agentlightning as agl
    from agentlightning.cli import cancel_on_sigterm, guarded, stop_children
    from agentlightning_torch import TorchTrainer

    cancel_on_sigterm()  # a `kill` ends the run like Ctrl-C: through the cleanup below, then one line
    console = Console(stderr=True)
    corpus, train_tasks, val_tasks = load_data(args.data, args.eval_size)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "metrics.jsonl").unlink(missing_ok=True)
    db = args.output / "store.db"
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)
    store = agl.SqliteStore(db)
    runners = start_runners(db, args.workers, args.runners, corpus)
    reports: list[Any] = []  # every report in order, with the search figures merged in (-> metrics.jsonl)
    seen: set[str] = set()
    trainer = TorchTrainer(config)

    async def evaluate(greedy: bool) -> Any:
        report = await guarded(runners, trainer.evaluate(store, [t.to_dict() for t in val_tasks], greedy=greedy))
        report.metrics.update(await search_figures(store, await new_rollouts(store, seen, "eval")))
        report.metrics["greedy"] = float(greedy)
        reports.append(report)
        return report

    progress = Progress(
        TextColumn("[bold]RL"), BarColumn(), TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
        console=console, disable=args.quiet,
    )  # fmt: skip
    try:
        await trainer.start(store)
        console.print(f"[bold]evaluating[/] the warm-started policy on {len(val_tasks)} held-out questions")
        before = {"greedy": await evaluate(True), "sampled": await evaluate(False)}
        bar = progress.add_task("rl", total=config.time_budget_s, status="starting")
        started = time.monotonic()
        with progress:
            while trainer.iteration < config.iterations and time.monotonic() - started < config.time_budget_s:
                report = await guarded(runners, trainer.train_iteration(store, [t.to_dict() for t in train_tasks]))
                fresh = await new_rollouts(store, seen, f"it{report.iteration - 1}-")
                report.metrics.update(await search_figures(store, fresh))
                reports.append(report)
                status = (
                    f"it {report.iteration:3d}  F1 {report.reward_mean:.2f}  searches "
                    f"{report.metrics.get('searches', 0):.2f}  hop-2 hit {report.metrics.get('hop2_hit', 0):.2f}"
                    f"  {report.seconds:.1f}s/it"
                )
                progress.update(bar, completed=min(time.monotonic() - started, config.time_budget_s), status=status)
        rl_seconds = time.monotonic() - started
        after = {"greedy": await evaluate(True), "sampled": await evaluate(False)}
        trainer.save_checkpoint()
    finally:
        # The runners first, while the proxy still answers them (they hand their rollouts back as they drain), and
        # from a thread: the proxy runs on this loop.
        await asyncio.to_thread(stop_children, runners)
        await trainer.stop()
        await store.close()
    history = trainer.history
    if not history:
        raise UsageError("no RL iteration finished within the time budget; raise --minutes")
    with (args.output / "metrics.jsonl").open("w", encoding="utf-8") as out:  # the loop's lines + search figures
        out.writelines(json.dumps(report.__dict__) + "\n" for report in reports)
    plot(history, args.output / "reward_curve.png")
    summary: dict[str, Any] = {
        "reward_before": round(before["greedy"].reward_mean, 4),
        "reward_after": round(after["greedy"].reward_mean, 4),
        "sampled_reward_before": round(before["sampled"].reward_mean, 4),
        "sampled_reward_after": round(after["sampled"].reward_mean, 4),
    }
    for key in SEARCH_KEYS:
        summary[f"{key}_before"] = round(before["greedy"].metrics.get(key, 0.0), 4)
        summary[f"{key}_after"] = round(after["greedy"].metrics.get(key, 0.0), 4)
    summary.update(
        {
            "train_reward_first": round(history[0].reward_mean, 4),
            "train_reward_last5": round(sum(r.reward_mean for r in history[-5:]) / len(history[-5:]), 4),
            "rl_seconds": round(rl_seconds, 1),
            "iterations": len(history),
            "seconds_per_iteration": round(sum(r.seconds for r in history) / len(history), 3),
            "eval_tasks": len(val_tasks),
            "plot": str(args.output / "reward_curve.png"),
        }
    )
    return summary


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Two-hop RAG agent on held-out questions: before and after RL")
    table.add_column("measure")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    rows = [
        ("mean F1, greedy", "reward"),
        ("mean F1, sampled", "sampled_reward"),
        ("searches per question", "searches"),
        ("hop-1 document retrieved", "hop1_hit"),
        ("hop-2 document retrieved", "hop2_hit"),
        ("both retrieved", "all_hops_hit"),
    ]
    for label, key in rows:
        table.add_row(label, f"{summary[key + '_before']:.2f}", f"{summary[key + '_after']:.2f}")
    console = Console(stderr=True)
    console.print(table)
    console.print(f"{summary['iterations']} iterations in {summary['rl_seconds']:.0f} s of RL; plot: {summary['plot']}")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from agentlightning.cli import RunnerDied

    try:
        if args.command == "eval":
            summary = asyncio.run(evaluate_endpoint(args))
        else:
            config = build_config(args)
            load_data(args.data, args.eval_size)
            from agentlightning import run_async  # uvloop when installed

            summary = run_async(train(args, config))
            print_table(summary)
    except (UsageError, RunnerDied) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except asyncio.CancelledError:  # SIGTERM (cancel_on_sigterm)
        print("terminated", file=sys.stderr)
        return 143
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
