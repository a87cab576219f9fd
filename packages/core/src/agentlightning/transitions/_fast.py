"""Building already-validated pydantic models without re-validating them (the conversion hot path).

``Model.model_construct`` is slower than validation in pydantic 2 for small models, so the hot path fills
``__dict__`` directly. Callers must pass every field with a value of the right type; the tests check that
the result equals a validated model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["fast_factory", "fast_model"]

_M = TypeVar("_M", bound=BaseModel)

_new = object.__new__
_set = object.__setattr__
_FIELDS_SET: dict[type[BaseModel], frozenset[str]] = {}


def fast_model(cls: type[_M], values: dict[str, Any]) -> _M:
    """Return an instance of ``cls`` holding ``values`` as is (no validation, no defaults filled in).

    Args:
        cls: A pydantic model class without private attributes or extra fields.
        values: One entry for every field of ``cls``, already of the declared types.
    """
    fields_set = _FIELDS_SET.get(cls)
    if fields_set is None:
        fields_set = _FIELDS_SET[cls] = frozenset(cls.model_fields)
    obj = _new(cls)
    _set(obj, "__dict__", values)
    _set(obj, "__pydantic_fields_set__", fields_set)
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def fast_factory(cls: type[_M]) -> Callable[[dict[str, Any]], _M]:
    """A `fast_model` bound to ``cls`` (saves a lookup per object in tight loops)."""
    fields_set = frozenset(cls.model_fields)

    def make(values: dict[str, Any]) -> _M:
        obj = _new(cls)
        _set(obj, "__dict__", values)
        _set(obj, "__pydantic_fields_set__", fields_set)
        _set(obj, "__pydantic_extra__", None)
        _set(obj, "__pydantic_private__", None)
        return obj

    return make
