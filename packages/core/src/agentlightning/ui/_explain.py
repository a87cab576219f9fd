"""Why did this episode get this credit? The transitions of one attempt, with their credit and advantage.

The dashboard asks for one attempt; the answer rebuilds its transitions with the public conversion API and
runs LightningRL credit assignment over the attempt's group (the group's succeeded rollouts, last attempt of
each: what a trainer batches), so the advantage shown is the one a group estimator would give. Every LLM span
of the attempt is reported as trained (with its step) or not, and why not.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentlightning import semconv
from agentlightning._models import Attempt, Rollout, Span
from agentlightning._training_models import TrainingSample, Transition
from agentlightning.credit import CreditConfig, advantage_estimator_names, build_training_batch, credit_strategy_names
from agentlightning.judge import final_reward, rewarded, stored_judgement
from agentlightning.store import LightningStore, NotFoundError, RolloutQuery
from agentlightning.transitions import TransitionBuilder, TransitionConfig, TransitionResult, build_trace_tree

__all__ = ["CallVerdict", "ExplainRequest", "ExplainResponse", "TransitionRow", "explain_attempt"]

_MAX_GROUP = 1000


class ExplainRequest(BaseModel):
    """Which attempt to explain and with which LightningRL settings.

    Attributes:
        rollout_id: The rollout.
        attempt_id: One of its attempts (``None``: the latest).
        credit: Credit strategy name (``identical``, ``discounted``, ``per_step`` or a registered one).
        estimator: Advantage estimator name (``grpo``, ``rloo``, ``reinforce_pp``, ``passthrough``...).
        mode: Transition mode (``per_call`` or ``trajectory``).
        agent_filter: Regular expression of the trained agents (``None``: all).
        drop_equal_groups: Drop groups whose credits are all equal (as `CreditConfig`).
        gamma: Discount per step for ``discounted`` / ``per_step``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rollout_id: str = Field(min_length=1, max_length=256)
    attempt_id: str | None = Field(default=None, min_length=1, max_length=256)
    credit: str = Field(default="identical", max_length=64)
    estimator: str = Field(default="grpo", max_length=64)
    mode: Literal["per_call", "trajectory"] = "per_call"
    agent_filter: str | None = Field(default=None, min_length=1, max_length=1000)
    drop_equal_groups: bool = False
    gamma: float = Field(default=1.0, gt=0.0, le=1.0)


class TransitionRow(BaseModel):
    """One transition of the attempt and what credit assignment gave it."""

    step_index: int
    agent_name: str | None
    span_ids: list[str]
    call_ids: list[str]
    model_version: int | None
    prompt_tokens: int
    response_tokens: int
    trained_tokens: int
    intermediate_reward: float | None
    final_reward: float | None
    in_batch: bool
    credit: float | None
    advantage: float | None
    note: str | None


class CallVerdict(BaseModel):
    """What happened to one LLM span of the attempt."""

    span_id: str
    agent_name: str | None
    trained: bool
    step_index: int | None
    reason: str | None


class ExplainResponse(BaseModel):
    """The transitions of one attempt, their credit and advantage, and the fate of each LLM call."""

    rollout_id: str
    attempt_id: str
    group_id: str | None
    group_rollouts: int
    final_reward: float | None
    batch_note: str | None
    transitions: list[TransitionRow]
    calls: list[CallVerdict]
    problems: list[str]
    diagnostics: dict[str, float]
    batch_metrics: dict[str, float]
    credit_strategies: list[str]
    estimators: list[str]


def _agent_of(span: Span, tree_parents: dict[str, str | None], by_id: dict[str, Span]) -> str | None:
    parent_id: str | None = span.span_id
    while parent_id is not None:
        node = by_id[parent_id]
        if node.attributes.get(semconv.SPAN_KIND) == semconv.KIND_AGENT:
            name = node.attributes.get(semconv.GEN_AI_AGENT_NAME)
            return name if isinstance(name, str) and name else node.name
        parent_id = tree_parents[parent_id]
    return None


