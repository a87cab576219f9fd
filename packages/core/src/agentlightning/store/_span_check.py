"""The fast lane of span validation: a batch of span dicts in the usual shape, checked column by column.

pydantic validates a span in ~10 µs (ten fields, a union per attribute value, two Python validators on its ids and
one on its times): about half of a served store's CPU per span. Almost every batch a runner sends has the same
shape: the fields the serialiser writes (all, or all but ``events`` and ``status`` where `StoreClient` leaves
those defaults out), hex ids, finite float times, scalar or homogeneous-list attributes, no
events. `spans_from_dicts` checks such a batch by the same rules as `agentlightning._models.Span`, a whole column
at a time (type sets, one regular-expression match over the joined hex ids, sums for finiteness: loops that run in
C), and builds the models without a second validation (`agentlightning._fast`).

It accepts only what pydantic accepts and builds what pydantic builds (``test_span_check.py`` compares both on
generated batches, valid and not). It answers ``None`` whenever a batch has anything else, however legal (an int
time, an event, a mixed list, an id that is not ASCII-printable...): the caller then validates with pydantic, which
decides and words the refusal, so a bad batch is refused exactly as before.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any, overload

from agentlightning._fast import fast_factory
from agentlightning._models import MAX_ID_LENGTH, Span, SpanStatus

__all__ = ["CheckedSpans", "spans_from_dicts"]

_FIELDS = tuple(Span.model_fields)
_FIELD_SET = frozenset(_FIELDS)
# every field but the trailing two, left out when at their defaults (as `StoreClient` sends a usual batch)
_LEAN_FIELDS = _FIELDS[:-2]
assert _FIELDS[-2:] == ("events", "status")
_REQUIRED = ("rollout_id", "attempt_id", "sequence_id", "trace_id", "span_id", "name", "start_time", "end_time")
_required = operator.itemgetter(*_REQUIRED)  # the columns in field order, parent_id left out
_MISSING: Any = object()
_get_parent = operator.methodcaller("get", "parent_id")
_get_attributes = operator.methodcaller("get", "attributes", _MISSING)
_get_events = operator.methodcaller("get", "events", _MISSING)
_get_status = operator.methodcaller("get", "status", _MISSING)
_HEX = re.compile(r"[0-9a-f]*")
_NOT_IDS = frozenset({".", ".."})
_VALUE_TYPES = frozenset({str, bool, int, float, type(None), list})
_ITEM_TYPES = frozenset({str, bool, int, float})
_CODES = frozenset({"unset", "ok", "error"})
_STATUS_KEYS = frozenset({"code", "description"})
_UNSET = SpanStatus()
_UNSET_DICT = {"code": "unset", "description": None}
_new_span = fast_factory(Span)
_new_status = fast_factory(SpanStatus)


def _types(values: Any) -> set[type]:
    return set(map(type, values))


def _usual_ids(values: Sequence[Any]) -> bool:
    """Whether every value is a `StoreId` of the usual kind (str, 1-256 printable characters, not a dot segment)."""
    if _types(values) != {str}:
        return False
    return all(0 < len(v) <= MAX_ID_LENGTH and v.isprintable() and v not in _NOT_IDS for v in set(values))


def _hex(values: Any, length: int) -> bool:
    """Whether every value is a str of ``length`` lowercase hex digits (the pattern of trace / span ids)."""
    return _types(values) == {str} and set(map(len, values)) == {length} and _HEX.fullmatch("".join(values)) is not None


def _finite_floats(values: Any) -> bool:
    """Whether every value is a float and none is NaN or infinite."""
    return _types(values) == {float} and _all_finite(values)


def _all_finite(floats: Any) -> bool:
    """Whether no float is NaN or infinite: their sum says so in one C loop, unless it overflowed (large finite
    values, e.g. two of 1e308), which one look at each value settles."""
    return math.isfinite(sum(floats)) or all(map(math.isfinite, floats))


def _attributes(column: list[Any], copy: bool) -> list[dict[str, Any]] | None:
    """The ``attributes`` dicts (copied, with their lists, when ``copy``), or ``None`` if one is unusual."""
    if _types(column) != {dict}:
        return None
    values = list(chain.from_iterable(map(dict.values, column)))
    kinds = _types(values)
    if not kinds <= _VALUE_TYPES:
        return None
    if float in kinds and not _all_finite([v for v in values if type(v) is float]):
        return None
    if _types(chain.from_iterable(column)) - {str}:  # keys (JSON's always are)
        return None
    if list not in kinds:
        return list(map(dict, column)) if copy else column
    for value in values:
        # a list of one item type: what pydantic's union keeps as it is (mixed lists it converts; leave those to it)
        if type(value) is list and value:
            item_types = _types(value)
            if len(item_types) != 1 or not item_types <= _ITEM_TYPES:
                return None
            if float in item_types and not _all_finite(value):
                return None
    if not copy:
        return column
    return [{k: list(v) if type(v) is list else v for k, v in attributes.items()} for attributes in column]


def _statuses(column: Sequence[Any]) -> list[SpanStatus] | None:
    if column.count(_UNSET_DICT) == len(column):  # the usual batch, as our serialiser writes it (in C)
        return [_UNSET] * len(column)
    made: list[SpanStatus] = []
    for status in column:
        if status is _MISSING or (type(status) is dict and status == _UNSET_DICT):
            made.append(_UNSET)
            continue
        if type(status) is not dict or not status.keys() <= _STATUS_KEYS:
            return None
        code, description = status.get("code", "unset"), status.get("description")
        if type(code) is not str or code not in _CODES or (description is not None and type(description) is not str):
            return None
        made.append(_new_status({"code": code, "description": description}))
    return made


class CheckedSpans(Sequence[Span]):
    """Spans the fast lane checked from dicts that were its own: their columns, the models made on first use.

    A served store hands a parsed batch to its backend as this: a SQL backend encodes the columns and never needs
    the models (`agentlightning.store._codec_spans.encode_spans`); any other reader gets the models, made once, exactly
    as `spans_from_dicts` would have returned them. The boundary passes it through (it was checked here).

    Attributes:
        columns: ``rollout_id``, ``attempt_id``, ``sequence_id``, ``trace_id``, ``span_id``, ``parent_id``,
            ``name``, ``start_time``, ``end_time``, ``attributes`` (one tuple per field, in span order); every span
            has no events and an unset status.
    """

    __slots__ = ("_dicts", "_spans", "_statuses", "columns")

    def __init__(self, dicts: list[dict[str, Any]], columns: list[Sequence[Any]], statuses: list[SpanStatus]) -> None:
        self._dicts: list[dict[str, Any]] | None = dicts
        self._statuses = statuses
        self._spans: list[Span] = []
        self.columns = columns

    def spans(self) -> list[Span]:
        """The models (made from the dicts on the first call: each dict becomes its span's ``__dict__``)."""
        dicts = self._dicts
        if dicts is not None:
            self._dicts = None
            for values, status in zip(dicts, self._statuses, strict=True):
                if "events" not in values:  # sent without its defaults
                    values["events"] = []
                values["status"] = status
            self._spans = list(map(_new_span, dicts))
        return self._spans

    def __len__(self) -> int:
        return len(self.columns[0])

    @overload
    def __getitem__(self, index: int) -> Span: ...
    @overload
    def __getitem__(self, index: slice) -> list[Span]: ...
    def __getitem__(self, index: int | slice) -> Span | list[Span]:
        return self.spans()[index]

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans())


