"""A batch's span tails written by one ``orjson.dumps`` are the bytes ``to_json`` writes for each span alone.

`_tails` cuts the batch's JSON at a marker (``"\\u0000"`` between spans); a value that is itself that string, or
a number orjson cannot write, must send it back to writing each tail alone, never to wrong cuts.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_core import to_json

from agentlightning.store import _codec_spans
from agentlightning.store._codec_spans import _tails  # pyright: ignore[reportPrivateUsage]

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# text that often holds the marker and the characters around it in the batch's JSON
text = st.text(st.sampled_from(["\x00", ",", '"', "\\", "u", "0", "[", "]", "a", "\u00e9"]), max_size=6)
scalar = st.one_of(
    st.none(),
    text,
    st.just("\x00"),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
)
value = st.one_of(scalar, st.lists(text, max_size=3), st.lists(st.just("\x00"), max_size=2))
flat = st.lists(st.tuples(st.integers(-2, 30) | text, value), max_size=4).map(
    lambda pairs: [item for pair in pairs for item in pair]
)


@PROPERTY
@given(st.lists(st.tuples(text, flat), max_size=6))
def test_each_tail_is_what_to_json_writes_for_its_span(spans: list[tuple[str, list[Any]]]) -> None:
    names = [name for name, _ in spans]
    flats = [values for _, values in spans]
    assert list(_tails(names, flats)) == [to_json(pair) for pair in spans]


def test_a_usual_batch_is_written_in_one_dump() -> None:
    names = [f"step-{i}" for i in range(100)]
    flats: list[list[Any]] = [[-1, 0, -2, 0, 5, "openai", "custom.key", [1, 2, 3], 16, i * 0.5] for i in range(100)]
    expected = [to_json(pair) for pair in zip(names, flats, strict=True)]
    with mock.patch.object(_codec_spans, "to_json", side_effect=AssertionError("wrote a tail alone")):
        assert list(_tails(names, flats)) == expected
