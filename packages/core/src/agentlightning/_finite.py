"""Whether JSON-like values hold NaN or infinite floats: JSON cannot hold them (stored, they would become ``null``).

`check_json_finite` (re-exported by `agentlightning._models`) runs on every record entering a store, so on every LLM
call's request and response: the walk below is tuned for that.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_json_finite"]

_LEAVES = frozenset({str, int, bool, type(None)})
"""Types that hold no float: a container holding only these is skipped in one C-level pass (`_all_finite`)."""


def _all_finite(value: Any) -> bool:
    """Whether no float inside a JSON-like value (dicts, lists, tuples) is NaN or infinite (no paths: fast).

    Every LLM call's request and response pass here (with a logprob entry per generated token), so the walk is
    tuned: exact types are dispatched with ``is``, and a container whose items are all `_LEAVES` (the bytes of a
    token, the messages' strings) is skipped without pushing its items. Subclasses are handled like their bases.
    """
    stack = [value]
    pop, extend = stack.pop, stack.extend
    leaves = _LEAVES
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            items: Any = item.values()  # pyright: ignore[reportUnknownMemberType]
        elif kind is list or kind is tuple:
            items = item
        elif kind is float:
            if not math.isfinite(item):
                return False
            continue
        elif kind in leaves:
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                return False
            continue
        elif isinstance(item, dict):
            items = item.values()  # pyright: ignore[reportUnknownMemberType]
        elif isinstance(item, list | tuple):
            items = item
        else:
            continue
        if not leaves.issuperset(map(type, items)):  # pyright: ignore[reportUnknownArgumentType]
            extend(items)  # pyright: ignore[reportUnknownArgumentType]
    return True


def _first_non_finite(value: Any, path: str) -> str:
    """Path and value of the first NaN/infinite float inside ``value`` (called once `_all_finite` said there is one)."""
    if isinstance(value, float):
        return f"{path} = {value!r}"
    items: Any = None
    if isinstance(value, dict):
        items = ((f"{path}[{key!r}]", item) for key, item in value.items())  # pyright: ignore[reportUnknownVariableType,reportUnknownMemberType]
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))  # pyright: ignore[reportUnknownArgumentType,reportUnknownVariableType]
    for where, item in items or ():
        if not _all_finite(item):
            return _first_non_finite(item, where)
    return path


def check_json_finite(value: Any, name: str) -> Any:
    """Return ``value`` unchanged if no number inside it is NaN or infinite, else raise a `ValueError` naming where.

    JSON has no NaN or Infinity: stored, they would silently become ``null``. Every record entering a store is
    checked at the validation boundary (typed float fields by pydantic, free-form JSON fields by this function).
    """
    if not _all_finite(value):
        where = _first_non_finite(value, name)
        raise ValueError(
            f"non-finite number at {where}: JSON cannot hold NaN or Infinity (it would be stored as null); "
            "replace it with a finite number, None or a string"
        )
    return value