def spans_from_dicts(items: list[Any], owned: bool = False) -> list[Span] | CheckedSpans | None:
    """The validated spans of a batch of span dicts in the usual shape (see the module docstring), else ``None``.

    Args:
        items: The span dicts.
        owned: The dicts are the caller's to give away (just parsed from JSON): a dict with every field in the
            model's order (as our serialiser writes them), or every field but the default ``events`` and
            ``status`` (as `StoreClient` sends them), becomes its span's ``__dict__`` (and such a batch without
            events or status comes back as `CheckedSpans`). Otherwise the spans hold new dicts and
            lists, and the caller's can change afterwards without changing them.
    """
    if not items:
        return []
    if _types(items) != {dict}:
        return None
    layouts = set(map(tuple, items))
    if layouts == {_FIELDS}:  # every field, in the model's order: the columns in one pass
        columns: list[Sequence[Any]] = list(zip(*map(dict.values, items), strict=True))
        in_place = owned
    elif layouts == {_LEAN_FIELDS}:  # the same without events and status (at their defaults: left out)
        columns = list(zip(*map(dict.values, items), strict=True))
        columns += [[[]] * len(items), [_MISSING] * len(items)]
        in_place = owned
    else:
        if not set().union(*items) <= _FIELD_SET:
            return None
        try:
            columns = list(zip(*map(_required, items), strict=True))
        except KeyError:  # a required field is missing
            return None
        columns[5:5] = [list(map(_get_parent, items))]
        columns += [list(map(_get_attributes, items)), list(map(_get_events, items)), list(map(_get_status, items))]
        in_place = False
    rollout_ids, attempt_ids, sequence_ids, trace_ids, span_ids, parents, names, starts, ends = columns[:9]
    if not (
        _usual_ids(rollout_ids)
        and _usual_ids(attempt_ids)
        and _types(sequence_ids) == {int}
        and min(sequence_ids) >= 0
        and _hex(trace_ids, 32)
        and _hex(span_ids, 16)
        and _types(names) == {str}
        and _finite_floats(starts)
        and _finite_floats(ends)
        and all(map(operator.le, starts, ends))
        and (not _types(parents) - {type(None)} or _hex([p for p in parents if p is not None], 16))
        and (
            columns[10].count([]) == len(items)
            or not any(event is not _MISSING and (type(event) is not list or event) for event in columns[10])
        )
    ):
        return None  # (events: pydantic checks them)
    attributes = columns[9]
    if _MISSING in attributes:
        attributes = [{} if a is _MISSING else a for a in attributes]
    checked = _attributes(list(attributes), copy=not in_place)
    statuses = _statuses(columns[11])
    if checked is None or statuses is None:
        return None
    if in_place:
        if columns[10].count([]) == len(items) and statuses.count(_UNSET) == len(items):
            return CheckedSpans(items, columns[:10], statuses)
        for values, status in zip(items, statuses, strict=True):
            if "events" not in values:
                values["events"] = []
            values["status"] = status
        return list(map(_new_span, items))
    # new dicts in the field order of the model (as pydantic fills __dict__), events new empty lists
    rows = zip(*columns[:9], checked, statuses, strict=True)
    return [_new_span(dict(zip(_FIELDS, (*row[:10], [], row[10]), strict=True))) for row in rows]
