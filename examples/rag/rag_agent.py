"""The RAG agent: an ordinary OpenAI Agents SDK agent with a ``search`` tool over a local SQLite FTS5 index.

The Agent Lightning lines are ``agentlightning_openai_agents.instrument()`` (tracing: the SDK's own traces become
spans), the ``@agl.rollout`` decorator (the runner calls it with a task and the current resources),
``agl.llm_base_url()`` (the per-rollout URL of the LLM proxy; in a deployed app it would be configuration) and an
``agl.emit_annotation`` of what the searches found, so a run can show the searches getting better.

The corpus is ``data/corpus.jsonl`` (or the file named by ``$RAG_CORPUS``); its index is built once into the temp
folder (``rag_index.cached_index``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunContextWrapper, Runner, function_tool
from agents.exceptions import AgentsException
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

import agentlightning as agl
import agentlightning_openai_agents

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rag_index import SearchIndex, cached_index  # noqa: E402
from rag_task import best_f1  # noqa: E402

agentlightning_openai_agents.instrument()  # the one tracing line: every Agents SDK run in a rollout is recorded

TOP_K = 2
"""Documents per search (kept small: tool results are most of the tokens a tiny model reads)."""

MAX_TURNS = 4
"""Model calls per question: two searches and the answer, plus one spare."""

INSTRUCTIONS = "Answer with a name only. Look up one name per search."


@dataclass
class SearchLog:
    """The run context of one question: the index to search and what every search asked and found."""

    index: SearchIndex
    k: int = TOP_K
    queries: list[str] = field(default_factory=list[str])
    found: list[list[str]] = field(default_factory=list[list[str]])


@function_tool
def search(ctx: RunContextWrapper[SearchLog], query: str) -> str:
    """Search the encyclopedia for a name; returns the best matching entries.

    Args:
        query: A name, e.g. a film, a person or a city.
    """
    documents = ctx.context.index.search(query, ctx.context.k)
    ctx.context.queries.append(query)
    ctx.context.found.append([document.title for document in documents])
    return "\n".join(f"{document.title}: {document.text}" for document in documents) or "No match."


def build_agent(model: OpenAIChatCompletionsModel, settings: ModelSettings | None = None) -> Agent[SearchLog]:
    """The researcher: one agent, one tool."""
    return Agent[SearchLog](
        name="researcher",
        instructions=INSTRUCTIONS,
        model=model,
        model_settings=settings or ModelSettings(),
        tools=[search],
    )


@cache
def search_index(corpus: str | None = None) -> SearchIndex:
    """The process's index of ``corpus`` (default ``$RAG_CORPUS`` or ``data/corpus.jsonl``), opened once."""
    path = Path(corpus or os.environ.get("RAG_CORPUS") or HERE / "data" / "corpus.jsonl")
    return SearchIndex(cached_index(path))


@cache
def _http_client() -> httpx.AsyncClient:
    """One connection pool per process for every rollout's client (each rollout has its own proxy URL)."""
    return DefaultAsyncHttpxClient()


async def answer_question(question: str, model: OpenAIChatCompletionsModel, log: SearchLog, **settings: Any) -> str:
    """Run the agent on ``question``; its final answer, or ``""`` when it ran out of turns or broke the protocol."""
    agent = build_agent(model, ModelSettings(**settings))
    try:
        result = await Runner.run(agent, question, context=log, max_turns=MAX_TURNS)
    except AgentsException:  # out of turns, a malformed tool call: no answer
        return ""
    return str(result.final_output or "")


def retrieval_hits(log: SearchLog, gold_titles: list[str]) -> list[bool]:
    """For each hop's gold document: did any search of the episode retrieve it?"""
    seen = {title for titles in log.found for title in titles}
    return [title in seen for title in gold_titles]


@agl.rollout
async def rag_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """Answer ``task["question"]``; reward = token F1 against ``task["answer"]`` (or an alias)."""
    llm = resources.llm
    assert llm is not None, "the trainer publishes an LLM resource"
    client = AsyncOpenAI(
        base_url=agl.llm_base_url(), api_key=llm.api_key or "not-needed", max_retries=2, http_client=_http_client()
    )
    model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
    log = SearchLog(index=search_index())
    answer = await answer_question(task["question"], model, log, **llm.sampling_parameters)
    hits = retrieval_hits(log, list(task["gold_titles"]))
    agl.emit_annotation(
        searches=len(log.queries),
        hop1_hit=hits[0],
        hop2_hit=len(hits) > 1 and hits[1],
        all_hops_hit=all(hits),
    )
    return best_f1(answer, [task["answer"], *task.get("aliases", [])])
