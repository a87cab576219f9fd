"""The fast lane of span validation (`spans_from_dicts`, `read_spans_request`) decides as pydantic does.

For generated batches, valid and broken in many ways, the fast lane either steps aside (``None``) or gives exactly
what pydantic's validation of the same data gives: equal models with equal JSON (which tells ``1`` from ``1.0``).
It never takes a batch pydantic refuses, and it does take the usual batch (else the test of speed would be moot).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from pydantic_core import from_json

from agentlightning._models import Span, SpanEvent, SpanStatus, is_validated
from agentlightning.store._common import validate_spans
from agentlightning.store._span_check import CheckedSpans, spans_from_dicts
from agentlightning.store._wire import (  # pyright: ignore[reportPrivateUsage]
    SpansRequest,
    _loads,
    read_spans_request,
    spans_request_json,
)
from agentlightning.testing import make_span

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_SPANS = TypeAdapter(list[Span])

hex_text = st.text("0123456789abcdef", min_size=16, max_size=16)
ids = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x17F, exclude_characters="\x7f"), min_size=1, max_size=8)
# ids the fast lane reads itself (the others, e.g. with a C1 control character, it leaves to pydantic)
usual_ids = ids.filter(lambda v: v.isprintable() and v not in (".", ".."))
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
ints = st.integers(min_value=-(2**70), max_value=2**70)
scalar = st.one_of(st.none(), st.text(max_size=6), st.booleans(), ints, finite)
usual_value = st.one_of(
    scalar,
    st.lists(st.text(max_size=4), max_size=3),
    st.lists(st.booleans(), max_size=3),
    st.lists(ints, max_size=3),
    st.lists(finite, max_size=3),
)


@st.composite
def usual_span(draw: st.DrawFn) -> dict[str, Any]:
    """A span dict of the usual shape: what a runner's client sends (some optional fields left out)."""
    start = draw(st.floats(min_value=0.0, max_value=4e9))
    span: dict[str, Any] = {
        "rollout_id": draw(usual_ids),
        "attempt_id": draw(usual_ids),
        "sequence_id": draw(st.integers(min_value=0, max_value=2**70)),
        "trace_id": draw(hex_text) * 2,
        "span_id": draw(hex_text),
        "parent_id": draw(st.none() | hex_text),
        "name": draw(st.text(max_size=8)),
        "start_time": start,
        "end_time": start + draw(st.floats(min_value=0.0, max_value=100.0)),
        "attributes": draw(st.dictionaries(st.text(max_size=6), usual_value, max_size=4)),
        "events": [],
        "status": draw(
            st.sampled_from(
                [
                    {"code": "unset", "description": None},
                    {"code": "error", "description": "boom"},
                    {"code": "ok"},
                    {},
                ]
            )
        ),
    }
    for optional in draw(st.lists(st.sampled_from(["parent_id", "attributes", "events", "status"]), max_size=2)):
        span.pop(optional, None)
    return span


BROKEN: list[tuple[str, Any]] = [
    ("rollout_id", "."),
    ("rollout_id", ".."),
    ("rollout_id", ""),
    ("rollout_id", "a\x00b"),
    ("rollout_id", "tab\there"),
    ("rollout_id", "x" * 257),
    ("rollout_id", "x" * 256),
    ("rollout_id", "caf\u00e9\u2028"),
    ("attempt_id", 7),
    ("attempt_id", None),
    ("sequence_id", -1),
    ("sequence_id", True),
    ("sequence_id", 1.0),
    ("sequence_id", "3"),
    ("trace_id", "A" * 32),
    ("trace_id", "0" * 31),
    ("trace_id", "0" * 33),
    ("trace_id", "0" * 31 + "\n"),
    ("span_id", "g" * 16),
    ("span_id", 12),
    ("parent_id", "0" * 15),
    ("parent_id", "ABCDEF0123456789"),
    ("name", 3),
    ("name", None),
    ("start_time", 5),
    ("start_time", math.nan),
    ("start_time", math.inf),
    ("start_time", "1.5"),
    ("end_time", -1.0),
    ("end_time", True),
    ("attributes", None),
    ("attributes", {"k": {"nested": 1}}),
    ("attributes", {"k": [1, 2.5]}),
    ("attributes", {"k": [True, 1]}),
    ("attributes", {"k": ["a", 1]}),
    ("attributes", {"k": [math.nan]}),
    ("attributes", {"k": math.inf}),
    ("attributes", {"k": (1, 2)}),
    ("attributes", {1: "non-str key"}),
    ("attributes", {"k": 1e308, "j": 1e308}),
    ("events", None),
    ("events", [{"name": "e", "timestamp": 1.0}]),
    ("events", [{"name": "e"}]),
    ("events", ()),
    ("status", None),
    ("status", {"code": "weird"}),
    ("status", {"code": "ok", "description": 3}),
    ("status", {"code": "ok", "extra": 1}),
    ("unknown_field", 1),
    ("-missing", "trace_id"),
    ("-missing", "end_time"),
]


