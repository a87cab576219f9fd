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
from typing import Any, TypeVar, cast

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
from agentlightning._training_models import TrainingSample, TrainingSampleFields, Transition, TransitionFields

__all__ = [
    "call_from_json",
    "calls_from_json",
    "fast_factory",
    "fast_model",
    "fast_replace",
    "new_training_sample",
    "new_transition",
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


# ------------------------------------------------------------------------------------ transitions and samples
# The one typed constructor of each training model past the boundary: the builder, the trajectory merge and the
# batch build their values as a `TransitionFields` / `TrainingSampleFields` literal (checked by pyright) and make
# the model here, without a second validation (the values come from validated records; test_fast.py compares).

new_transition = cast(Callable[[TransitionFields], Transition], fast_factory(Transition))
"""The `Transition` holding ``fields`` as its ``__dict__`` (no validation; the dict is not copied)."""

new_training_sample = cast(Callable[[TrainingSampleFields], TrainingSample], fast_factory(TrainingSample))
"""The `TrainingSample` holding ``fields`` as its ``__dict__`` (no validation; the dict is not copied)."""


# ----------------------------------------------------------------------------------------------- JSON readers
# Readers of JSON written by our own models' serialiser (SQLite rows, a served store's answers). A record whose
# keys differ from the current fields, or whose numbers are not of the exact JSON types the serialiser writes,
# is validated instead (see the module docstring).

_new_span = fast_factory(Span)
_new_status = fast_factory(SpanStatus)
_new_event = fast_factory(SpanEvent)
_new_call = fast_factory(LLMCall)
_new_resources = fast_factory(Resources)

_N = type(None)
# The JSON types each field's serialised value has (top level only: the values inside were validated on entry).
# test_fast.py checks that every table names exactly the model's fields.
_SPAN_TYPES: dict[str, tuple[type, ...]] = {
    "rollout_id": (str,),
    "attempt_id": (str,),
    "sequence_id": (int,),
    "trace_id": (str,),
    "span_id": (str,),
    "parent_id": (str, _N),
    "name": (str,),
    "start_time": (float,),
    "end_time": (float,),
    "attributes": (dict,),
    "events": (list,),
    "status": (dict,),
}
_STATUS_TYPES: dict[str, tuple[type, ...]] = {"code": (str,), "description": (str, _N)}
_EVENT_TYPES: dict[str, tuple[type, ...]] = {"name": (str,), "timestamp": (float,), "attributes": (dict,)}
_CALL_TYPES: dict[str, tuple[type, ...]] = {
    "call_id": (str,),
    "rollout_id": (str,),
    "attempt_id": (str,),
    "response_id": (str, _N),
    "request": (dict,),
    "response": (dict, _N),
    "prompt_token_ids": (list,),
    "response_token_ids": (list,),
    "response_logprobs": (list, _N),
    "model": (str, _N),
    "model_version": (int, _N),
    "backend": (str, _N),
    "start_time": (float,),
    "end_time": (float, _N),
    "error": (str, _N),
    "policy": (str, _N),
    "agent_name": (str, _N),
}
_RESOURCES_TYPES: dict[str, tuple[type, ...]] = {
    "resources_id": (str,),
    "version": (int,),
    "items": (dict,),
    "created_at": (float,),
}
_RESOURCE_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "llm": {
        "kind": (str,),
        "endpoint": (str,),
        "model": (str,),
        "sampling_parameters": (dict,),
        "api_key": (str, _N),
        "runner_token": (str, _N),
    },
    "prompt_template": {"kind": (str,), "template": (str,), "engine": (str,)},
    "value": {"kind": (str,), "value": ()},
}
_RESOURCE_FACTORIES: dict[str, Callable[[dict[str, Any]], BaseModel]] = {
    "llm": fast_factory(LLMResource),
    "prompt_template": fast_factory(PromptTemplateResource),
    "value": fast_factory(ValueResource),
}
_UNSET = SpanStatus()
_MISSING = object()


def _has_shape(values: Any, types: dict[str, tuple[type, ...]]) -> bool:
    """Whether ``values`` is a dict with exactly the fields of ``types``, each of one of its types (``()``: any)."""
    if type(values) is not dict or len(values) != len(types):  # pyright: ignore[reportUnknownArgumentType]
        return False
    for key, allowed in types.items():
        value = values.get(key, _MISSING)  # pyright: ignore[reportUnknownMemberType,reportUnknownVariableType]
        if value is _MISSING or (allowed and type(value) not in allowed):  # pyright: ignore[reportUnknownArgumentType]
            return False
    return True


def _span(values: Any) -> Span:
    if not _has_shape(values, _SPAN_TYPES) or not _has_shape(values["status"], _STATUS_TYPES):
        return Span.model_validate(values)
    events = values["events"]
    if events and not all(_has_shape(event, _EVENT_TYPES) for event in events):
        return Span.model_validate(values)
    status = values["status"]
    values["status"] = _UNSET if status["code"] == "unset" and status["description"] is None else _new_status(status)
    if events:
        values["events"] = [_new_event(event) for event in events]
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
    if not _has_shape(values, _CALL_TYPES) or (
        values["response_logprobs"] is not None and None in values["response_logprobs"]
    ):
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
    if not _has_shape(values, _RESOURCES_TYPES):
        return Resources.model_validate(values)
    made: dict[str, BaseModel] = {}
    for name, item in values["items"].items():
        kind = item.get("kind") if type(item) is dict else None
        if not isinstance(kind, str) or kind not in _RESOURCE_TYPES or not _has_shape(item, _RESOURCE_TYPES[kind]):
            return Resources.model_validate(values)
        made[name] = _RESOURCE_FACTORIES[kind](item)
    values["items"] = made
    return _new_resources(values)
