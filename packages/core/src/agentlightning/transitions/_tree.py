"""Rebuild an attempt's span tree from ``parent_id`` links.

Spans reach the store out of order (children end, and are exported, before their parents), concurrent
siblings overlap in time, and a parent can be missing altogether (its exporter crashed, or it was never
sampled). The tree therefore hangs every span under a synthetic root: real roots and orphans alike, and
reports what it had to repair instead of failing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from agentlightning._models import Span

__all__ = ["TraceNode", "TraceTree", "build_trace_tree", "span_order_key"]


def span_order_key(span: Span) -> tuple[float, int]:
    """The order used everywhere for spans: start time, then the per-attempt sequence id (ties, equal clocks)."""
    return (span.start_time, span.sequence_id)


class TraceNode:
    """A span in the tree with its parent and its children (ordered by `span_order_key`).

    Attributes:
        span: The span, or ``None`` for the synthetic root.
        parent: The parent node (the synthetic root for real roots and orphans), ``None`` for the synthetic root.
        children: Child nodes in (start_time, sequence_id) order.
    """

    __slots__ = ("children", "parent", "span")

    def __init__(self, span: Span | None, parent: TraceNode | None = None) -> None:
        self.span = span
        self.parent = parent
        self.children: list[TraceNode] = []

    @property
    def span_id(self) -> str | None:
        """The span's id (``None`` for the synthetic root)."""
        return None if self.span is None else self.span.span_id

    def __repr__(self) -> str:
        name = "<root>" if self.span is None else f"{self.span.name}#{self.span.span_id}"
        return f"TraceNode({name}, children={len(self.children)})"


class TraceTree:
    """The spans of one attempt as a tree under a synthetic root.

    Attributes:
        root: Synthetic root; its children are the real roots and the orphans, in span order.
        nodes: Every kept span's node by span id.
        ordered: Every kept span in (start_time, sequence_id) order.
        orphans: Span ids whose ``parent_id`` names a span that is not in the input (attached to the root).
        duplicates: Span ids seen more than once (the first occurrence, in input order, is kept).
        cycles: Span ids detached from a ``parent_id`` cycle (attached to the root).
    """

    __slots__ = ("cycles", "duplicates", "nodes", "ordered", "orphans", "root")

    def __init__(self) -> None:
        self.root = TraceNode(None)
        self.ordered: list[Span] = []
        self.nodes: dict[str, TraceNode] = {}
        self.orphans: list[str] = []
        self.duplicates: list[str] = []
        self.cycles: list[str] = []

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, span_id: object) -> bool:
        return span_id in self.nodes

    def get(self, span_id: str) -> Span | None:
        """The span with this id, or ``None``."""
        node = self.nodes.get(span_id)
        return None if node is None else node.span

    def children(self, span_id: str | None = None) -> list[Span]:
        """Child spans of ``span_id`` in span order (``None``: the top level, i.e. roots and orphans)."""
        node = self.root if span_id is None else self.nodes[span_id]
        return [child.span for child in node.children if child.span is not None]

    def parent(self, span_id: str) -> Span | None:
        """The parent span as linked in the tree (``None`` for roots, orphans and detached cycle members)."""
        parent = self.nodes[span_id].parent
        return None if parent is None else parent.span

    def ancestors(self, span_id: str) -> Iterator[Span]:
        """Ancestor spans of ``span_id``, nearest first."""
        node = self.nodes[span_id].parent
        while node is not None and node.span is not None:
            yield node.span
            node = node.parent

    def walk(self) -> Iterator[tuple[Span, int]]:
        """Depth-first pre-order walk: ``(span, depth)`` with depth 0 for top-level spans."""
        stack: list[tuple[TraceNode, int]] = [(child, 0) for child in reversed(self.root.children)]
        while stack:
            node, depth = stack.pop()
            if node.span is not None:
                yield node.span, depth
            stack.extend((child, depth + 1) for child in reversed(node.children))

    def spans(self) -> list[Span]:
        """All kept spans in (start_time, sequence_id) order."""
        return list(self.ordered)

    @property
    def problems(self) -> list[str]:
        """Human-readable descriptions of what was repaired (empty for a well-formed trace)."""
        out: list[str] = []
        for span_id in self.orphans:
            span = self.get(span_id)
            parent_id = None if span is None else span.parent_id
            out.append(f"span {span_id} has parent_id {parent_id} which is not in the trace; attached to the root")
        out.extend(f"span id {span_id} appears more than once; kept the first" for span_id in self.duplicates)
        out.extend(f"span {span_id} is part of a parent_id cycle; attached to the root" for span_id in self.cycles)
        return out


def build_trace_tree(spans: Sequence[Span]) -> TraceTree:
    """Rebuild the parent/child tree of one attempt's spans.

    Works whatever the arrival order. Children are ordered by (start_time, sequence_id), so concurrent
    siblings come out in the order they started. A span whose parent is missing is attached to the synthetic
    root and listed in ``orphans``; duplicates and ``parent_id`` cycles are repaired and listed too.

    Args:
        spans: Spans of one attempt, in any order.

    Returns:
        The tree.
    """
    tree = TraceTree()
    nodes = tree.nodes
    firsts: list[Span] = []
    for span in spans:  # duplicates are judged in input order: the first copy received wins
        if span.span_id in nodes:
            tree.duplicates.append(span.span_id)
        else:
            nodes[span.span_id] = TraceNode(span)
            firsts.append(span)
    firsts.sort(key=span_order_key)
    tree.ordered = firsts
    root = tree.root
    for span in firsts:
        node = nodes[span.span_id]
        parent_id = span.parent_id
        if parent_id is None:
            node.parent = root
            root.children.append(node)
            continue
        parent = nodes.get(parent_id)
        if parent is None:
            tree.orphans.append(span.span_id)
            node.parent = root
            root.children.append(node)
        else:
            node.parent = parent
            parent.children.append(node)
    if sum(1 for _ in _reachable(root)) - 1 != len(nodes):
        _break_cycles(tree)
    return tree


def _reachable(root: TraceNode) -> Iterator[TraceNode]:
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def _break_cycles(tree: TraceTree) -> None:
    """Detach one member of every parent cycle and hang it under the root (keeps the input order stable)."""
    reached = {id(node) for node in _reachable(tree.root)}
    for node in sorted(tree.nodes.values(), key=lambda n: span_order_key(n.span) if n.span else (0.0, 0)):
        if id(node) in reached:
            continue
        seen: set[int] = set()
        member = node
        while id(member) not in seen:  # walk up until we loop: that node is on the cycle
            seen.add(id(member))
            assert member.parent is not None
            member = member.parent
        assert member.parent is not None and member.span is not None
        member.parent.children.remove(member)
        member.parent = tree.root
        tree.root.children.append(member)
        tree.cycles.append(member.span.span_id)
        reached.update(id(n) for n in _reachable(member))
    tree.root.children.sort(key=lambda n: span_order_key(n.span) if n.span else (0.0, 0))
