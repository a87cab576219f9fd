"""Trusted construction: models from data that already passed the validation boundary, without validating again.

The rule (see `agentlightning._models`): everything entering a store is validated once, at the store boundary
(``agentlightning.store._common``). Past it the data is known good, and building a model from it with pydantic's
validation would check it a second time; ``model_construct`` is no faster than validation in pydantic 2 and marks
its result as unvalidated. This module is the one place that builds models without validation, for code after the
boundary: transitions and training samples made from stored records, records read back from a store's own files
or from a served store's answers.

Every function returns an object equal to what validated construction gives for the same data; the tests
(``test_fast.py``) check this for generated data. The JSON readers fall back to validation when the data does not
have the exact layout the current models write (a record written by an older version, or by another program), so
an old record is upgraded or refused with pydantic's error, never half-built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import from_json

from agentlightning._models import (
    LLMCall,
    LLMResource,
    PromptTemplateResource,
    Resources,
    Span,
    SpanEvent,
    SpanStatus,
    ValueResource,
)

__all__ = [
    "call_from_json",
    "calls_from_json",
    "fast_factory",
    "fast_model",
    "fast_replace",
    "resources_from_json",
    "span_from_json",
    "spans_from_json",
]

_M = TypeVar("_M", bound=BaseModel)

_new = object.__new__
_set = object.__setattr__
_FIELDS_SET: dict[type[BaseModel], frozenset[str]] = {}


def _fields_set(cls: type[BaseModel]) -> frozenset[str]:
    fields_set = _FIELDS_SET.get(cls)
    if fields_set is None:
        fields_set = _FIELDS_SET[cls] = frozenset(cls.model_fields)
    return fields_set


def fast_model(cls: type[_M], values: dict[str, Any]) -> _M:
    """Return an instance of ``cls`` holding ``values`` as is (no validation, no defaults filled in).

    The dict becomes the model's ``__dict__`` (not copied). The model counts as validated (`is_validated`).

    Args:
        cls: A pydantic model class without private attributes or extra fields.
        values: One entry for every field of ``cls``, already of the declared types.
    """
    obj = _new(cls)
    _set(obj, "__dict__", values)
    _set(obj, "__pydantic_fields_set__", _fields_set(cls))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def fast_factory(cls: type[_M]) -> Callable[[dict[str, Any]], _M]:
    """A `fast_model` bound to ``cls`` (saves a lookup per object in tight loops)."""
    fields_set = _fields_set(cls)

    def make(values: dict[str, Any]) -> _M:
        obj = _new(cls)
        _set(obj, "__dict__", values)
        _set(obj, "__pydantic_fields_set__", fields_set)
        _set(obj, "__pydantic_extra__", None)
        _set(obj, "__pydantic_private__", None)
        return obj

    return make


def fast_replace(model: _M, **changes: Any) -> _M:
    """A copy of a validated ``model`` with ``changes`` (known-good values of the declared types) applied."""
    return fast_model(type(model), {**model.__dict__, **changes})


# ----------------------------------------------------------------------------------------------- JSON readers
# Readers of JSON written by our own models' serialiser (SQLite rows, a served store's answers). A record whose
# keys differ from the current fields, or whose numbers are not of the exact JSON types the serialiser writes,
# is validated instead (see the module docstring).

_new_span = fast_factory(Span)
_new_status = fast_factory(SpanStatus)
_new_event = fast_factory(SpanEvent)
_new_call = fast_factory(LLMCall)
_new_resources = fast_factory(Resources)
_SPAN_KEYS = frozenset(Span.model_fields)
_STATUS_KEYS = frozenset(SpanStatus.model_fields)
_EVENT_KEYS = frozenset(SpanEvent.model_fields)
_CALL_KEYS = frozenset(LLMCall.model_fields)
_RESOURCES_KEYS = frozenset(Resources.model_fields)
_RESOURCE_KINDS: dict[str, tuple[Callable[[dict[str, Any]], BaseModel], frozenset[str]]] = {
    cls.model_fields["kind"].default: (fast_factory(cls), frozenset(cls.model_fields))
    for cls in (LLMResource, PromptTemplateResource, ValueResource)
}
_UNSET = SpanStatus()


def _span(values: Any) -> Span:
    if (
        type(values) is not dict
        or values.keys() != _SPAN_KEYS
        or type(values["start_time"]) is not float
        or type(values["end_time"]) is not float
    ):
        return Span.model_validate(values)
    status = values["status"]
    if type(status) is not dict or status.keys() != _STATUS_KEYS:
        return Span.model_validate(values)
    values["status"] = _UNSET if status["code"] == "unset" and status["description"] is None else _new_status(status)
    events = values["events"]
    if events:
        made: list[SpanEvent] = []
        for event in events:
            if type(event) is not dict or event.keys() != _EVENT_KEYS or type(event["timestamp"]) is not float:
                values["status"] = status
                return Span.model_validate(values)
            made.append(_new_event(event))
        values["events"] = made
    return _new_span(values)


def span_from_json(data: str | bytes) -> Span:
    """The `Span` a store wrote as ``data`` (JSON from ``Span.model_dump_json``).

    Raises:
        pydantic.ValidationError: The JSON is not a span, in the current layout or an older one.
    """
    return _span(from_json(data, allow_inf_nan=False))


def spans_from_json(rows: list[Any]) -> list[Span]:
    """`span_from_json` for a list of JSON texts or of already parsed dicts (e.g. a served store's answer)."""
    return [_span(from_json(row, allow_inf_nan=False) if isinstance(row, str | bytes) else row) for row in rows]


def _call(values: Any) -> LLMCall:
    if type(values) is not dict or values.keys() != _CALL_KEYS or type(values["start_time"]) is not float:
        return LLMCall.model_validate(values)
    end_time = values["end_time"]
    logprobs = values["response_logprobs"]
    if (end_time is not None and type(end_time) is not float) or (logprobs is not None and None in logprobs):
        return LLMCall.model_validate(values)  # None in log-probs: a NaN stored as null by an older version
    return _new_call(values)


def call_from_json(data: str | bytes) -> LLMCall:
    """The `LLMCall` a store wrote as ``data`` (JSON from ``LLMCall.model_dump_json``).

    Raises:
        pydantic.ValidationError: The JSON is not an LLM call, in the current layout or an older one.
    """
    return _call(from_json(data, allow_inf_nan=False))


def calls_from_json(rows: list[Any]) -> list[LLMCall]:
    """`call_from_json` for a list of JSON texts or of already parsed dicts."""
    return [_call(from_json(row, allow_inf_nan=False) if isinstance(row, str | bytes) else row) for row in rows]


def resources_from_json(data: str | bytes | dict[str, Any]) -> Resources:
    """The `Resources` a store wrote as ``data`` (JSON from ``Resources.model_dump_json``, or that JSON parsed).

    Raises:
        pydantic.ValidationError: The JSON is not a resources set.
    """
    values = from_json(data, allow_inf_nan=False) if isinstance(data, str | bytes) else dict(data)
    if type(values) is not dict or values.keys() != _RESOURCES_KEYS or type(values["created_at"]) is not float:
        return Resources.model_validate(values)
    items = values["items"]
    made: dict[str, BaseModel] = {}
    for name, item in items.items():
        kind = _RESOURCE_KINDS.get(item.get("kind")) if type(item) is dict else None
        if kind is None or item.keys() != kind[1]:
            return Resources.model_validate(values)
        made[name] = kind[0](item)
    values["items"] = made
    return _new_resources(values)
