"""Synthetic transcripts for the warm start: what each agent says, deliberately only partly right.

Every LLM call of the graph is one short conversation (a user message, an assistant reply). The writer and the
rewriter reply with the gold query only on a fraction of their transcripts (`TranscriptConfig.writer_right`,
``rewriter_right``); otherwise with one of two typical mistakes of the question's shape — a dropped ``WHERE``, a
column of the wrong table (an error), ``<`` for ``>``, the wrong sort direction. A model
warm-started on them writes the right query now and then when sampling but rarely greedily, so RL has a clear signal
to amplify. The checker's transcripts are always consistent (``BAD`` for an error or an empty result, ``OK``
otherwise): it is not trained by RL and only needs to route.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from sql_agent import checker_prompt, rewriter_prompt, writer_prompt
from sql_data import SCHEMAS, SQLTask, database_path, execute, make_tasks, result_feedback

__all__ = ["TranscriptConfig", "corpus", "make_conversations", "mistakes"]

Conversation = list[dict[str, str]]


@dataclass(frozen=True)
class TranscriptConfig:
    """How often the synthetic writer and rewriter are right, and which databases the transcripts use.

    Attributes:
        writer_right: Fraction of writer transcripts that reply with the gold query.
        rewriter_right: Fraction of rewriter transcripts that reply with the gold query.
        databases: Database seeds the transcripts ask about (the training databases).
    """

    writer_right: float = 0.3
    rewriter_right: float = 0.3
    databases: tuple[int, ...] = tuple(range(12))


def mistakes(task: SQLTask) -> tuple[str, str]:
    """Two typical wrong queries for ``task``'s shape: a silent one (runs, wrong rows) and a loud one (an error)."""
    schema = SCHEMAS[task.db_id.rsplit("_", 1)[0]]
    gold, child = task.gold, schema.child
    if task.shape in ("filter_text", "count"):
        return gold.split(" WHERE ")[0], gold.replace(f"WHERE {schema.text_col} =", f"WHERE {schema.child_text} =")
    if task.shape == "filter_num":
        return gold.replace(" > ", " < "), gold.replace(f"WHERE {schema.num_col} >", f"WHERE {schema.child_num} >")
    if task.shape == "top":
        swapped = gold.replace(" DESC ", " ASC ") if " DESC " in gold else gold.replace(" ASC ", " DESC ")
        return swapped, gold.replace(f"ORDER BY {schema.num_col}", f"ORDER BY {schema.child_num}")
    if task.shape == "join":
        return gold.split(" WHERE ")[0], gold.replace(f"{schema.parent}.name", f"{child}.name")
    raise ValueError(f"no mistakes known for shape {task.shape!r}")


def _feedback(task: SQLTask, sql: str) -> str:
    return result_feedback(execute(database_path(task.db_id), sql))


def _reply(rng: random.Random, task: SQLTask, right: float) -> str:
    return task.gold if rng.random() < right else rng.choice(mistakes(task))


def make_conversations(count: int, *, seed: int, config: TranscriptConfig | None = None) -> list[Conversation]:
    """``count`` episodes' worth of single-call conversations: writer, checker, and on ``BAD`` rewriter + checker.

    Each episode follows the graph: the writer's (synthetic) query is run, the checker judges it, and while the
    result is an error or empty (at most two rewrites) the rewriter replies and the checker judges again.
    """
    config = config or TranscriptConfig()
    rng = random.Random(seed)
    conversations: list[Conversation] = []
    for task in make_tasks(count, seed=seed, databases=config.databases):
        sql = _reply(rng, task, config.writer_right)
        conversations.append(_turn(writer_prompt(task.schema, task.question), sql))
        for rewrite in range(3):
            feedback = _feedback(task, sql)
            bad = feedback.startswith(("ERR", "EMPTY"))
            conversations.append(_turn(checker_prompt(task.question, sql, feedback), "BAD" if bad else "OK"))
            if not bad or rewrite == 2:
                break
            fixed = _reply(rng, task, config.rewriter_right)
            conversations.append(_turn(rewriter_prompt(task.schema, task.question, sql, feedback), fixed))
            sql = fixed
    return conversations


def _turn(prompt: str, reply: str) -> Conversation:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]


def corpus(conversations: list[Conversation]) -> Iterator[str]:
    """Every message text (what the tokenizer is trained on)."""
    for conversation in conversations:
        for message in conversation:
            yield message["content"]
