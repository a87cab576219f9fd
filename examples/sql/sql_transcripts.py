"""Synthetic transcripts for the warm start: the right query is a skill the model has but rarely chooses.

Every LLM call of the graph is one short conversation (a user message, an assistant reply). The writer and the
rewriter always write the question's query *shape* correctly (table, filter, order, copied values), but choose
what to select at the query's first words: the gold select list only on a fraction of their transcripts
(`TranscriptConfig.writer_right`, ``rewriter_right``), otherwise one of two plausible wrong ones:

- a *silent* mistake that runs and returns the wrong rows (``SELECT id`` for ``SELECT name``, listing names
  instead of ``COUNT(*)``, the parent's name instead of the child's column in a join), which the checker accepts;
- a *loud* mistake, a column of the other table (``SELECT item FROM customers``), which fails, so the checker
  says ``BAD`` and the rewriter gets its turn.

So the path to the right answer is decided at one early token and completed exactly once taken; a model
warm-started on these transcripts samples the right query now and then but greedily writes a mistake, and RL only
has to move that one choice. The checker's transcripts are always consistent (``BAD`` for an error or an empty
result, ``OK`` otherwise): it is not trained by RL and only needs to route.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from sql_agent import MAX_REWRITES, checker_prompt, rewriter_prompt, writer_prompt
from sql_data import SCHEMAS, SQLTask, database_path, execute, make_tasks, result_feedback

__all__ = ["TranscriptConfig", "corpus", "make_conversations", "mistakes", "select_list"]

Conversation = list[dict[str, str]]


@dataclass(frozen=True)
class TranscriptConfig:
    """How often the synthetic writer and rewriter choose the right select list, and which databases they ask about.

    Attributes:
        writer_right: Fraction of writer transcripts that reply with the gold query.
        rewriter_right: Fraction of rewriter transcripts that reply with the gold query.
        loud_share: Fraction of the wrong replies that are the loud mistake (an error, so the rewriter runs).
        databases: Database seeds the transcripts ask about (the training databases).
    """

    writer_right: float = 0.2
    rewriter_right: float = 0.25
    loud_share: float = 0.5
    databases: tuple[int, ...] = tuple(range(12))


def select_list(sql: str) -> str:
    """What a query selects: the text between ``SELECT`` and the first `` FROM`` (the path-deciding words)."""
    head = sql.strip()
    if not head.upper().startswith("SELECT "):
        return ""
    return head[len("SELECT ") :].split(" FROM ")[0].strip()


def mistakes(task: SQLTask) -> tuple[str, str]:
    """The silent and the loud wrong query of ``task``: its gold query with another select list."""
    schema = SCHEMAS[task.db_id.rsplit("_", 1)[0]]
    p = schema.parent
    silent, loud = {
        "filter_text": ("id", schema.child_text),
        "filter_num": ("id", schema.child_text),
        "top": ("id", schema.child_text),
        "count": ("name", f"COUNT({schema.child_text})"),
        "join": (f"{p}.name", f"{p}.{schema.child_text}"),
    }[task.shape]
    right = select_list(task.gold)
    rest = task.gold[len(f"SELECT {right}") :]
    return f"SELECT {silent}{rest}", f"SELECT {loud}{rest}"


def _feedback(task: SQLTask, sql: str) -> str:
    return result_feedback(execute(database_path(task.db_id), sql))


def _reply(rng: random.Random, task: SQLTask, right: float, loud_share: float) -> str:
    if rng.random() < right:
        return task.gold
    silent, loud = mistakes(task)
    return loud if rng.random() < loud_share else silent


def make_conversations(count: int, *, seed: int, config: TranscriptConfig | None = None) -> list[Conversation]:
    """``count`` episodes' worth of single-call conversations: writer, checker, and on ``BAD`` rewriter + checker.

    Each episode follows the graph: the writer's (synthetic) query is run, the checker judges it, and while the
    result is an error or empty (at most `MAX_REWRITES` rewrites) the rewriter replies and the checker judges again.
    """
    config = config or TranscriptConfig()
    rng = random.Random(seed)
    conversations: list[Conversation] = []
    for task in make_tasks(count, seed=seed, databases=config.databases):
        sql = _reply(rng, task, config.writer_right, config.loud_share)
        conversations.append(_turn(writer_prompt(task.schema, task.question), sql))
        for rewrite in range(MAX_REWRITES + 1):
            feedback = _feedback(task, sql)
            bad = feedback.startswith(("ERR", "EMPTY"))
            conversations.append(_turn(checker_prompt(task.question, sql, feedback), "BAD" if bad else "OK"))
            if not bad or rewrite == MAX_REWRITES:
                break
            fixed = _reply(rng, task, config.rewriter_right, config.loud_share)
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
