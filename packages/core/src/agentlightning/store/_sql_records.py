"""Spans and LLM calls in SQL, once for the SQLite and PostgreSQL stores: rows to write and queries to read.

A batch becomes rows in the compact formats of `agentlightning.store._codec` plus the shared values they reference
(blobs) and the per-attempt facts the attempts table keeps for dashboards (final reward, newest model version).
The backends differ only in how they send the rows (SQLite ``executemany``, PostgreSQL arrays) and in the few
spellings a `SqlDialect` holds.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentlightning import semconv
from agentlightning._models import LLMCall, Span
from agentlightning.store._codec import encode_call
from agentlightning.store._codec_spans import encode_spans
from agentlightning.store._query import final_reward_in
from agentlightning.store._span_check import CheckedSpans
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
        columns: With ``rows=False`` (`span_batch`): the rows' columns instead of the rows (``rows`` is empty).
        ended_ok: Only judge verdicts (`judgement_batch`): the batch may target attempts that have ended.
    """

    rows: list[tuple[Any, ...]]
    blobs: dict[bytes, bytes]
    updates: list[tuple[Any, ...]]
    pairs: set[tuple[str, str]]
    columns: tuple[Sequence[Any], ...] = ()
    ended_ok: bool = False


_IDS = operator.attrgetter("rollout_id", "attempt_id", "span_id", "sequence_id", "attributes")
_kind_of = operator.methodcaller("get", semconv.SPAN_KIND)


def span_batch(batch: Sequence[Span], rows: bool = True) -> RecordBatch:
    """Rows ``(rollout_id, attempt_id, span_id, sequence_id, data)`` and each attempt's newest final reward.

    With ``rows=False`` the batch holds those five columns instead of rows (for a backend that keys its rows
    otherwise: SQLite).
    """
    blobs: dict[bytes, bytes] = {}
    if not batch:
        return RecordBatch([], blobs, [], set())
    # a column at a time, in C (a batch is hundreds of spans)
    if type(batch) is CheckedSpans:
        rollout_ids, attempt_ids, sequence_ids, _, span_ids, *_, attributes = batch.columns
    else:
        rollout_ids, attempt_ids, span_ids, sequence_ids, attributes = zip(*map(_IDS, batch), strict=True)
    columns = (rollout_ids, attempt_ids, span_ids, sequence_ids, encode_spans(batch, blobs))
    # one final reward per attempt: the last by sequence id (a later one in the batch wins a tie)
    finals: dict[tuple[str, str], tuple[float, int]] = {}
    kinds = list(map(_kind_of, attributes))
    if semconv.KIND_REWARD in kinds:  # (what final_reward_in asks first: most batches have no reward span)
        pairs = zip(rollout_ids, attempt_ids, strict=True)
        for pair, seq, values, kind in zip(pairs, sequence_ids, attributes, kinds, strict=True):
            reward = final_reward_in(values) if kind == semconv.KIND_REWARD else None
            if reward is not None and (pair not in finals or finals[pair][1] <= seq):
                finals[pair] = (reward, seq)
    updates = [(r, seq, a, rid, seq) for (rid, a), (r, seq) in sorted(finals.items())]
    pairs = set(zip(rollout_ids, attempt_ids, strict=True))
    ended_ok = semconv.KIND_JUDGE in kinds and all(kind == semconv.KIND_JUDGE for kind in kinds)
    if not rows:
        return RecordBatch([], blobs, updates, pairs, columns, ended_ok)
    return RecordBatch(list(zip(*columns, strict=True)), blobs, updates, pairs, ended_ok=ended_ok)


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
