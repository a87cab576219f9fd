"""One LLM span per call where another instrumentation's spans meet an adapter's (see `drop_source_duplicates`)."""

from __future__ import annotations

from typing import Any

from agentlightning._models import Span
from agentlightning.semconv import GEN_AI_RESPONSE_ID, KIND_LLM, SPAN_KIND, SPAN_SOURCE

__all__ = ["Event", "drop_source_duplicates"]


def _llm_ancestor(span_id: str, by_id: dict[str, Span], parent_ids: dict[str, str | None]) -> Span | None:
    parent_id = parent_ids[span_id]
    while parent_id is not None:
        span = by_id[parent_id]
        if span.attributes.get(SPAN_KIND) == KIND_LLM:
            return span
        parent_id = parent_ids[parent_id]
    return None


Event = tuple[Span | None, Any, bool | None]


def drop_source_duplicates(
    events: list[Event], parent_ids: dict[str, str | None], by_id: dict[str, Span]
) -> tuple[list[Event], int]:
    """One LLM span per call where another instrumentation's spans (`SPAN_SOURCE`) meet an adapter's.

    A source's LLM span inside an LLM span of ours records the same call (a client span under a framework span):
    it is dropped, and hands its response id to ours when ours has none. Of LLM spans left with the same response
    id, one of ours is kept (else the first). Returns the events left and how many spans were dropped.
    """
    adopted: dict[str, Any] = {}  # our span id -> response id taken from the source span inside it
    drop: set[int] = set()
    for index, (span, key, is_final) in enumerate(events):
        if is_final is not None or span is None or SPAN_SOURCE not in span.attributes:
            continue
        outer = _llm_ancestor(span.span_id, by_id, parent_ids)
        if outer is not None and SPAN_SOURCE not in outer.attributes:
            drop.add(index)
            if key is not None and outer.attributes.get(GEN_AI_RESPONSE_ID) is None:
                adopted.setdefault(outer.span_id, key)
    kept_for: dict[Any, int] = {}
    out: list[Event] = []
    for index, event in enumerate(events):
        if index in drop:
            continue
        span, key, is_final = event
        if is_final is None and span is not None:
            key = adopted.get(span.span_id, key)
            if key is not None:
                if key in kept_for:
                    first = out[kept_for[key]][0]
                    if first is not None and SPAN_SOURCE in first.attributes and SPAN_SOURCE not in span.attributes:
                        out[kept_for[key]] = (span, key, None)  # ours replaces the source's span of the same call
                    drop.add(index)
                    continue
                kept_for[key] = len(out)
            if key is not event[1]:
                event = (span, key, None)
        out.append(event)  # the event itself, not a copy: `Events` finds its final reward by identity
    return out, len(drop)
