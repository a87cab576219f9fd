"""What the judge is asked (group and step prompts) and how its JSON answer is checked.

Group (RULER-style): the rollouts of one task, each named ``r1``, ``r2``..., are shown at once and scored in
[0, 1] relative to each other. Step: one rollout's LLM calls, numbered, each scored in [0, 1] for how much it
moved the task forward. Either answer is a JSON object; an answer that is not one, misses an id, repeats one, names
an unknown one or gives a score out of [0, 1] is refused with a one-line reason (and the judge is asked again).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from agentlightning.judge._trace import JudgedTrace

__all__ = ["InvalidJudgement", "Score", "group_messages", "parse_scores", "step_messages"]

_REASON_CHARS = 300

_GROUP_SYSTEM = """You judge how well AI agents did a task, by reading what each of them did.
Rubric (what a good result is, in the user's words):
{rubric}

You see several attempts ("rollouts") at the same task. Score each from 0.0 (worst) to 1.0 (best), comparing them
with each other: a better rollout gets a higher score; equally good ones get equal scores.
Answer with JSON only, no other text, in exactly this shape, one entry per rollout id:
{{"scores": [{{"id": "r1", "score": 0.0, "reason": "one short sentence"}}]}}"""

_STEP_SYSTEM = """You judge each step of an AI agent's work on a task, by reading what it did.
Rubric (what a good result is, in the user's words):
{rubric}

Each step is one call to the language model (with the agent that made it). Score each step from 0.0 (useless or
harmful) to 1.0 (clearly moved the task forward, following the rubric).
Answer with JSON only, no other text, in exactly this shape, one entry per step number:
{{"steps": [{{"step": 1, "score": 0.0, "reason": "one short sentence"}}]}}"""


class InvalidJudgement(ValueError):
    """The judge's answer is not a valid judgement (the message says why, in one line)."""


@dataclass(frozen=True)
class Score:
    """One validated score and the judge's reason for it."""

    score: float
    reason: str


def _task_text(task: Any) -> str:
    return task if isinstance(task, str) else json.dumps(task, default=str, ensure_ascii=False)[:4000]


def group_messages(rubric: str, traces: list[JudgedTrace], max_chars: int) -> tuple[list[dict[str, str]], list[str]]:
    """The messages asking to score ``traces`` (one task's rollouts) together; returns them and the ids used."""
    ids = [f"r{i + 1}" for i in range(len(traces))]
    parts = [f"Task:\n{_task_text(traces[0].task)}"]
    for short, trace in zip(ids, traces, strict=True):
        parts.append(f"=== rollout {short} ===\n{trace.render(max_chars)}")
    parts.append(f"Score every rollout: {', '.join(ids)}.")
    system = _GROUP_SYSTEM.format(rubric=rubric)
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}], ids


def step_messages(rubric: str, trace: JudgedTrace, max_chars: int) -> tuple[list[dict[str, str]], list[str]]:
    """The messages asking to score each step of ``trace``; returns them and the ids (step numbers as text)."""
    ids = [str(step.number) for step in trace.steps]
    user = f"Task:\n{_task_text(trace.task)}\n\n{trace.render(max_chars)}\n\nScore every step: {', '.join(ids)}."
    return [{"role": "system", "content": _STEP_SYSTEM.format(rubric=rubric)}, {"role": "user", "content": user}], ids


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _json_object(text: str) -> dict[str, Any]:
    """The JSON object in ``text`` (bare, in a code fence, or between the first ``{`` and the last ``}``)."""
    fenced = _FENCE.search(text)
    candidate = fenced.group(1) if fenced else text
    start, end = candidate.find("{"), candidate.rfind("}")
    if start < 0 or end <= start:
        raise InvalidJudgement(f"the answer holds no JSON object: {text[:120]!r}")
    try:
        value = json.loads(candidate[start : end + 1])
    except json.JSONDecodeError as exc:
        raise InvalidJudgement(f"the answer is not valid JSON ({exc.msg}): {text[:120]!r}") from None
    if not isinstance(value, dict):
        raise InvalidJudgement("the answer is not a JSON object")
    return value  # pyright: ignore[reportUnknownVariableType]


def _one(entry: Any, id_key: str) -> tuple[str, Score]:
    if not isinstance(entry, dict):
        raise InvalidJudgement(f"an entry is not an object: {entry!r}"[:200])
    ident, score, reason = entry.get(id_key), entry.get("score"), entry.get("reason", "")  # pyright: ignore
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise InvalidJudgement(f"{id_key} {ident!r} has no numeric score: {score!r}")
    if not 0.0 <= score <= 1.0:
        raise InvalidJudgement(f"{id_key} {ident!r} has score {score}, out of [0, 1]")
    if not isinstance(reason, str):
        reason = json.dumps(reason, default=str)
    return str(ident), Score(float(score), reason.strip()[:_REASON_CHARS])  # pyright: ignore[reportUnknownArgumentType]


def parse_scores(text: str, list_key: str, id_key: str, ids: list[str]) -> dict[str, Score]:
    """Check the judge's answer: a JSON object whose ``list_key`` lists exactly one valid score per id of ``ids``.

    Raises:
        InvalidJudgement: Unparseable, a missing, repeated or unknown id, a score that is not a number in [0, 1].
    """
    entries = _json_object(text).get(list_key)
    if not isinstance(entries, list):
        raise InvalidJudgement(f"the answer has no {list_key!r} list")
    scores: dict[str, Score] = {}
    for entry in entries:  # pyright: ignore[reportUnknownVariableType]
        ident, score = _one(entry, id_key)
        if ident not in ids:
            raise InvalidJudgement(f"the answer scores unknown {id_key} {ident!r} (expected {', '.join(ids)})")
        if ident in scores:
            raise InvalidJudgement(f"the answer scores {id_key} {ident!r} twice")
        scores[ident] = score
    missing = [ident for ident in ids if ident not in scores]
    if missing:
        raise InvalidJudgement(f"the answer misses {id_key}(s) {', '.join(missing)}")
    return scores
