"""Score the math agent on held-out problems against any OpenAI-compatible endpoint (vLLM, the local backend, ...).

The same AutoGen agent as in training (`agent.solve`), called directly: no store, no proxy, no tracing. Figures:
``accuracy`` (exact numeric match of the final answer), ``tool_rate`` (runs that called the calculator),
``distractor_rate`` (runs whose calculator expression used the distractor number; generated problems only),
``answered_rate`` (runs that ended with a text answer) and ``tool_accuracy`` (accuracy of the runs that called the
calculator: how exact the calculator path is).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from math_agent import Outcome, make_client, solve
from math_task import MathProblem, score, split_problems

__all__ = ["evaluate_endpoint", "evaluate_folder", "summarize"]

_INTEGER = re.compile(r"\d+")


def summarize(problems: Sequence[MathProblem], outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Accuracy, tool use, distractor use and answered rate of ``outcomes`` (one per problem)."""
    n = max(len(outcomes), 1)
    with_distractor = [(p, o) for p, o in zip(problems, outcomes, strict=True) if p.distractor is not None]
    tool_runs = [(p, o) for p, o in zip(problems, outcomes, strict=True) if o.used_tool]
    distracted = sum(any(str(p.distractor) in _INTEGER.findall(e) for e in o.expressions) for p, o in with_distractor)
    return {
        "accuracy": sum(score(o.final_text, p.answer) for p, o in zip(problems, outcomes, strict=True)) / n,
        "tool_rate": sum(o.used_tool for o in outcomes) / n,
        "distractor_rate": distracted / max(len(with_distractor), 1),
        "answered_rate": sum(o.final_text is not None for o in outcomes) / n,
        "tool_accuracy": sum(score(o.final_text, p.answer) for p, o in tool_runs) / max(len(tool_runs), 1),
        "problems": float(len(outcomes)),
    }


async def evaluate_endpoint(
    base_url: str,
    model: str,
    problems: Sequence[MathProblem],
    *,
    api_key: str | None = None,
    concurrency: int = 32,
    temperature: float = 0.0,
    max_tokens: int = 64,
) -> dict[str, float]:
    """Run the agent once on every problem (greedy by default) against ``base_url`` and summarise.

    A run that raises (the endpoint refused a request, say) counts as unanswered; the first error is re-raised when
    every run failed, so a wrong URL is one clear error, not a silent zero.
    """
    gate = asyncio.Semaphore(concurrency)
    errors: list[BaseException] = []

    async def one(problem: MathProblem) -> Outcome:
        async with gate:
            client = make_client(base_url, model, api_key, temperature=temperature, max_tokens=max_tokens)
            try:
                return await solve(problem.question, client)
            except Exception as error:  # one failed run must not lose the others
                errors.append(error)
                return Outcome(None)
            finally:
                await client.close()

    outcomes = await asyncio.gather(*(one(p) for p in problems))
    if errors and len(errors) == len(problems):
        raise RuntimeError(f"every run against {base_url} failed; the first error: {errors[0]!r}") from errors[0]
    return {**summarize(problems, outcomes), "errors": float(len(errors))}


def evaluate_folder(
    folder: str | Path, *, size: int = 128, seed: int = 0, threads: int = 1, temperature: float = 0.0
) -> dict[str, Any]:
    """Serve a model folder with the local backend on 127.0.0.1 and score it on ``size`` held-out problems.

    Greedy by default; ``temperature`` 1.0 samples as the training rollouts do.
    """
    from agentlightning_torch import LocalBackend, serve_backend

    _, held_out = split_problems(1, size, seed=seed)
    server = serve_backend(LocalBackend(str(folder), tool_parser="hermes", model_name="math-tiny", num_threads=threads))
    try:
        return asyncio.run(evaluate_endpoint(server.base_url, "math-tiny", held_out, temperature=temperature))
    finally:
        server.stop()
