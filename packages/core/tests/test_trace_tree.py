"""Trace tree reconstruction: arrival order, concurrent siblings, orphans, duplicates, cycles."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlightning import Span, build_trace_tree
from agentlightning.transitions import TraceTree

TRACE_ID = "ab" * 16


def sid(n: int) -> str:
    return f"{n:016x}"


def make_span(n: int, parent: int | None, start: float, seq: int | None = None, name: str | None = None) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=n if seq is None else seq,
        trace_id=TRACE_ID,
        span_id=sid(n),
        parent_id=None if parent is None else sid(parent),
        name=name or f"span-{n}",
        start_time=start,
        end_time=start + 1.0,
    )


def shape(tree: TraceTree) -> dict[str | None, list[str]]:
    """Children ids of every node, the synthetic root as None."""
    out: dict[str | None, list[str]] = {None: [s.span_id for s in tree.children()]}
    for span_id in tree.by_id:
        out[span_id] = [s.span_id for s in tree.children(span_id)]
    return out


# root(1) -> agent(2) -> [llm(3), tool(4) -> llm(5)], agent(2) -> llm(6); a second root 7 with child 8
TREE = [
    make_span(1, None, 0.0),
    make_span(2, 1, 1.0),
    make_span(3, 2, 2.0),
    make_span(4, 2, 3.0),
    make_span(5, 4, 3.5),
    make_span(6, 2, 5.0),
    make_span(7, None, 0.5),
    make_span(8, 7, 0.6),
]


def test_tree_links_parents_and_orders_children() -> None:
    tree = build_trace_tree(TREE)
    assert shape(tree)[None] == [sid(1), sid(7)]
    assert shape(tree)[sid(2)] == [sid(3), sid(4), sid(6)]
    assert [s.span_id for s in tree.ancestors(sid(5))] == [sid(4), sid(2), sid(1)]
    assert [(s.span_id, depth) for s, depth in tree.walk()] == [
        (sid(1), 0),
        (sid(2), 1),
        (sid(3), 2),
        (sid(4), 2),
        (sid(5), 3),
        (sid(6), 2),
        (sid(7), 0),
        (sid(8), 1),
    ]
    assert [s.span_id for s in tree.ordered] == [sid(n) for n in (1, 7, 8, 2, 3, 4, 5, 6)]
    assert tree.orphans == [] and tree.duplicates == [] and tree.cycles == [] and tree.problems == []
    assert tree.parent(sid(3)) is not None and tree.parent(sid(1)) is None
    assert len(tree) == 8 and sid(5) in tree and tree.get("f" * 16) is None


@settings(max_examples=60, deadline=None)
@given(st.permutations(TREE))
def test_tree_is_the_same_whatever_the_arrival_order(spans: list[Span]) -> None:
    assert shape(build_trace_tree(spans)) == shape(build_trace_tree(TREE))


def test_concurrent_siblings_ordered_by_start_then_sequence() -> None:
    # three tool calls started concurrently: two share a start time (sequence decides), one overlaps
    spans = [
        make_span(1, None, 0.0, seq=0),
        make_span(12, 1, 2.0, seq=3),
        make_span(11, 1, 2.0, seq=2),
        make_span(10, 1, 1.5, seq=9),
    ]
    tree = build_trace_tree(list(reversed(spans)))
    assert [s.span_id for s in tree.children(sid(1))] == [sid(10), sid(11), sid(12)]


def test_orphans_attach_to_the_root_and_are_reported() -> None:
    spans = [make_span(1, None, 0.0), make_span(2, 99, 1.0), make_span(3, 2, 2.0)]
    tree = build_trace_tree(spans)
    assert tree.orphans == [sid(2)]
    assert [s.span_id for s in tree.children()] == [sid(1), sid(2)]
    assert [s.span_id for s in tree.children(sid(2))] == [sid(3)]  # its subtree stays intact
    assert any(sid(2) in p and sid(99) in p for p in tree.problems)


def test_duplicates_keep_the_first_copy() -> None:
    first = make_span(2, 1, 1.0, name="first")
    again = make_span(2, 1, 1.0, name="again")
    tree = build_trace_tree([make_span(1, None, 0.0), first, again])
    assert tree.duplicates == [sid(2)]
    assert tree.get(sid(2)) is first
    assert len(tree.ordered) == 2 and len(tree) == 2


def test_parent_cycles_are_broken_not_looped() -> None:
    spans = [make_span(1, None, 0.0), make_span(2, 3, 1.0), make_span(3, 2, 2.0), make_span(4, 4, 3.0)]
    tree = build_trace_tree(spans)
    walked = [s.span_id for s, _ in tree.walk()]
    assert sorted(walked) == [sid(n) for n in (1, 2, 3, 4)]  # every span reachable exactly once
    assert tree.cycles == [sid(2), sid(4)]  # cut at the first span (in order) found on each loop
    assert tree.parent(sid(3)) == tree.get(sid(2)) and tree.parent(sid(2)) is None
    assert [s.span_id for s in tree.ancestors(sid(3))] == [sid(2)]
    assert len(tree.problems) == 2


def test_long_cycle_and_a_branch_hanging_off_it() -> None:
    # 2 -> 3 -> 4 -> 2 is a loop; 5 hangs off 4; 6 is fine under 1
    spans = [make_span(n, p, float(n)) for n, p in [(1, None), (2, 4), (3, 2), (4, 3), (5, 4), (6, 1)]]
    tree = build_trace_tree(spans)
    assert len(tree.cycles) == 1
    assert sorted(s.span_id for s, _ in tree.walk()) == [sid(n) for n in range(1, 7)]
    # every ancestor chain ends at a top-level span instead of looping
    tops = {s.span_id for s in tree.children()}
    for n in range(1, 7):
        chain = [sid(n), *(s.span_id for s in tree.ancestors(sid(n)))]
        assert len(chain) <= 6 and chain[-1] in tops


def test_empty_input() -> None:
    tree = build_trace_tree([])
    assert len(tree) == 0 and list(tree.walk()) == [] and tree.children() == []


def test_unknown_span_id_raises() -> None:
    import pytest

    tree = build_trace_tree(TREE)
    with pytest.raises(KeyError):
        tree.children("f" * 16)
