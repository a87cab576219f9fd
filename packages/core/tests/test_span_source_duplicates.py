"""The transition builder keeps one LLM span per call where a span source's spans meet an adapter's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from agentlightning import semconv as sc

# test_transitions.py's trace builder (tests are not a package: load it by path)
_spec = importlib.util.spec_from_file_location("_transitions_kit", Path(__file__).with_name("test_transitions.py"))
assert _spec is not None and _spec.loader is not None
_kit = importlib.util.module_from_spec(_spec)
sys.modules["_transitions_kit"] = _kit
_spec.loader.exec_module(_kit)
Trace, build = _kit.Trace, _kit.build

SOURCE = {sc.SPAN_SOURCE: "openllmetry_openai", sc.ADAPTER_NAME: "openllmetry_openai"}


def test_source_span_inside_ours_gives_its_id_and_is_dropped() -> None:
    """Our framework LLM span without a response id, their client span inside it with one: one transition, ours."""
    t = Trace()
    agent = t.agent("writer")
    ours = t.llm([1, 2], [3], agent, record=False, response_id=None)
    t.llm([1, 2], [3], ours, attributes=SOURCE)  # the proxy record carries this span's response id
    t.reward(1.0, final=True)
    result = build(t, on_missing="raise")
    assert len(result.transitions) == 1
    (transition,) = result.transitions
    assert transition.agent_name == "writer" and transition.metadata["span_ids"] == [ours.span_id]
    assert (transition.prompt_token_ids, transition.response_token_ids) == ([1, 2], [3])
    assert result.diagnostics.duplicate_spans == 1 and result.diagnostics.llm_spans == 1


def test_same_response_id_keeps_ours_whatever_the_order() -> None:
    """A source span and ours recording the same call (same response id, siblings): ours is kept, even if later."""
    t = Trace()
    agent = t.agent("writer")
    theirs = t.llm([1], [2], None, attributes=SOURCE, response_id="chatcmpl-x")
    ours = t.llm([1], [2], agent, record=False, response_id="chatcmpl-x")
    result = build(t, on_missing="raise")
    (transition,) = result.transitions
    assert transition.metadata["span_ids"] == [ours.span_id] != [theirs.span_id]
    assert transition.agent_name == "writer" and result.diagnostics.duplicate_spans == 1


def test_source_spans_alone_are_all_kept() -> None:
    """Without spans of ours, every source LLM span is a call of its own."""
    t = Trace()
    t.llm([1], [2], None, attributes=SOURCE)
    t.llm([3], [4], None, attributes=SOURCE)
    result = build(t, on_missing="raise")
    assert len(result.transitions) == 2 and result.diagnostics.duplicate_spans == 0
