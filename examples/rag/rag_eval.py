"""A direct (no HTTP, no store) evaluation of the RAG example's small model: the agent's protocol over batched
generation, to measure what a warm start does, in particular how exact its search path is.

    python examples/rag/rag_model.py evaluate --model examples/rag/checkpoint
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rag_index import SearchIndex  # noqa: E402
from rag_model import MAX_TURNS, SEARCH_TOOL, TOP_K, new_conversation  # noqa: E402
from rag_task import RagTask, best_f1, make_world, read_corpus, read_tasks  # noqa: E402

__all__ = ["EVAL_SEED", "evaluate", "run_episodes"]


@dataclass
class _Episode:
    task: RagTask
    messages: list[dict[str, Any]]
    queries: list[str] = field(default_factory=list[str])
    answer: str | None = None


def run_episodes(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[RagTask],
    index: SearchIndex,
    *,
    temperature: float,
    force_search: bool = False,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Run the agent's protocol on every task (all first turns in one batch, then all second turns, ...).

    ``force_search`` writes ``<tool_call>`` as the first token of the first turn (the model writes the rest): it
    measures the search path itself, whatever the model would choose. Returns per task: its queries, the answer
    (``""`` when out of turns), F1 and whether each query named its hop's gold document exactly.
    """
    import torch

    from agentlightning_torch import HFChatTemplate, SamplingParams, generate_batch

    template = HFChatTemplate(tokenizer, tool_parser="hermes")
    call_token = int(tokenizer.convert_tokens_to_ids("<tool_call>"))
    params = SamplingParams(temperature=temperature, max_tokens=48)
    generator = torch.Generator().manual_seed(seed)
    episodes = [_Episode(task, new_conversation(task.question)) for task in tasks]
    for turn in range(MAX_TURNS):
        active = [e for e in episodes if e.answer is None]
        if not active:
            break
        forced = [call_token] if force_search and turn == 0 else []
        prompts = [template.render(e.messages, tools=[SEARCH_TOOL]) + forced for e in active]
        results = generate_batch(
            model,
            prompts,
            [params] * len(prompts),
            eos_token_id=int(tokenizer.eos_token_id),
            pad_token_id=int(tokenizer.pad_token_id),
            generator=generator,
        )
        for episode, result in zip(active, results, strict=True):
            parsed = template.parse_response(forced + list(result.token_ids), tools=[SEARCH_TOOL])
            if not parsed.tool_calls:
                episode.answer = parsed.content or ""
                continue
            call = parsed.tool_calls[0]
            query = str(json.loads(call["function"]["arguments"]).get("query", ""))
            episode.queries.append(query)
            found = "\n".join(f"{d.title}: {d.text}" for d in index.search(query, TOP_K)) or "No match."
            episode.messages += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": found},
            ]
    rows = []
    for episode in episodes:
        task, queries, answer = episode.task, episode.queries, episode.answer or ""
        rows.append(
            {
                "queries": queries,
                "answer": answer,
                "f1": best_f1(answer, [task.answer, *task.aliases]),
                "query1_exact": len(queries) > 0 and queries[0] == task.gold_titles[0],
                "query2_exact": len(queries) > 1 and queries[1] == task.gold_titles[-1],
            }
        )
    return rows


EVAL_SEED = 1_000_003
"""Seed of the fresh world the evaluation adds to the shipped held-out questions."""


def evaluate(model: Any, tokenizer: Any, data: Path = HERE / "data") -> dict[str, float]:
    """The warm start's figures on the shipped held-out questions (``data/val.jsonl``) and on a fresh world.

    ``sampled_*``/``greedy_*``: what it does on its own (search rate, mean F1). ``path_*``: with the first token
    forced to ``<tool_call>``: F1 and exact queries of the search path (greedy), and F1 sampled at temperature 1.
    ``sampled_search_path_f1``: mean F1 of the sampled episodes that did search.
    """
    fresh = make_world(EVAL_SEED)
    sets = [
        (read_tasks(data / "val.jsonl"), SearchIndex.in_memory(read_corpus(data / "corpus.jsonl"))),
        (fresh.tasks, SearchIndex.in_memory(fresh.documents)),
    ]

    def run(**options: Any) -> list[dict[str, Any]]:
        return [row for tasks, index in sets for row in run_episodes(model, tokenizer, tasks, index, **options)]

    def mean(rows: list[dict[str, Any]], key: str) -> float:
        return sum(float(r[key]) for r in rows) / max(len(rows), 1)

    sampled, greedy = run(temperature=1.0), run(temperature=0.0)
    path, path_sampled = run(temperature=0.0, force_search=True), run(temperature=1.0, force_search=True, seed=1)
    searched = [r for r in sampled if r["queries"]]
    return {
        "episodes": float(len(sampled)),
        "sampled_f1": mean(sampled, "f1"),
        "sampled_search_rate": sum(bool(r["queries"]) for r in sampled) / len(sampled),
        "sampled_search_path_f1": mean(searched, "f1"),
        "greedy_f1": mean(greedy, "f1"),
        "greedy_search_rate": sum(bool(r["queries"]) for r in greedy) / len(greedy),
        "path_f1": mean(path, "f1"),
        "path_query1_exact": mean(path, "query1_exact"),
        "path_query2_exact": mean(path, "query2_exact"),
        "path_sampled_f1": mean(path_sampled, "f1"),
    }
