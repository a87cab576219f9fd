"""SQLite answers to the dashboard queries (`list_rollouts`, `run_stats`), on a read connection of their own.

The store's main connection serialises every write behind one lock; a dashboard that polls a large table must
not hold that lock (runners would wait) nor block the event loop (a served store answers everyone from one
loop). So these queries run in a worker thread on a second connection: in WAL mode a reader sees the last
committed state and never blocks a writer.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from agentlightning._models import now
from agentlightning.store._base import StoreError
from agentlightning.store._common import ALL_ROLLOUT_STATUSES
from agentlightning.store._query import (
    AttemptFacts,
    RolloutPage,
    RolloutQuery,
    RunStats,
    RunStatsQuery,
    empty_buckets,
    summary_row,
    throughput,
    version_order,
    version_stats,
)
from agentlightning.store._sqlite_schema import ATTEMPT_COLUMNS, attempt_from_row, connect, dump_json

__all__ = ["DashboardReader"]

_Q = TypeVar("_Q")
_R = TypeVar("_R")

_SUMMARY_COLUMNS = "rollout_id, status, mode, group_id, resources_id, created_at, updated_at"
_SUMMARY_KEYS = tuple(c.strip() for c in _SUMMARY_COLUMNS.split(","))


def _where(query: RolloutQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, values in (("status", query.status), ("mode", query.mode)):
        if values is not None:
            clauses.append(f"{column} IN ({', '.join('?' * len(values))})" if values else "0")
            params += values
    if query.group_id is not None:
        clauses.append("group_id = ?")
        params.append(query.group_id)
    if query.search is not None:
        clauses.append("instr(rollout_id, ?) > 0")
        params.append(query.search)
    if query.model_version is not None:
        clauses.append("rollout_id IN (SELECT rollout_id FROM attempts WHERE model_version = ?)")
        params.append(query.model_version)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class DashboardReader:
    """Runs dashboard queries on its own connection (opened on first use) in a worker thread.

    Args:
        path: The store's SQLite file.
        busy_timeout: Seconds to wait for a lock (readers rarely need one in WAL mode).
        closed_message: Message of the `StoreError` raised after `close`.
    """

    def __init__(self, path: Path, busy_timeout: float, closed_message: str) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._closed_message = closed_message
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    async def run(self, fn: Callable[[sqlite3.Connection, _Q], _R], query: _Q) -> _R:
        """Run ``fn(conn, query)`` in a worker thread, holding this reader's connection."""
        return await asyncio.to_thread(self._locked, fn, query)

    def _locked(self, fn: Callable[[sqlite3.Connection, _Q], _R], query: _Q) -> _R:
        with self._lock:
            if self._closed:
                raise StoreError(self._closed_message)
            if self._conn is None:
                self._conn = connect(self._path, "NORMAL", self._busy_timeout)
                self._conn.execute("PRAGMA query_only = ON")
            self._conn.execute("BEGIN")  # one snapshot for every statement of the query
            try:
                return fn(self._conn, query)
            finally:
                self._conn.execute("COMMIT")

    def close(self) -> None:
        """Close the read connection (idempotent)."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @staticmethod
    def list_rollouts(conn: sqlite3.Connection, query: RolloutQuery) -> RolloutPage:
        """`LightningStore.list_rollouts` in SQL: one count, one page, one look-up of the page's attempts."""
        where, params = _where(query)
        total = conn.execute(f"SELECT COUNT(*) FROM rollouts{where}", params).fetchone()[0]
        rows = conn.execute(
            f"SELECT {_SUMMARY_COLUMNS} FROM rollouts{where} ORDER BY seq DESC LIMIT ? OFFSET ?",
            [*params, query.limit, query.offset],
        ).fetchall()
        facts: dict[str, list[AttemptFacts]] = {row[0]: [] for row in rows}
        if rows:
            cursor = conn.execute(
                f"SELECT {ATTEMPT_COLUMNS}, reward, model_version FROM attempts "
                "WHERE rollout_id IN (SELECT value FROM json_each(?))",
                (dump_json(list(facts), "ids"),),
            )
            for row in cursor:
                facts[row[0]].append(AttemptFacts(attempt=attempt_from_row(row), reward=row[9], model_version=row[10]))
        at = now()
        page = [summary_row(dict(zip(_SUMMARY_KEYS, row, strict=True)), facts[row[0]], at) for row in rows]
        return RolloutPage(total=total, offset=query.offset, limit=query.limit, rollouts=page)

    @staticmethod
    def run_stats(conn: sqlite3.Connection, query: RunStatsQuery) -> RunStats:
        """`LightningStore.run_stats` in SQL (grouped aggregates; the same numbers as the reference code)."""
        at = now()
        rollouts = dict.fromkeys(ALL_ROLLOUT_STATUSES, 0)
        for status, count in conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status"):
            rollouts[status] = count
        # finished attempts come from the covering index ix_attempts_finished, running ones from ix_attempts_running
        running = conn.execute("SELECT COUNT(*) FROM attempts WHERE status = 'running'").fetchone()[0]
        attempts: dict[str, int] = {"running": running} if running else {}
        groups: dict[tuple[Any, Any], list[Any]] = {}
        for version, mode, status, count, rewarded, reward_sum, successes, first, last in conn.execute(
            "SELECT model_version, mode, status, COUNT(*), COUNT(reward), TOTAL(reward), TOTAL(reward >= ?), "
            "MIN(end_time), MAX(end_time) FROM attempts WHERE status != 'running' "
            "GROUP BY model_version, mode, status",
            (query.success_reward,),
        ):
            attempts[status] = attempts.get(status, 0) + count
            if first is None:  # no end time recorded: not reported as finished
                continue
            entry = groups.setdefault((version, mode), [{}, 0, 0.0, 0, first, last])
            entry[0][status] = count
            entry[1] += rewarded
            entry[2] += reward_sum
            entry[3] += int(successes)
            entry[4] = min(entry[4], first)
            entry[5] = max(entry[5], last)
        versions = [
            version_stats(key, *entry) for key, entry in sorted(groups.items(), key=lambda item: version_order(item[0]))
        ]
        start, buckets = empty_buckets(query, at)
        for index, finished, failed in conn.execute(
            "SELECT CAST((end_time - ?) / ? AS INTEGER), COUNT(*), TOTAL(status != 'succeeded') FROM attempts "
            "WHERE status != 'running' AND end_time >= ? AND end_time < ? GROUP BY 1",
            (start, query.bucket, start, start + len(buckets) * query.bucket),
        ):
            if 0 <= index < len(buckets):
                buckets[index] = [finished, int(failed)]
        return RunStats(
            now=at,
            rollouts=rollouts,
            attempts=attempts,
            versions=versions,
            throughput=throughput(start, query.bucket, buckets),
            bucket=query.bucket,
            success_reward=query.success_reward,
        )
