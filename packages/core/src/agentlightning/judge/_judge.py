"""`LLMJudge`: score finished rollouts (as a group, and/or step by step) and store each verdict with its reason.

Phases of `LLMJudge.judge`: read each rollout's trace from the store (`read_trace`) → ask the judge, one call per
group and/or one per rollout (bounded tries; an invalid answer, a timeout, HTTP 429 or 5xx is tried again) → store
every score and reason as a span of kind ``judge`` in the rollout's last attempt (a step's verdict is a child of the
LLM span it judges, so the dashboard shows it under that step) → return the `JudgeOutcome`. A rollout the judge
could not score has no judgement, only the reason (`RolloutJudgement.missing`): never 0, never a guess.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentlightning import semconv
from agentlightning._models import Span, SpanStatus
from agentlightning.judge._client import JudgeBudgetExceeded, JudgeCallError, JudgeClient, JudgeCounters
from agentlightning.judge._config import JudgeConfig
from agentlightning.judge._prompts import InvalidJudgement, Score, group_messages, parse_scores, step_messages
from agentlightning.judge._trace import JudgedTrace, read_trace
from agentlightning.store import LightningStore

__all__ = [
    "JUDGE_ERROR",
    "JUDGE_REASON",
    "JUDGE_SCOPE",
    "JUDGE_SCORE",
    "JUDGE_STEP",
    "JUDGE_STEP_ID",
    "JUDGE_WEIGHT",
    "JudgeOutcome",
    "LLMJudge",
    "RolloutJudgement",
    "stored_judgement",
]

logger = logging.getLogger(__name__)

JUDGE_SCOPE = "agentlightning.judge.scope"
"""``rollout`` (a group verdict, or why the rollout could not be judged) or ``step``."""
JUDGE_SCORE = "agentlightning.judge.score"
JUDGE_REASON = "agentlightning.judge.reason"
JUDGE_STEP = "agentlightning.judge.step"
"""The 1-based step number of a step verdict."""
JUDGE_ERROR = "agentlightning.judge.error"
"""Why the judge could not score the rollout (its reward is then missing)."""
JUDGE_WEIGHT = "agentlightning.judge.weight"
"""The judge's share of the final reward (`JudgeConfig.weight`), on a rollout's verdict."""
JUDGE_STEP_ID = "agentlightning.judge.step_id"
"""The judged step's LLM span id (or proxy record's call id), on a step's verdict."""
_JUDGE_MODEL = "agentlightning.judge.model"

_CONCURRENCY = 4  # judge calls in flight at once
_READ_CONCURRENCY = 16  # rollouts read from the store at once (as `results_from_store`)


@dataclass
class RolloutJudgement:
    """What the judge said about one rollout.

    Attributes:
        rollout_id: The rollout.
        attempt_id: Its last attempt (``None``: it never ran, so it was not judged).
        score: Its group score in [0, 1] (``None`` without group judging, or when ``missing``).
        reason: The judge's reason for ``score``.
        steps: Step scores by step id (the LLM span id, or the proxy record's call id).
        missing: Why the judge could not judge it; then the rollout has no reward.
    """

    rollout_id: str
    attempt_id: str | None
    score: float | None = None
    reason: str | None = None
    steps: dict[str, Score] = field(default_factory=dict[str, Score])
    missing: str | None = None


@dataclass
class JudgeOutcome:
    """The judgements of one call of `LLMJudge.judge` and what they cost.

    Attributes:
        judgements: By rollout id.
        counters: Calls, tokens, latency, failures (``as_metrics`` gives the ``judge_*`` metrics).
    """

    judgements: dict[str, RolloutJudgement]
    counters: JudgeCounters

    @property
    def missing(self) -> list[RolloutJudgement]:
        """The rollouts the judge could not judge."""
        return [j for j in self.judgements.values() if j.missing is not None]


class _Failed(Exception):
    """A judgement that failed every try (the message is the reason)."""


