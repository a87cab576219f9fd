"""Spans and LLM calls in SQL, once for the SQLite and PostgreSQL stores: rows to write and queries to read.

A batch becomes rows in the compact formats of `agentlightning.store._codec` plus the shared values they reference
(blobs) and the per-attempt facts the attempts table keeps for dashboards (final reward, newest model version).
The backends differ only in how they send the rows (SQLite ``executemany``, PostgreSQL arrays) and in the few
spellings a `SqlDialect` holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentlightning._models import LLMCall, Span
from agentlightning.store._codec import encode_call, encode_span
from agentlightning.store._query import final_reward_of
from agentlightning.store._sql_dashboard import SqlDialect

__all__ = ["RecordBatch", "call_batch", "calls_query", "span_batch", "spans_query"]


@dataclass
class RecordBatch:
    """What one ``add_spans`` / ``add_llm_calls`` writes.

    Attributes:
        rows: One tuple per record, in the table's column order (ids first, ``data`` last).
        blobs: Shared values the rows reference, by content key (written only with a record that uses them).
        updates: Per-attempt updates of the attempts table: ``(value, ..., attempt_id, rollout_id, ...)`` as the
            backend's ``SET_REWARD`` / ``SET_VERSION`` statement takes them, one per attempt, in key order (so
            concurrent writers lock attempts in one order).
        pairs: The (rollout id, attempt id) pairs the batch writes to.
    """

    rows: list[tuple[Any, ...]]
    blobs: dict[bytes, bytes]
    updates: list[tuple[Any, ...]]
    pairs: set[tuple[str, str]]


def span_batch(batch: Sequence[Span]) -> RecordBatch:
    """Rows ``(rollout_id, attempt_id, span_id, sequence_id, data)`` and each attempt's newest final reward."""
    blobs: dict[bytes, bytes] = {}
    rows = [(s.rollout_id, s.attempt_id, s.span_id, s.sequence_id, encode_span(s, blobs)) for s in batch]
    # one final reward per attempt: the last by sequence id (a later one in the batch wins a tie)
    finals: dict[tuple[str, str], tuple[float, int]] = {}
    for span in batch:
        reward = final_reward_of(span)
        pair = (span.rollout_id, span.attempt_id)
        if reward is not None and (pair not in finals or finals[pair][1] <= span.sequence_id):
            finals[pair] = (reward, span.sequence_id)
    updates = [(r, seq, a, rid, seq) for (rid, a), (r, seq) in sorted(finals.items())]
    return RecordBatch(rows, blobs, updates, {(row[0], row[1]) for row in rows})


def call_batch(batch: Sequence[LLMCall]) -> RecordBatch:
    """Rows ``(call_id, rollout_id, attempt_id, start_time, agent_name, policy, model_version, data)`` and each
    attempt's newest model version."""
    blobs: dict[bytes, bytes] = {}
    rows = [
        (c.call_id, c.rollout_id, c.attempt_id, c.start_time, c.agent_name, c.policy, c.model_version,
         encode_call(c, blobs))
        for c in batch
    ]  # fmt: skip
    newest: dict[tuple[str, str], int] = {}
    for c in batch:
        if c.model_version is not None:
            pair = (c.rollout_id, c.attempt_id)
            newest[pair] = max(newest.get(pair, c.model_version), c.model_version)
    updates = [(v, a, rid, v) for (rid, a), v in sorted(newest.items())]
    return RecordBatch(rows, blobs, updates, {(row[1], row[2]) for row in rows})


def _where(d: SqlDialect, column_prefix: str, rollout_id: str, attempt_id: str | None) -> tuple[str, tuple[str, ...]]:
    """The clause and parameters selecting one rollout's (or one attempt's) rows (ids validated at the boundary)."""
    where, params = f"{column_prefix}rollout_id = {d.param}", (rollout_id,)
    if attempt_id is not None:
        where, params = f"{where} AND {column_prefix}attempt_id = {d.param}", (rollout_id, attempt_id)
    return where, params


def spans_query(d: SqlDialect, rollout_id: str, attempt_id: str | None) -> tuple[str, tuple[str, ...]]:
    """The statement and parameters that read a rollout's (or attempt's) span rows in the store's order."""
    where, params = _where(d, "s.", rollout_id, attempt_id)
    # spans of an attempt the attempts table does not know would sort last (none: such records are refused)
    return (
        f"SELECT s.rollout_id, s.attempt_id, s.span_id, s.sequence_id, s.data FROM {d.prefix}spans s "
        f"LEFT JOIN {d.prefix}attempts a ON a.attempt_id = s.attempt_id WHERE {where} "
        "ORDER BY COALESCE(a.sequence, 2147483647), s.attempt_id, s.sequence_id, s.span_id",
        params,
    )


def calls_query(d: SqlDialect, rollout_id: str, attempt_id: str | None) -> tuple[str, tuple[str, ...]]:
    """The statement and parameters that read a rollout's (or attempt's) LLM-call rows in start order."""
    where, params = _where(d, "", rollout_id, attempt_id)
    return (
        f"SELECT call_id, rollout_id, attempt_id, start_time, data FROM {d.prefix}llm_calls WHERE {where} "
        f"ORDER BY start_time, {d.insertion_order}",
        params,
    )
