"""The first phase of a conversion: an attempt's LLM calls and rewards as one time-ordered list of events.

`scan_events` reads the trace tree (LLM spans and reward spans, the final reward chosen), `index_calls` sorts the
proxy's records into those a span references and the others, and `interleave_proxy_only` makes events of the
records themselves when the attempt has no LLM span at all. The join (`agentlightning.transitions._builder`)
then walks the events once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning._models import LLMCall, Span
from agentlightning.semconv import (
    GEN_AI_RESPONSE_ID,
    KIND_LLM,
    KIND_REWARD,
    REWARD_FINAL,
    REWARD_VALUE,
    SPAN_KIND,
    SPAN_SOURCE,
)
from agentlightning.transitions._config import TransitionDiagnostics
from agentlightning.transitions._duplicates import Event, drop_source_duplicates
from agentlightning.transitions._tree import TraceTree

__all__ = ["CallIndex", "Events", "index_calls", "interleave_proxy_only", "scan_events"]


@dataclass
class Events:
    """An attempt's events in time order: ``(span, response id, None)`` for an LLM span, ``(span, value, is_final)``
    for a reward, ``(None, record, None)`` for a proxy record without an LLM span.

    Attributes:
        items: The events.
        final_index: Index of the final reward in ``items`` (``None``: the attempt has no reward).
        referenced: The response ids LLM spans name.
    """

    items: list[Event]
    final_index: int | None = None
    referenced: set[Any] = field(default_factory=set[Any])

    @property
    def final_reward(self) -> float | None:
        """The episode's final reward (``None`` if the attempt gave none)."""
        return self.items[self.final_index][1] if self.final_index is not None else None

    def replace_items(self, items: list[Event]) -> None:
        """Swap in a new list of the same events (some dropped or others added), keeping the final reward."""
        # The same reward span, whether or not its event is the same tuple: a phase may rebuild the events it keeps
        final_span = self.items[self.final_index][0] if self.final_index is not None else None
        self.items = items
        self.final_index = (
            next((i for i, e in enumerate(items) if e[0] is final_span and e[2] is not None), None)
            if final_span is not None
            else None
        )


def _reward_value(span: Span) -> float | None:
    value = span.attributes.get(REWARD_VALUE)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def scan_events(tree: TraceTree, diag: TransitionDiagnostics, problems: list[str]) -> Events:
    """One pass over the tree in (start_time, sequence_id) order: its LLM spans and valid reward spans.

    The final reward is the last one marked final, else the last reward. LLM spans of another instrumentation that
    duplicate an adapter's are dropped (`drop_source_duplicates`).
    """
    events = Events([])
    items = events.items
    last_final: int | None = None
    finals = 0
    sourced = False  # an LLM span read from another instrumentation (it may duplicate one of ours)
    for span in tree.ordered:
        attrs = span.attributes
        kind = attrs.get(SPAN_KIND)
        if kind == KIND_LLM:
            response_id = attrs.get(GEN_AI_RESPONSE_ID)
            if response_id is not None:
                events.referenced.add(response_id)
            diag.llm_spans += 1
            items.append((span, response_id, None))
            if SPAN_SOURCE in attrs:
                sourced = True
        elif kind == KIND_REWARD:
            value = _reward_value(span)
            if value is None:
                diag.invalid_rewards += 1
                problems.append(
                    f"reward span {span.span_id} has no finite numeric {REWARD_VALUE} "
                    f"({attrs.get(REWARD_VALUE)!r}); ignored"
                )
                continue
            diag.rewards += 1
            events.final_index = len(items)
            is_final = attrs.get(REWARD_FINAL) is True
            if is_final:
                finals += 1
                last_final = events.final_index
            items.append((span, value, is_final))
    if last_final is not None:  # else the last reward is the final one
        events.final_index = last_final
    if sourced:
        kept, dropped = drop_source_duplicates(events.items, tree.parent_ids, tree.by_id)
        if dropped:
            events.replace_items(kept)
            diag.duplicate_spans += dropped
            diag.llm_spans -= dropped
            problems.append(
                f"{dropped} LLM span(s) of another instrumentation recorded a call that another LLM span also "
                "recorded; one span per call was kept (an adapter's, else the first)"
            )
    if finals > 1:
        diag.multiple_final_rewards = 1
        problems.append(f"{finals} rewards are marked final; the last one is used")
    return events


@dataclass
class CallIndex:
    """The attempt's proxy records: by the response id a span references, and the others in time order.

    Attributes:
        by_response: The first record of each response id some LLM span references.
        unreferenced: Records no span references, by start time (joined by order only on request).
        foreign: Records of another attempt (ignored).
    """

    by_response: dict[Any, LLMCall]
    unreferenced: list[LLMCall]
    foreign: int


def _call_start(call: LLMCall) -> float:
    return call.start_time


def index_calls(
    llm_calls: Sequence[LLMCall], rollout_id: str, attempt_id: str, referenced: set[Any], problems: list[str]
) -> CallIndex:
    """Sort the proxy's records of one attempt by whether an LLM span references them (see `CallIndex`)."""
    index = CallIndex({}, [], 0)
    by_response = index.by_response
    for call in llm_calls:
        values = call.__dict__  # faster than attribute reads on a pydantic model (it defines __getattr__)
        if values["attempt_id"] != attempt_id or values["rollout_id"] != rollout_id:
            index.foreign += 1
            continue
        response_id = values["response_id"]
        if response_id is not None and response_id in referenced:
            if response_id not in by_response:
                by_response[response_id] = call
        else:
            index.unreferenced.append(call)
    if index.foreign:
        problems.append(f"ignored {index.foreign} proxy record(s) of another attempt than {rollout_id}/{attempt_id}")
    if len(index.unreferenced) > 1:
        index.unreferenced.sort(key=_call_start)
    return index


def interleave_proxy_only(events: Events, calls: CallIndex, problems: list[str]) -> int:
    """Calls but no LLM span (the agent ran without its adapter): the records become the events, in time order.

    The proxy's records alone still make one transition per call (no agent name), so a plain OpenAI-compatible
    agent trains as is. Returns how many records became events (all of ``calls.unreferenced``, now empty).
    """
    proxy_only = len(calls.unreferenced)
    problems.append(f"{proxy_only} proxy record(s) and no LLM span: one transition per record, without agent names")
    rewards = [(event[0].start_time if event[0] else 0.0, i, event) for i, event in enumerate(events.items)]
    n = len(events.items)
    records = [(call.start_time, n + i, (None, call, None)) for i, call in enumerate(calls.unreferenced)]
    merged = sorted(rewards + records, key=lambda item: (item[0], item[1]))
    events.replace_items([item[2] for item in merged])
    calls.unreferenced = []
    return proxy_only
