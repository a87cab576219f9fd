"""Rebuild an attempt's span tree from ``parent_id`` links.

Spans reach the store out of order (children end, and are exported, before their parents), concurrent
siblings overlap in time, and a parent can be missing altogether (its exporter crashed, or it was never
sampled). The tree therefore hangs real roots and orphans alike under a synthetic root (``None``), and
reports what it had to repair instead of failing.

The tree is built in one pass over the spans (it sits on the conversion hot path); child lists are only
materialised when something asks for them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import attrgetter

from agentlightning._models import Span

__all__ = ["TraceTree", "build_trace_tree", "span_order_key"]


def span_order_key(span: Span) -> tuple[float, int]:
    """The order used everywhere for spans: start time, then the per-attempt sequence id (ties, equal clocks)."""
    return (span.start_time, span.sequence_id)


_ORDER_KEY = attrgetter("start_time", "sequence_id")  # same as span_order_key, in C


class TraceTree:
    """The spans of one attempt as a tree under a synthetic root (written ``None`` in this API).

    Attributes:
        ordered: Every kept span in (start_time, sequence_id) order.
        by_id: Every kept span by span id.
        parent_ids: Effective parent id of every kept span: ``None`` for real roots, orphans and spans detached
            from a cycle (they hang under the synthetic root).
        orphans: Span ids whose ``parent_id`` names a span that is not in the input.
        duplicates: Span ids seen more than once (the first occurrence, in input order, is kept).
        cycles: Span ids detached from a ``parent_id`` cycle.
    """

    __slots__ = ("_children", "by_id", "cycles", "duplicates", "ordered", "orphans", "parent_ids")

    def __init__(self) -> None:
        self.ordered: list[Span] = []
        self.by_id: dict[str, Span] = {}
        self.parent_ids: dict[str, str | None] = {}
        self.orphans: list[str] = []
        self.duplicates: list[str] = []
        self.cycles: list[str] = []
        self._children: dict[str | None, list[Span]] | None = None

    def __len__(self) -> int:
        return len(self.by_id)

    def __contains__(self, span_id: object) -> bool:
        return span_id in self.by_id

    def get(self, span_id: str) -> Span | None:
        """The span with this id, or ``None``."""
        return self.by_id.get(span_id)

    def parent(self, span_id: str) -> Span | None:
        """The parent span as linked in the tree (``None`` for roots, orphans and detached cycle members)."""
        parent_id = self.parent_ids[span_id]
        return None if parent_id is None else self.by_id[parent_id]

    def children(self, span_id: str | None = None) -> list[Span]:
        """Child spans of ``span_id`` in span order (``None``: the top level, i.e. roots and orphans)."""
        if span_id is not None and span_id not in self.by_id:
            raise KeyError(span_id)
        if self._children is None:
            children: dict[str | None, list[Span]] = {}
            for span in self.ordered:  # in order, so every child list comes out sorted
                children.setdefault(self.parent_ids[span.span_id], []).append(span)
            self._children = children
        return list(self._children.get(span_id, ()))

    def ancestors(self, span_id: str) -> Iterator[Span]:
        """Ancestor spans of ``span_id``, nearest first."""
        parent_id = self.parent_ids[span_id]
        while parent_id is not None:
            yield self.by_id[parent_id]
            parent_id = self.parent_ids[parent_id]

    def walk(self) -> Iterator[tuple[Span, int]]:
        """Depth-first pre-order walk: ``(span, depth)`` with depth 0 for top-level spans."""
        stack: list[tuple[Span, int]] = [(span, 0) for span in reversed(self.children())]
        while stack:
            span, depth = stack.pop()
            yield span, depth
            stack.extend((child, depth + 1) for child in reversed(self.children(span.span_id)))

    def spans(self) -> list[Span]:
        """All kept spans in (start_time, sequence_id) order."""
        return list(self.ordered)

    @property
    def problems(self) -> list[str]:
        """Human-readable descriptions of what was repaired (empty for a well-formed trace)."""
        out = [
            f"span {span_id} has parent_id {self.by_id[span_id].parent_id} which is not in the trace; "
            "attached to the root"
            for span_id in self.orphans
        ]
        out.extend(f"span id {span_id} appears more than once; kept the first" for span_id in self.duplicates)
        out.extend(f"span {span_id} is part of a parent_id cycle; attached to the root" for span_id in self.cycles)
        return out


def build_trace_tree(spans: Sequence[Span]) -> TraceTree:
    """Rebuild the parent/child tree of one attempt's spans.

    Works whatever the arrival order. Children are ordered by (start_time, sequence_id), so concurrent
    siblings come out in the order they started. A span whose parent is missing hangs under the synthetic
    root and is listed in ``orphans``; duplicates and ``parent_id`` cycles are repaired and listed too.

    Args:
        spans: Spans of one attempt, in any order.

    Returns:
        The tree.
    """
    return build_attempt_tree(spans, None, None)


def build_attempt_tree(spans: Sequence[Span], rollout_id: str | None, attempt_id: str | None) -> TraceTree:
    """`build_trace_tree`; with ``rollout_id``, first raise ``ValueError`` on a span of another attempt.

    (The check is folded into the tree's first pass over the spans, so the builder reads every span once.)
    """
    tree = TraceTree()
    by_id = tree.by_id
    duplicates = tree.duplicates
    # (start_time, sequence_id, arrival index, span): sorting these is the stable sort by span_order_key.
    # Fields are read from __dict__: pydantic models define __getattr__, which makes attribute reads slow.
    decorated: list[tuple[float, int, int, Span]] = []
    append = decorated.append
    check = rollout_id is not None
    for span in spans:  # duplicates are judged in input order: the first copy received wins
        values = span.__dict__
        if check and (values["attempt_id"] != attempt_id or values["rollout_id"] != rollout_id):
            raise ValueError(
                "TransitionBuilder.build converts one attempt at a time, but got spans of "
                f"{rollout_id}/{attempt_id} and {span.rollout_id}/{span.attempt_id}"
            )
        span_id = values["span_id"]
        if span_id in by_id:
            duplicates.append(span_id)
        else:
            by_id[span_id] = span
            append((values["start_time"], values["sequence_id"], len(decorated), span))
    decorated.sort()
    firsts = [item[3] for item in decorated]
    tree.ordered = firsts
    parent_ids = tree.parent_ids
    orphans = tree.orphans
    backward = 0  # links to a parent that sorts after its child: only these can close a cycle
    for span in firsts:
        values = span.__dict__
        parent_id = values["parent_id"]
        span_id = values["span_id"]
        if parent_id is not None and parent_id not in parent_ids:
            if parent_id not in by_id:
                orphans.append(span_id)
                parent_id = None
            else:
                backward += 1
        parent_ids[span_id] = parent_id
    if backward:
        _break_cycles(tree)
    return tree


def _break_cycles(tree: TraceTree) -> None:
    """Detach one member of every parent cycle so that every span reaches the root."""
    parent_ids = tree.parent_ids
    rooted: set[str] = set()
    for span in tree.ordered:
        path: list[str] = []
        on_path: set[str] = set()
        current: str | None = span.span_id
        while current is not None and current not in rooted and current not in on_path:
            path.append(current)
            on_path.add(current)
            current = parent_ids[current]
        if current is not None and current in on_path:  # walked into a loop: cut it at this span
            parent_ids[current] = None
            tree.cycles.append(current)
        rooted.update(path)
