"""Score the text-to-SQL agents against any OpenAI-compatible endpoint (vLLM, the torch backend, a hosted API).

    python examples/sql/sql_eval.py --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct
    python examples/sql/sql_eval.py --base-url URL --model NAME --spider path/to/spider --split dev --limit 200
    python examples/sql/sql_eval.py --model-dir DIR --prompt-file examples/sql/prompts/smollm2.json --limit 64

The same graph as in training (writer → checker → rewriter, ``sql_agent.py``), run directly with ``ChatOpenAI``:
no store, no proxy, no training (``--model-dir``: a model folder served here by the local backend; ``--prompt-file``:
the messages that open each agent's call, as ``train.py`` gives its runners). Greedy by default (``--temperature``).
Prints accuracy per query shape and ends with one JSON line (``accuracy``, ``tasks``, ``rewriter_rate``, ``errors``,
``by_shape``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from langchain_core.messages import BaseMessage
from sql_agent import MAX_REWRITES, prompt_messages, run_sql_agent, score
from sql_data import load_tasks

HERE = Path(__file__).resolve().parent

__all__ = ["evaluate_endpoint", "evaluate_folder", "main"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://host:8000/v1")
    where.add_argument("--model-dir", type=Path, help="a model folder to serve here (local backend, 127.0.0.1)")
    parser.add_argument("--model", default="sql-tiny", help="model name the endpoint serves")
    parser.add_argument("--prompt-file", type=Path, help="JSON messages that open each agent's call (prompts/)")
    parser.add_argument("--threads", type=int, default=1, help="--model-dir: torch threads of the local backend")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "not-needed"))
    parser.add_argument("--tasks", type=Path, default=HERE / "data" / "val.jsonl", help="JSONL tasks (held-out)")
    parser.add_argument("--spider", type=Path, help="a local Spider folder (tables.json, <split>.json, database/)")
    parser.add_argument("--split", default="dev", help="Spider question file without .json")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N tasks")
    parser.add_argument("--concurrency", type=int, default=16, help="questions in flight at once")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-rewrites", type=int, default=MAX_REWRITES)
    return parser.parse_args(argv)


def read_tasks(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The tasks to score: Spider questions with ``--spider``, else the JSONL file."""
    if args.spider is not None:
        from sql_spider import load_spider

        return [task.to_dict() for task in load_spider(args.spider, args.split, limit=args.limit)]
    return load_tasks(args.tasks)[: args.limit]


async def evaluate_endpoint(
    base_url: str,
    model: str,
    tasks: Sequence[dict[str, Any]],
    *,
    api_key: str = "not-needed",
    concurrency: int = 16,
    temperature: float = 0.0,
    max_tokens: int = 256,
    max_rewrites: int = MAX_REWRITES,
    prompts: dict[str, list[BaseMessage]] | None = None,
) -> dict[str, Any]:
    """Run every task once through the graph against ``base_url``: accuracy overall and per shape, rewriter use
    (``prompts``: the messages opening each agent's call, `sql_agent.prompt_messages`).

    A run that raises (the endpoint refused a request, say) scores 0 and counts in ``errors``; when every run
    fails the first error is raised, so a wrong URL is one clear error rather than a silent zero.
    """
    from langchain_openai import ChatOpenAI

    if not tasks:
        raise ValueError("no tasks to score")
    llm = ChatOpenAI(
        model=model,
        base_url=base_url,
        api_key=api_key,  # pyright: ignore[reportArgumentType]
        temperature=temperature,
        max_completion_tokens=max_tokens,
        max_retries=2,
    )
    gate = asyncio.Semaphore(max(concurrency, 1))
    errors: list[BaseException] = []

    async def one(task: dict[str, Any]) -> tuple[str, float, int]:
        async with gate:
            try:
                state = await run_sql_agent(llm, task, max_rewrites, prompts)
            except Exception as error:  # one failed run must not lose the others
                errors.append(error)
                return str(task.get("shape", "?")), 0.0, 0
        return str(task.get("shape", "?")), score(task, state.get("sql", "")), state.get("rewrites", 0)

    results = await asyncio.gather(*(one(task) for task in tasks))
    if len(errors) == len(tasks):
        raise RuntimeError(f"every run against {base_url} failed; the first error: {errors[0]!r}") from errors[0]
    by_shape: dict[str, list[float]] = {}
    for shape, reward, _ in results:
        by_shape.setdefault(shape, []).append(reward)
    return {
        "accuracy": round(sum(r for _, r, _ in results) / len(results), 4),
        "tasks": len(results),
        "rewriter_rate": round(sum(1 for *_, n in results if n) / len(results), 4),
        "errors": len(errors),
        "by_shape": {shape: round(sum(v) / len(v), 4) for shape, v in sorted(by_shape.items())},
        "model": model,
    }


def evaluate_folder(
    folder: str | Path,
    *,
    size: int = 100,
    temperature: float = 0.0,
    threads: int = 1,
    max_tokens: int = 64,
    tasks: Sequence[dict[str, Any]] | None = None,
    prompts: dict[str, list[BaseMessage]] | None = None,
) -> dict[str, Any]:
    """Serve a model folder with the local backend on 127.0.0.1 and score it on ``tasks`` (default: the first
    ``size`` held-out tasks); ``prompts`` open each agent's call (`sql_agent.prompt_messages`)."""
    from agentlightning_torch import LocalBackend, serve_backend

    chosen = list(tasks) if tasks is not None else load_tasks(HERE / "data" / "val.jsonl")[:size]
    server = serve_backend(LocalBackend(str(folder), model_name="sql-tiny", num_threads=threads))
    try:
        return asyncio.run(
            evaluate_endpoint(
                server.base_url,
                "sql-tiny",
                chosen,
                temperature=temperature,
                max_tokens=max_tokens,
                concurrency=64,
                prompts=prompts,
            )
        )
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        tasks = read_tasks(args)
        prompts = prompt_messages(args.prompt_file) if args.prompt_file is not None else None
        if args.model_dir is not None:
            if not (args.model_dir / "config.json").is_file():
                raise ValueError(f"--model-dir {str(args.model_dir)!r} is not a model folder (no config.json)")
            summary = evaluate_folder(
                args.model_dir,
                tasks=tasks,
                temperature=args.temperature,
                threads=args.threads,
                max_tokens=args.max_tokens,
                prompts=prompts,
            )
            return _report(summary)
        summary = asyncio.run(
            evaluate_endpoint(
                args.base_url,
                args.model,
                tasks,
                api_key=args.api_key,
                concurrency=args.concurrency,
                temperature=args.temperature,
                max_tokens=args.max_tokens,
                max_rewrites=args.max_rewrites,
                prompts=prompts,
            )
        )
    except (ValueError, RuntimeError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return _report(summary)


def _report(summary: dict[str, Any]) -> int:
    """Accuracy per shape and overall on stderr, the JSON line on stdout."""
    for shape, accuracy in summary["by_shape"].items():
        print(f"{shape:12s} {accuracy:.2f}", file=sys.stderr)
    print(f"execution accuracy {summary['accuracy']:.2f} on {summary['tasks']} questions", file=sys.stderr)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