class LLMJudge:
    """A judge model on an OpenAI-compatible server, scoring rollouts it reads from the store.

    Args:
        config: The judge's settings.

    Example:
        ```python
        judge = LLMJudge(JudgeConfig(url="http://127.0.0.1:8000/v1", model="judge", rubric="Correct and short."))
        outcome = await judge.judge(store, rollout_ids)  # verdicts stored as spans of kind "judge"
        ```
    """

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config
        self.client = JudgeClient(config)
        self._gate = asyncio.Semaphore(_CONCURRENCY)

    async def close(self) -> None:
        """Close the HTTP session to the judge server."""
        await self.client.close()

    async def judge(self, store: LightningStore, rollout_ids: Sequence[str]) -> JudgeOutcome:
        """Judge the rollouts (grouped by ``group_id``), store every verdict, and return them.

        The per-iteration budget starts afresh at each call.
        """
        self.client.new_iteration()
        reads = asyncio.Semaphore(_READ_CONCURRENCY)

        async def read(rollout_id: str) -> JudgedTrace | None:
            async with reads:
                return await read_trace(store, rollout_id)

        traces = await asyncio.gather(*(read(rollout_id) for rollout_id in rollout_ids))
        judgements = {
            rid: RolloutJudgement(rid, trace.attempt_id if trace is not None else None, missing=None)
            for rid, trace in zip(rollout_ids, traces, strict=True)
        }
        known = [trace for trace in traces if trace is not None]
        for rid, trace in zip(rollout_ids, traces, strict=True):
            if trace is None:
                judgements[rid].missing = "the rollout has no attempt to judge"
        jobs = []
        if self.config.judges_groups:
            groups: dict[str, list[JudgedTrace]] = {}
            for trace in known:
                groups.setdefault(trace.group_id or trace.rollout_id, []).append(trace)
            jobs.extend(self._judge_group(group, judgements) for group in groups.values())
        if self.config.judges_steps:
            jobs.extend(self._judge_steps(trace, judgements[trace.rollout_id]) for trace in known if trace.steps)
        await asyncio.gather(*jobs)
        await self._store(store, known, judgements)
        counters = self.client.counters
        counters.rollouts_missing = sum(1 for j in judgements.values() if j.missing is not None)
        counters.rollouts_judged = len(judgements) - counters.rollouts_missing
        counters.reasons = [f"rollout {j.rollout_id}: {j.missing}" for j in judgements.values() if j.missing]
        return JudgeOutcome(judgements, counters)

    async def _judge_group(self, group: list[JudgedTrace], judgements: dict[str, RolloutJudgement]) -> None:
        messages, ids = group_messages(self.config.rubric, group, self.config.max_trace_chars)
        try:
            scores = await self._ask(messages, "scores", "id", ids)
        except _Failed as failed:
            for trace in group:
                judgements[trace.rollout_id].missing = f"group judgement failed: {failed}"
            return
        for short, trace in zip(ids, group, strict=True):
            judgement = judgements[trace.rollout_id]
            judgement.score, judgement.reason = scores[short].score, scores[short].reason

    async def _judge_steps(self, trace: JudgedTrace, judgement: RolloutJudgement) -> None:
        messages, ids = step_messages(self.config.rubric, trace, self.config.max_trace_chars)
        try:
            scores = await self._ask(messages, "steps", "step", ids)
        except _Failed as failed:
            judgement.missing = judgement.missing or f"step judgement failed: {failed}"
            return
        judgement.steps = {step.step_id: scores[str(step.number)] for step in trace.steps}
        self.client.counters.steps_judged += len(trace.steps)

    async def _ask(
        self, messages: list[dict[str, str]], list_key: str, id_key: str, ids: list[str]
    ) -> dict[str, Score]:
        """Ask until a valid answer or ``max_attempts`` tries; raises `_Failed` with the last reason."""
        client = self.client
        body = client.body(messages)
        key = client.key(body)
        cached = client.cached(key)
        if cached is not None:
            return cached
        reason = "not asked"
        for attempt in range(1, self.config.max_attempts + 1):
            if attempt > 1:
                client.counters.retries += 1
            try:
                async with self._gate:
                    answer = await client.complete(body)
                scores = parse_scores(answer.text, list_key, id_key, ids)
            except JudgeBudgetExceeded as exc:
                client.counters.budget_exhausted = 1
                raise _Failed(exc.reason) from None
            except JudgeCallError as exc:
                reason = exc.reason
                logger.info("judge try %d/%d failed: %s", attempt, self.config.max_attempts, reason)
                if attempt < self.config.max_attempts:
                    await client.wait_before_retry(exc, attempt)
                continue
            except InvalidJudgement as exc:
                reason = f"invalid answer: {exc}"
                logger.info("judge try %d/%d: %s", attempt, self.config.max_attempts, reason)
                continue
            client.remember(key, scores)
            return scores
        raise _Failed(f"{self.config.max_attempts} tries, the last: {reason}")

    async def _store(
        self, store: LightningStore, traces: list[JudgedTrace], judgements: dict[str, RolloutJudgement]
    ) -> None:
        """Every verdict (and every failure's reason) as spans of kind ``judge`` of the rollout's last attempt."""
        spans: list[Span] = []
        for trace in traces:
            spans.extend(self._verdict_spans(trace, judgements[trace.rollout_id]))
        if spans:
            await store.add_spans(spans)

    def _verdict_spans(self, trace: JudgedTrace, judgement: RolloutJudgement) -> list[Span]:
        now = time.time()
        trace_id = trace.trace_id or os.urandom(16).hex()
        base = {semconv.SPAN_KIND: semconv.KIND_JUDGE, _JUDGE_MODEL: self.config.model}
        out: list[Span] = []

        def add(
            name: str, parent: str | None, attributes: Mapping[str, object], status: SpanStatus | None = None
        ) -> None:
            out.append(
                Span(
                    rollout_id=trace.rollout_id,
                    attempt_id=trace.attempt_id,
                    sequence_id=trace.next_sequence + len(out),
                    trace_id=trace_id,
                    span_id=os.urandom(8).hex(),
                    parent_id=parent,
                    name=name,
                    start_time=now,
                    end_time=now,
                    attributes={**base, **attributes},  # pyright: ignore[reportArgumentType]
                    status=status or SpanStatus(),
                )
            )

        if judgement.missing is not None:
            attrs = {JUDGE_SCOPE: "rollout", JUDGE_ERROR: judgement.missing}
            add("judge.failed", None, attrs, SpanStatus(code="error", description=judgement.missing))
        elif judgement.score is not None:
            attrs = {
                JUDGE_SCOPE: "rollout",
                JUDGE_SCORE: judgement.score,
                JUDGE_REASON: judgement.reason or "",
                JUDGE_WEIGHT: self.config.weight,
            }
            add("judge.rollout", None, attrs)
        for step in trace.steps:
            score = judgement.steps.get(step.step_id)
            if score is not None:
                attrs = {
                    JUDGE_SCOPE: "step",
                    JUDGE_STEP: step.number,
                    JUDGE_STEP_ID: step.step_id,
                    JUDGE_SCORE: score.score,
                    JUDGE_REASON: score.reason,
                }
                add("judge.step", step.step_id if step.is_span else None, attrs)
        return out


