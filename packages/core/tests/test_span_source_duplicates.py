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


def test_reward_survives_dropping_duplicates() -> None:
    """Dropping duplicate source spans keeps the attempt's final reward on every transition (it was lost: the
    Agents SDK's and the openai client's OpenLLMetry spans of one call, as ``Traceloop.init()`` records them)."""
    t = Trace()
    agent = t.agent("math")
    outer = t.llm([1, 2], [3], agent, attributes=SOURCE, response_id="chatcmpl-a")  # their framework span
    t.llm([1, 2], [3], outer, attributes=SOURCE, response_id="chatcmpl-a", record=False)  # their client span
    ours = t.llm([4], [5], agent, record=False, response_id=None)
    t.llm([4], [5], ours, attributes=SOURCE)  # a client span inside one of ours
    t.reward(0.5)
    t.reward(1.0, final=True)
    t.reward(0.25)
    result = build(t, on_missing="raise")
    assert result.diagnostics.duplicate_spans == 2 and result.diagnostics.attempts_without_reward == 0
    assert result.final_reward == 1.0
    assert [tr.final_reward for tr in result.transitions] == [1.0, 1.0]
