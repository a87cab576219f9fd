"""The compact storage format of spans (format 1), shared by the SQLite and PostgreSQL stores.

A span row keeps its ids in columns; its ``data`` is a legacy JSON document (still read, never written) or format 1
(first byte ``0x01``): a fixed binary header (flags, start and end time as float64 bits, trace id and parent id as
raw bytes) and a JSON tail ``[name, attributes, events, status]``. Attribute keys of the well-known table `_KEYS`
are written as their index, and the ``agentlightning.rollout_id`` / ``agentlightning.attempt_id`` attributes, when
they repeat the row's own ids, as a marker. Events and status are left out when empty / unset. Uncompressed on
purpose: a span write must stay a few microseconds. An attribute string or list whose JSON is at least `BLOB_MIN`
bytes is stored once, as a blob (see `agentlightning.store._codec`, which also holds the LLM calls' format).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from typing import Any

import orjson
from pydantic_core import from_json, to_json

from agentlightning import semconv
from agentlightning._fast import spans_from_json
from agentlightning._models import Span, SpanStatus
from agentlightning.store._codec import BLOB_MIN, FORMAT_1, BlobFetch, blob_ref, blob_value, fetch_blobs, is_binary
from agentlightning.store._span_check import CheckedSpans

__all__ = ["decode_spans", "encode_span", "encode_spans"]

_ABSENT = object()
# Append-only: a span written with index i names _KEYS[i] forever (format 1). New names go at the end.
_KEYS: tuple[str, ...] = (
    semconv.ROLLOUT_ID,
    semconv.ATTEMPT_ID,
    semconv.SPAN_KIND,
    semconv.ADAPTER_NAME,
    semconv.GEN_AI_OPERATION,
    semconv.GEN_AI_SYSTEM,
    semconv.GEN_AI_AGENT_NAME,
    semconv.GEN_AI_REQUEST_MODEL,
    semconv.GEN_AI_RESPONSE_ID,
    semconv.GEN_AI_RESPONSE_MODEL,
    semconv.GEN_AI_TOOL_NAME,
    semconv.GEN_AI_USAGE_INPUT_TOKENS,
    semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
    semconv.PROMPT_TOKEN_IDS,
    semconv.RESPONSE_TOKEN_IDS,
    semconv.RESPONSE_LOGPROBS,
    semconv.REWARD_VALUE,
    semconv.REWARD_NAME,
    semconv.REWARD_FINAL,
    semconv.SPAN_SOURCE,
)
_KEY_INDEX = {key: index for index, key in enumerate(_KEYS)}
_SAME_ROLLOUT = -1  # the attribute agentlightning.rollout_id, equal to the row's rollout id
_SAME_ATTEMPT = -2
_ROLLOUT_INDEX = _KEY_INDEX[semconv.ROLLOUT_ID]
_ATTEMPT_INDEX = _KEY_INDEX[semconv.ATTEMPT_ID]

_SPAN_HEAD = struct.Struct("<Bdd16s")  # format, flags... see encode_span
# what `encode_spans` reads of a span, from its __dict__ (one C call per span)
_SPAN_PARTS = operator.itemgetter(
    "rollout_id",
    "attempt_id",
    "trace_id",
    "parent_id",
    "name",
    "start_time",
    "end_time",
    "attributes",
    "events",
    "status",
)
_STATUS_PARTS = operator.attrgetter("code", "description")
_UNSET_PARTS = ("unset", None)
_UNSET_STATUS = SpanStatus()
_values_of = operator.attrgetter("__dict__")
_PARENT = 1
_EVENTS = 2
_STATUS = 4


def encode_span(span: Span, blobs: dict[bytes, bytes]) -> bytes:
    """The format-1 ``data`` of ``span`` (its ids are the row's columns); large values are added to ``blobs``."""
    attrs: list[Any] = []
    rollout_id, attempt_id = span.rollout_id, span.attempt_id
    for name, value in span.attributes.items():
        index = _KEY_INDEX.get(name)
        if index == _ROLLOUT_INDEX and value == rollout_id:
            attrs += (_SAME_ROLLOUT, 0)
            continue
        if index == _ATTEMPT_INDEX and value == attempt_id:
            attrs += (_SAME_ATTEMPT, 0)
            continue
        if (type(value) is str and len(value) >= BLOB_MIN // 2) or (type(value) is list and len(value) >= 16):
            hex_key = blob_ref(value, blobs)
            if hex_key is not None:
                value = {"#": hex_key}  # a dict is never an attribute value: unambiguous
        attrs += (name if index is None else index, value)
    flags = 0
    tail: list[Any] = [span.name, attrs]
    if span.events:
        flags |= _EVENTS
        tail.append(span.events)
    status = span.status
    if status.code != "unset" or status.description is not None:
        flags |= _STATUS
        tail += (status.code, status.description)
    head = _SPAN_HEAD.pack(FORMAT_1, span.start_time, span.end_time, bytes.fromhex(span.trace_id))
    if span.parent_id is not None:
        flags |= _PARENT
        return head + bytes((flags,)) + bytes.fromhex(span.parent_id) + to_json(tail)
    return head + bytes((flags,)) + to_json(tail)


def encode_spans(batch: Sequence[Span], blobs: dict[bytes, bytes]) -> list[bytes]:
    """The format-1 ``data`` of each span, as `encode_span` writes it, a column at a time.

    The usual span (no events, status unset, a tail too short to hold a value stored as a blob) is encoded by loops
    that run in C but one small function per span (its attributes); the others by `encode_span`. A `CheckedSpans`
    batch is encoded from its columns (its models are made only for a span that is not usual).
    """
    if not batch:
        return []
    if type(batch) is CheckedSpans:
        rollout_ids, attempt_ids, _, trace_ids, _, parents, names, starts, ends, attributes = batch.columns
        usual = True  # no events, status unset
    else:
        rollout_ids, attempt_ids, trace_ids, parents, names, starts, ends, attributes, events, statuses = zip(
            *map(_SPAN_PARTS, map(_values_of, batch)), strict=True
        )
        usual = not any(events) and set(map(_STATUS_PARTS, statuses)) == {_UNSET_PARTS}
    traces = {trace: bytes.fromhex(trace) for trace in set(trace_ids)}
    heads = map(_SPAN_HEAD.pack, repeat(FORMAT_1), starts, ends, map(traces.__getitem__, trace_ids))
    # the flags byte, then the parent's id (flags: only _PARENT here; events and status go to encode_span)
    links = {parent: bytes((_PARENT,)) + bytes.fromhex(parent) for parent in set(parents) if parent is not None}
    links[None] = b"\x00"
    flats = list(map(_AttributeLayouts().flat, attributes, rollout_ids, attempt_ids))
    tails = _tails(names, flats)
    datas = list(map(b"".join, zip(heads, map(links.__getitem__, parents), tails, strict=True)))
    if not usual or max(map(len, datas)) >= BLOB_MIN:  # (a value stored once has JSON of BLOB_MIN bytes or more)
        for index, data in enumerate(datas):
            span = None if usual and len(data) < BLOB_MIN else batch[index]
            if span is not None and (len(data) >= BLOB_MIN or span.events or span.status != _UNSET_STATUS):
                datas[index] = encode_span(span, blobs)
    return datas


_MARK = "\x00"  # written as "\u0000" between the tails of a batch; a value equal to it makes `_tails` split more
_SPLIT = b',"\\u0000",'
_OPEN, _CLOSE = b"[", b"]"


def _tails(names: Sequence[str], flats: list[list[Any]]) -> Iterable[bytes]:
    r"""``to_json([name, flat])`` of each span, made by one ``orjson.dumps`` of the whole batch (~a third the CPU).

    The batch is written as ``[MARK, name, flat, MARK, name, flat, ...]`` and cut where a ``,"\u0000",`` follows a
    span's ``flat``; a value that is itself the string ``"\x00"`` would add a cut, so the pieces are used only when
    there is one per span (else each tail is written alone, as are batches orjson refuses: integers past 64 bits).
    """
    try:
        whole = orjson.dumps(list(chain.from_iterable(zip(repeat(_MARK), names, flats))))
    except TypeError:  # (orjson.JSONEncodeError is a TypeError)
        whole = b""
    pieces = whole[len(_SPLIT) : -1].split(_SPLIT)  # the leading '["\u0000",' is as long as _SPLIT
    if len(pieces) != len(flats) or not whole:
        return map(to_json, zip(names, flats, strict=True))
    return map(b"".join, zip(repeat(_OPEN), pieces, repeat(_CLOSE)))


class _AttributeLayouts(dict[tuple[str, ...], tuple[list[Any], int, int]]):
    """Attributes as `encode_span` flattens them, by the layout of their keys (a batch's spans share a few)."""

    def flat(self, attributes: dict[str, Any], rollout_id: str, attempt_id: str) -> list[Any]:
        """``[key or its index, value, ...]`` of ``attributes`` (which hold no value to store as a blob)."""
        keys = tuple(attributes)
        layout = self.get(keys)
        if layout is None:
            codes = list(map(_KEY_INDEX.get, keys, keys))
            rollout_at = 2 * codes.index(_ROLLOUT_INDEX) if _ROLLOUT_INDEX in codes else -1
            attempt_at = 2 * codes.index(_ATTEMPT_INDEX) if _ATTEMPT_INDEX in codes else -1
            layout = self[keys] = (list(chain.from_iterable(zip(codes, keys, strict=True))), rollout_at, attempt_at)
        template, rollout_at, attempt_at = layout
        flat = template.copy()
        flat[1::2] = attributes.values()
        if rollout_at >= 0 and flat[rollout_at + 1] == rollout_id:
            flat[rollout_at : rollout_at + 2] = (_SAME_ROLLOUT, 0)
        if attempt_at >= 0 and flat[attempt_at + 1] == attempt_id:
            flat[attempt_at : attempt_at + 2] = (_SAME_ATTEMPT, 0)
        return flat


def _span_values(row: Sequence[Any], blobs: dict[bytes, Any]) -> dict[str, Any]:
    rollout_id, attempt_id, span_id, sequence_id, data = row
    _, start, end, trace = _SPAN_HEAD.unpack_from(data)
    offset = _SPAN_HEAD.size
    flags = data[offset]
    offset += 1
    parent = None
    if flags & _PARENT:
        parent = data[offset : offset + 8].hex()
        offset += 8
    tail = from_json(data[offset:], allow_inf_nan=False)
    flat = tail[1]
    attributes: dict[str, Any] = {}
    for i in range(0, len(flat), 2):
        key, value = flat[i], flat[i + 1]
        if key == _SAME_ROLLOUT:
            attributes[semconv.ROLLOUT_ID] = rollout_id
        elif key == _SAME_ATTEMPT:
            attributes[semconv.ATTEMPT_ID] = attempt_id
        else:
            if type(value) is dict:
                value = blob_value(blobs, value["#"])
            attributes[key if type(key) is str else _KEYS[key]] = value
    rest = 2
    events: list[Any] = []
    if flags & _EVENTS:
        events = tail[rest]
        rest += 1
    status = (
        {"code": tail[rest], "description": tail[rest + 1]}
        if flags & _STATUS
        else {"code": "unset", "description": None}
    )
    return {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "sequence_id": sequence_id,
        "trace_id": trace.hex(),
        "span_id": span_id,
        "parent_id": parent,
        "name": tail[0],
        "start_time": start,
        "end_time": end,
        "attributes": attributes,
        "events": events,
        "status": status,
    }


def _span_blob_keys(data: bytes) -> Iterable[bytes]:
    offset = _SPAN_HEAD.size + (9 if data[_SPAN_HEAD.size] & _PARENT else 1)
    if b'{"#":' not in data[offset:]:
        return ()
    flat = from_json(data[offset:])[1]
    return [bytes.fromhex(v["#"]) for v in flat[1::2] if type(v) is dict]


def decode_spans(rows: Sequence[Sequence[Any]], fetch: BlobFetch) -> list[Span]:
    """Spans of rows ``(rollout_id, attempt_id, span_id, sequence_id, data)`` in either format.

    Raises:
        ValueError: A row cannot be read (a bad legacy document, a missing blob).
    """
    keys = [key for row in rows if is_binary(row[4]) for key in _span_blob_keys(row[4])]
    blobs = fetch_blobs(keys, fetch)
    values = [_span_values(row, blobs) if is_binary(row[4]) else from_json(row[4], allow_inf_nan=False) for row in rows]
    return spans_from_json(values)