def _pydantic(batch: list[Any]) -> list[Span] | str:
    try:
        return _SPANS.validate_python(copy.deepcopy(batch))
    except ValidationError as exc:
        return f"refused: {exc.errors()[0]['type']}"


def _same(fast: Sequence[Span], slow: list[Span]) -> None:
    if isinstance(fast, CheckedSpans):  # its columns are the spans' fields, in order
        fields = list(Span.model_fields)[:10]  # rollout_id ... attributes
        assert fast.columns == [tuple(getattr(s, f) for s in slow) for f in fields]
        fast = list(fast)
    assert fast == slow
    assert [s.model_dump_json() for s in fast] == [s.model_dump_json() for s in slow]
    assert all(is_validated(s) for s in fast)


LARGE_FLOATS = {
    "rollout_id": "r", "attempt_id": "a", "sequence_id": 0, "trace_id": "0" * 32, "span_id": "0" * 16,
    "parent_id": None, "name": "n", "start_time": 1.0, "end_time": 2.0, "events": [], "status": {},
    "attributes": {"a": 1.7e308, "b": 1.7e308, "c": [1.7e308, 1.7e308]},
}  # fmt: skip
"""Finite floats whose sum overflows (a random draw once found it: the fast lane refused what pydantic reads)."""


@PROPERTY
@given(st.lists(usual_span(), min_size=1, max_size=4))
@example([LARGE_FLOATS])
def test_the_usual_batch_takes_the_fast_lane_and_gives_what_pydantic_gives(batch: list[dict[str, Any]]) -> None:
    slow = _pydantic(batch)
    if isinstance(slow, str):  # end < start after float rounding cannot happen here; any refusal is a real one
        assert spans_from_dicts(copy.deepcopy(batch)) is None
        return
    fast = spans_from_dicts(copy.deepcopy(batch))
    assert fast is not None
    _same(fast, slow)


@PROPERTY
@given(st.lists(usual_span(), min_size=1, max_size=3), st.sampled_from(BROKEN), st.data())
def test_an_unusual_or_bad_batch_is_left_to_pydantic_or_read_the_same(
    batch: list[dict[str, Any]], change: tuple[str, Any], data: st.DataObject
) -> None:
    target = batch[data.draw(st.integers(min_value=0, max_value=len(batch) - 1))]
    field, value = change
    if field == "-missing":
        target.pop(value, None)
    else:
        target[field] = copy.deepcopy(value)
    slow = _pydantic(batch)
    fast = spans_from_dicts(copy.deepcopy(batch))
    if isinstance(slow, str):
        assert fast is None, f"the fast lane took a batch pydantic refuses ({slow})"
    elif fast is not None:
        _same(fast, slow)


@PROPERTY
@given(st.lists(usual_span(), max_size=4), st.none() | st.text(max_size=130))
def test_a_request_body_reads_as_the_model_validates_it(batch: list[dict[str, Any]], request_id: str | None) -> None:
    body = json.dumps({"spans": batch, "request_id": request_id}).encode()
    try:
        slow: SpansRequest | None = SpansRequest.model_validate_json(body)
    except ValidationError:
        slow = None
    fast = read_spans_request(body)
    if slow is None:
        assert fast is None
    elif fast is not None:
        assert fast.request_id == slow.request_id
        _same(fast.spans, slow.spans)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b"{",
        b'{"spans": []',
        b'{"spans": [], "extra": 1}',
        b'{"spans": {}}',
        b'{"request_id": "r"}',
        b'{"spans": [], "request_id": ""}',
        b'{"spans": [], "request_id": "a\\u0000"}',
        b'{"spans": [], "request_id": 5}',
        b'{"spans": [{"start_time": 1e400}]}',
        b'{"spans": [], "request_id": "' + b"r" * 129 + b'"}',
    ],
)
def test_a_body_the_model_refuses_is_left_to_the_model(body: bytes) -> None:
    with pytest.raises(ValidationError):
        SpansRequest.model_validate_json(body)
    assert read_spans_request(body) is None


