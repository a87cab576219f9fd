"""Finished spans as the store's `agentlightning.Span` records: one conversion for every way a span is recorded.

The SDK's spans (`ReadableSpan`) and our own light spans (`agentlightning.tracing._light.LightSpan`) expose the same
fields (name, context, parent, attributes, events, status, start and end times), so both go through
`to_span_model` and give the same record.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.sdk.trace import Event
from opentelemetry.trace import SpanContext, Status, StatusCode

from agentlightning._models import AttributeValue, Span, SpanStatus
from agentlightning.tracing import _genai
from agentlightning.tracing._context import RolloutContext

__all__ = ["FinishedSpan", "to_span_model"]

logger = logging.getLogger(__name__)


class FinishedSpan(Protocol):
    """What `to_span_model` reads of a finished span: the SDK's ``ReadableSpan`` and our light spans have it."""

    @property
    def name(self) -> str: ...
    @property
    def context(self) -> SpanContext | None: ...
    @property
    def parent(self) -> SpanContext | None: ...
    @property
    def attributes(self) -> Mapping[str, Any] | None: ...
    @property
    def events(self) -> Sequence[Event]: ...
    @property
    def status(self) -> Status: ...
    @property
    def start_time(self) -> int | None: ...
    @property
    def end_time(self) -> int | None: ...


_STATUS: dict[StatusCode, Any] = {StatusCode.UNSET: "unset", StatusCode.OK: "ok", StatusCode.ERROR: "error"}

_UNSET = SpanStatus()  # frozen, so every span without a status can share it


def _attributes(attrs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The attributes as the record wants them; the span's own mapping when nothing needs a change (most spans:
    scalars only), which validation copies into the record anyway."""
    if not attrs:
        return {}
    for value in attrs.values():
        if isinstance(value, tuple) or (type(value) is float and not math.isfinite(value)):
            return _fixed(attrs)
    return attrs


def _fixed(attrs: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """A copy with lists for tuples, and NaN/Infinity as text."""
    out: dict[str, AttributeValue] = {}
    for key, value in attrs.items():
        if isinstance(value, tuple):  # OpenTelemetry stores lists as tuples; the model wants lists
            items: list[Any] = list(value)  # pyright: ignore[reportUnknownArgumentType]
            if None in items:  # OpenTelemetry lets None into lists; our model does not
                logger.debug("attribute %r holds None in a list; left out", key)
                continue
            if items and type(items[0]) is float and not all(math.isfinite(x) for x in items):
                items = [x if math.isfinite(x) else repr(x) for x in items]
                items = [str(x) for x in items]  # one type per list: OpenTelemetry lists are homogeneous
                _warn_non_finite(key)
            out[key] = items
        elif type(value) is float and not math.isfinite(value):
            out[key] = repr(value)  # JSON cannot hold NaN/Infinity and the store refuses them: keep it as text
            _warn_non_finite(key)
        else:
            out[key] = value
    return out


_warned_non_finite: set[str] = set()


def _warn_non_finite(key: str) -> None:
    if key not in _warned_non_finite and len(_warned_non_finite) < 1000:
        _warned_non_finite.add(key)
        logger.warning("span attribute %r holds NaN or Infinity; stored as text ('nan', 'inf')", key)


def to_span_model(ctx: RolloutContext, sequence_id: int, span: FinishedSpan) -> Span:
    """Convert a finished OpenTelemetry span into the store's `Span` record, validated.

    Validated here, where it is made (pydantic validation costs no more than ``model_construct``), so the store
    boundary keeps it as is; every field is produced in the form the model requires (hex ids, seconds,
    end >= start, OpenTelemetry-cleaned attribute values), so a failure is a bug, logged by the caller.
    """
    sc = span.context
    assert sc is not None
    start_ns = span.start_time or 0
    end_ns = span.end_time or start_ns
    parent = span.parent
    status = span.status
    attributes = _attributes(span.attributes)
    # A span source was in use: map its spans (in a copy: the span's own mapping is not ours).
    if _genai.source_in_use():
        attributes = dict(attributes)
        _genai.source_attributes(attributes)
    return Span.__pydantic_validator__.validate_python(  # model_validate without its per-call argument checks
        {
            "rollout_id": ctx.rollout_id,
            "attempt_id": ctx.attempt_id,
            "sequence_id": sequence_id,
            "trace_id": format(sc.trace_id, "032x"),
            "span_id": format(sc.span_id, "016x"),
            "parent_id": format(parent.span_id, "016x") if parent is not None and parent.is_valid else None,
            "name": span.name,
            "start_time": start_ns / 1e9,
            "end_time": max(end_ns, start_ns) / 1e9,
            "attributes": attributes,
            "events": [
                {"name": event.name, "timestamp": event.timestamp / 1e9, "attributes": _attributes(event.attributes)}
                for event in span.events
            ],
            "status": _UNSET
            if status.status_code is StatusCode.UNSET and status.description is None
            else {"code": _STATUS.get(status.status_code, "unset"), "description": status.description},
        }
    )