def stored_judgement(spans: Sequence[Span]) -> tuple[RolloutJudgement, bool, float] | None:
    """The judgement an attempt's verdict spans record, whether it scored the group, and the judge's weight.

    What the dashboard reads to show the rewards a trainer gave (``None``: the attempt has no verdict).
    """
    verdicts = [s for s in spans if s.attributes.get(semconv.SPAN_KIND) == semconv.KIND_JUDGE]
    if not verdicts:
        return None
    first = verdicts[0]
    judgement = RolloutJudgement(first.rollout_id, first.attempt_id)
    groups, weight = False, 1.0
    for span in verdicts:
        attrs = span.attributes
        score = attrs.get(JUDGE_SCORE)
        if attrs.get(JUDGE_ERROR) is not None:
            judgement.missing = str(attrs[JUDGE_ERROR])
        elif attrs.get(JUDGE_SCOPE) == "rollout" and isinstance(score, int | float):
            groups, judgement.score, judgement.reason = True, float(score), str(attrs.get(JUDGE_REASON, ""))
            stored_weight = attrs.get(JUDGE_WEIGHT)
            weight = float(stored_weight) if isinstance(stored_weight, int | float) else 1.0
        elif attrs.get(JUDGE_SCOPE) == "step" and isinstance(score, int | float):
            judgement.steps[str(attrs.get(JUDGE_STEP_ID))] = Score(float(score), str(attrs.get(JUDGE_REASON, "")))
    return judgement, groups, weight