def test_the_usual_body_is_read_by_the_fast_lane_and_owns_its_values() -> None:
    spans = [make_span("ro-1", "at-1", i) for i in range(50)]
    body = SpansRequest(spans=spans, request_id="req-1").model_dump_json().encode()
    fast = read_spans_request(body)
    assert fast is not None and fast.request_id == "req-1"
    assert type(fast.spans) is CheckedSpans  # a SQL store encodes its columns; no models made
    assert validate_spans(fast.spans) is fast.spans  # the boundary passes it through
    _same(fast.spans, SpansRequest.model_validate_json(body).spans)
    given = [json.loads(s.model_dump_json()) for s in spans]
    made = validate_spans(given)  # the boundary's entry for dicts takes the same lane
    given[0]["attributes"]["gen_ai.system"] = "changed"  # the caller's dicts are theirs: the spans hold copies
    assert made == spans and made[0].attributes["gen_ai.system"] == "openai"


def test_numbers_past_64_bits_read_exactly_as_the_model_reads_them() -> None:
    span = json.loads(make_span("ro-1", "at-1", 0).model_dump_json())
    span["attributes"] = {"big": 2**64 + 1, "small": -(2**63) - 1, "list": [2**70, 1]}
    body = json.dumps({"spans": [span]}).encode()
    fast = read_spans_request(body)
    assert fast is not None
    assert fast.spans[0].attributes == {"big": 2**64 + 1, "small": -(2**63) - 1, "list": [2**70, 1]}
    _same(fast.spans, SpansRequest.model_validate_json(body).spans)


@pytest.mark.parametrize(
    "number", [10**18, 2**63 - 1, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**19, 2**70, -(2**200), 12345]
)
def test_a_body_parses_integers_of_every_width_exactly(number: int) -> None:
    # orjson (the fast parser) reads an integer past 64 bits as a float: such bodies go to pydantic's parser
    for body in (json.dumps([number]).encode(), json.dumps({"n": number}).encode(), str(number).encode()):
        assert repr(_loads(body)) == repr(json.loads(body))


@PROPERTY
@given(st.recursive(st.one_of(scalar, st.integers()), lambda inner: st.lists(inner, max_size=4), max_leaves=12))
def test_a_body_parses_as_pydantics_parser_parses_it(value: Any) -> None:
    body = json.dumps(value).encode()
    assert repr(_loads(body)) == repr(from_json(body, allow_inf_nan=False))


def test_a_client_body_leaves_default_events_and_status_out_and_reads_the_same() -> None:
    spans = [make_span("ro-1", "at-1", i) for i in range(20)]
    lean = spans_request_json(SpansRequest(spans=spans, request_id="req-1"))
    assert all(set(s) == set(Span.model_fields) - {"events", "status"} for s in json.loads(lean)["spans"])
    fast = read_spans_request(lean)
    assert fast is not None and type(fast.spans) is CheckedSpans  # the fast lane, columns kept
    _same(fast.spans, SpansRequest.model_validate_json(lean).spans)
    made = list(fast.spans)
    assert made == spans and made[0].events is not made[1].events  # each span its own list
    # one span with an event, or a set status: every span keeps both fields (any server reads them)
    for changed in (
        spans[3].model_copy(update={"events": [SpanEvent(name="retry", timestamp=1.0)]}),
        spans[3].model_copy(update={"status": SpanStatus(code="error", description="boom")}),
    ):
        batch = [*spans[:3], changed, *spans[4:]]
        full = spans_request_json(SpansRequest(spans=batch, request_id="req-2"))
        assert all("events" in s and "status" in s for s in json.loads(full)["spans"])
        assert SpansRequest.model_validate_json(full).spans == batch
