"""Read what a run left in its store: each rollout's last attempt, its spans, proxy records and LLM calls as seen.

A call as the doctor sees it (`CallView`) is an LLM span of the adapter joined to the proxy record it names
(``gen_ai.response.id``), or a proxy record that no span references (an agent run without its adapter line). The
join is the transition builder's own rule (`agentlightning.transitions`), so a call the doctor counts as recorded
is one the trainer would train on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentlightning._models import Attempt, LLMCall, Rollout, Span
from agentlightning.semconv import GEN_AI_AGENT_NAME, GEN_AI_RESPONSE_ID, KIND_AGENT, KIND_LLM, SPAN_KIND
from agentlightning.store import LightningStore

__all__ = ["NO_SPAN_SITE", "UNMATCHED_SITE", "CallView", "RolloutEvidence", "collect"]

NO_SPAN_SITE = "(no LLM span)"
"""The call site of proxy records of an attempt that has no LLM span at all (the agent runs without its adapter)."""
UNMATCHED_SITE = "(no matching LLM span)"
"""The call site of proxy records that none of their attempt's LLM spans references, while other calls have spans."""


@dataclass
class CallView:
    """One LLM call of a rollout: its agent, call site, span (``None``: the adapter saw no call) and proxy record
    (``None``: the call never went through the proxy)."""

    agent: str | None
    site: str
    start: float
    span: Span | None = None
    record: LLMCall | None = None


@dataclass
class RolloutEvidence:
    """One rollout and what its last attempt left in the store."""

    rollout: Rollout
    attempt: Attempt | None
    spans: list[Span] = field(default_factory=list[Span])
    records: list[LLMCall] = field(default_factory=list[LLMCall])
    calls: list[CallView] = field(default_factory=list[CallView])


def _agent_of(span: Span, by_id: dict[str, Span]) -> str | None:
    """The span's own agent name, else the nearest enclosing agent span's (as `TransitionBuilder` names it)."""
    own = span.attributes.get(GEN_AI_AGENT_NAME)
    if isinstance(own, str) and own:
        return own
    parent_id = span.parent_id
    seen: set[str] = set()
    while parent_id is not None and parent_id in by_id and parent_id not in seen:
        seen.add(parent_id)
        parent = by_id[parent_id]
        if parent.attributes.get(SPAN_KIND) == KIND_AGENT:
            name = parent.attributes.get(GEN_AI_AGENT_NAME)
            return name if isinstance(name, str) and name else parent.name
        parent_id = parent.parent_id
    return None


def call_views(spans: Sequence[Span], records: Sequence[LLMCall]) -> list[CallView]:
    """The attempt's LLM calls in start order: LLM spans joined to their records, then records no span names."""
    by_id = {span.span_id: span for span in spans}
    by_response = {record.response_id: record for record in records if record.response_id}
    views: list[CallView] = []
    referenced: set[str] = set()
    for span in spans:
        if span.attributes.get(SPAN_KIND) != KIND_LLM:
            continue
        response_id = span.attributes.get(GEN_AI_RESPONSE_ID)
        record = by_response.get(response_id) if isinstance(response_id, str) else None
        if record is not None:
            referenced.add(record.call_id)
        views.append(CallView(_agent_of(span, by_id), span.name, span.start_time, span, record))
    site = UNMATCHED_SITE if views else NO_SPAN_SITE
    for record in records:
        if record.call_id not in referenced:
            views.append(CallView(record.agent_name, site, record.start_time, None, record))
    views.sort(key=lambda view: view.start)
    return views


async def collect(
    store: LightningStore, rollout_ids: Sequence[str] | None = None, *, concurrency: int = 16
) -> list[RolloutEvidence]:
    """Each finished rollout (``rollout_ids``, or every one in the store) with its last attempt's spans and calls.

    Rollouts still queuing or running are left out: their traces are not complete yet.
    """
    if rollout_ids is None:
        rollouts = await store.query_rollouts(status=["succeeded", "failed"])
    else:
        rollouts = await store.query_rollouts(rollout_ids=rollout_ids)
        rollouts = [r for r in rollouts if r.status in ("succeeded", "failed")]
    gate = asyncio.Semaphore(concurrency)

    async def one(rollout: Rollout) -> RolloutEvidence:
        async with gate:
            attempts = await store.query_attempts(rollout.rollout_id)
            if not attempts:
                return RolloutEvidence(rollout, None)
            attempt = max(attempts, key=lambda a: a.sequence)
            spans, records = await asyncio.gather(
                store.query_spans(rollout.rollout_id, attempt.attempt_id),
                store.query_llm_calls(rollout.rollout_id, attempt.attempt_id),
            )
        return RolloutEvidence(rollout, attempt, spans, records, call_views(spans, records))

    return list(await asyncio.gather(*(one(rollout) for rollout in rollouts)))