async def _convert(
    store: LightningStore, builder: TransitionBuilder, rollout_id: str, attempt_id: str, group_id: str | None
) -> tuple[TransitionResult, list[Span]]:
    spans, calls = await asyncio.gather(
        store.query_spans(rollout_id, attempt_id), store.query_llm_calls(rollout_id, attempt_id)
    )
    return _judged(builder.build(spans, calls, group_id=group_id), spans), spans


def _judged(result: TransitionResult, spans: list[Span]) -> TransitionResult:
    """The rewards an LLM judge gave the attempt (its verdict spans), as the trainer applied them."""
    stored = stored_judgement(spans)
    if stored is None:
        return result
    judgement, groups, weight = stored
    final = final_reward(result, judgement, groups, weight) if judgement.missing is None else judgement.missing
    if isinstance(final, str):
        problem = f"the LLM judge gave no reward ({final}): a trainer leaves this rollout out"
        return dataclasses.replace(result, problems=[*result.problems, problem])
    return rewarded(result, judgement, final)


async def _pick_attempt(store: LightningStore, request: ExplainRequest) -> tuple[Rollout, Attempt, Attempt]:
    """The rollout, the attempt to explain and the rollout's latest attempt.

    Raises:
        NotFoundError: Unknown rollout or attempt, or a rollout without attempts.
    """
    rollout = await store.get_rollout(request.rollout_id)
    attempts = await store.query_attempts(rollout.rollout_id)
    if not attempts:
        raise NotFoundError(f"rollout {rollout.rollout_id!r} has no attempt yet")
    latest = max(attempts, key=lambda a: a.sequence)
    attempt = (
        latest
        if request.attempt_id is None
        else next((a for a in attempts if a.attempt_id == request.attempt_id), None)
    )
    if attempt is None:
        raise NotFoundError(f"attempt {request.attempt_id!r} of rollout {rollout.rollout_id!r} not found")
    return rollout, attempt, latest


def _batch_note(rollout: Rollout, attempt: Attempt, in_batch: bool) -> str | None:
    """Why the attempt is in no training batch (``None`` when it is)."""
    if in_batch:
        return None
    if rollout.status != "succeeded":
        return f"not in a training batch: the rollout is {rollout.status}"
    return f"not in a training batch: attempt {attempt.sequence} is not the rollout's last attempt"


async def _group_peers(store: LightningStore, builder: TransitionBuilder, rollout: Rollout) -> list[TransitionResult]:
    """The other succeeded rollouts of the rollout's group, each converted from its last attempt."""
    if rollout.group_id is None:
        return []
    page = await store.list_rollouts(RolloutQuery(group_id=rollout.group_id, status=["succeeded"], limit=_MAX_GROUP))
    peers: list[TransitionResult] = []
    for other in page.rollouts:
        if other.rollout_id == rollout.rollout_id:
            continue
        other_attempts = await store.query_attempts(other.rollout_id)
        last = max(other_attempts, key=lambda a: a.sequence)
        peers.append((await _convert(store, builder, other.rollout_id, last.attempt_id, rollout.group_id))[0])
    return peers


def _transition_rows(
    own: TransitionResult, samples: dict[int, TrainingSample], in_batch: bool, batch_note: str | None
) -> tuple[list[TransitionRow], dict[str, int]]:
    """One row per transition of the attempt, and the step each trained LLM span went to."""
    rows: list[TransitionRow] = []
    trained_spans: dict[str, int] = {}
    for t in own.transitions:
        sample = samples.get(t.step_index)
        span_ids = [str(s) for s in t.metadata.get("span_ids", [])]
        for span_id in span_ids:
            trained_spans[span_id] = t.step_index
        note = batch_note
        if in_batch and sample is None:
            note = "dropped: every rollout of its group earned the same credit (drop_equal_groups)"
        rows.append(
            TransitionRow(
                step_index=t.step_index,
                agent_name=t.agent_name,
                span_ids=span_ids,
                call_ids=list(t.call_ids),
                model_version=t.model_version,
                prompt_tokens=len(t.prompt_token_ids),
                response_tokens=len(t.response_token_ids),
                trained_tokens=sum(t.response_mask),
                intermediate_reward=t.intermediate_reward,
                final_reward=t.final_reward,
                in_batch=sample is not None,
                credit=None if sample is None else sample.credit,
                advantage=None if sample is None else sample.advantage,
                note=note,
            )
        )
    return rows, trained_spans


def _call_verdicts(
    spans: list[Span], trained_spans: dict[str, int], config: TransitionConfig, agent_filter: str | None
) -> list[CallVerdict]:
    """What happened to each LLM span of the attempt: trained (at which step) or why not."""
    tree = build_trace_tree(spans)
    calls: list[CallVerdict] = []
    for span in tree.ordered:
        if span.attributes.get(semconv.SPAN_KIND) != semconv.KIND_LLM:
            continue
        agent = _agent_of(span, tree.parent_ids, tree.by_id)
        step = trained_spans.get(span.span_id)
        reason = None
        if step is None:
            if not config.trains(agent):
                reason = f"filtered out: agent {agent!r} is not selected by agent_filter {agent_filter!r}"
            else:
                reason = "not trained: no token ids were found for this call (see problems)"
        calls.append(CallVerdict(span_id=span.span_id, agent_name=agent, trained=step is not None, step_index=step,
                                 reason=reason))  # fmt: skip
    return calls


async def explain_attempt(store: LightningStore, request: ExplainRequest) -> ExplainResponse:
    """Rebuild an attempt's transitions and assign credit over its group, as a trainer would.

    Raises:
        NotFoundError: Unknown rollout or attempt.
        ValueError: Unknown credit strategy or estimator, or an invalid agent filter.
    """
    rollout, attempt, latest = await _pick_attempt(store, request)
    config = TransitionConfig(mode=request.mode, agent_filter=request.agent_filter, on_missing="skip")
    credit_config = CreditConfig(drop_equal_groups=request.drop_equal_groups, gamma=request.gamma)
    builder = TransitionBuilder(config)
    own, spans = await _convert(store, builder, rollout.rollout_id, attempt.attempt_id, rollout.group_id)

    # What a trainer batches: the group's succeeded rollouts, each by its last attempt.
    in_batch = rollout.status == "succeeded" and attempt.attempt_id == latest.attempt_id
    batch_note = _batch_note(rollout, attempt, in_batch)
    peers = await _group_peers(store, builder, rollout)
    group_size = len(peers) + (1 if in_batch else 0) if rollout.group_id is not None else 1
    batch_input: list[Transition] = [t for peer in peers for t in peer.transitions]
    if in_batch:
        batch_input = list(own.transitions) + batch_input
    batch = build_training_batch(batch_input, request.credit, request.estimator, credit_config) if batch_input else None
    samples: dict[int, TrainingSample] = {}
    if batch is not None and in_batch:
        samples = {
            s.step_index: s
            for s in batch.samples
            if s.rollout_id == rollout.rollout_id and s.attempt_id == attempt.attempt_id
        }
    rows, trained_spans = _transition_rows(own, samples, in_batch, batch_note)
    return ExplainResponse(
        rollout_id=rollout.rollout_id,
        attempt_id=attempt.attempt_id,
        group_id=rollout.group_id,
        group_rollouts=group_size,
        final_reward=own.final_reward,
        batch_note=batch_note,
        transitions=rows,
        calls=_call_verdicts(spans, trained_spans, config, request.agent_filter),
        problems=list(own.problems),
        diagnostics=own.diagnostics.as_metrics(),
        batch_metrics=dict(batch.metrics) if batch is not None else {},
        credit_strategies=credit_strategy_names(),
        estimators=advantage_estimator_names(),
    )
