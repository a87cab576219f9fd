"""The dashboard queries (`list_rollouts`, `run_stats` and its per-policy rows) in SQL, for SQLite and PostgreSQL.

The two databases differ here only in a few spellings (the parameter marker, table names, how a list is passed,
the substring test, a float's integer bucket); a `SqlDialect` holds them, and the aggregation is done by the
shared functions of `agentlightning.store._query`, so every backend reports the same numbers. Each function runs
inside one read snapshot the caller opened (a transaction on SQLite's read connection, a read-only repeatable-read
transaction on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from agentlightning._models import now
from agentlightning.store._common import ALL_ROLLOUT_STATUSES
from agentlightning.store._query import (
    AttemptFacts,
    RolloutPage,
    RolloutQuery,
    RunStats,
    RunStatsQuery,
    empty_buckets,
    policy_stats,
    summary_row,
    throughput,
    version_order,
    version_stats,
)
from agentlightning.store._sql_rows import ATTEMPT_COLUMNS, attempt_from_row
from agentlightning.store._worker_stats import WorkerStats, worker_stats

__all__ = ["POSTGRES", "SQLITE", "SqlDialect", "list_rollouts", "run_stats"]

_SUMMARY_COLUMNS = "rollout_id, status, mode, group_id, resources_id, created_at, updated_at"
_SUMMARY_KEYS = tuple(c.strip() for c in _SUMMARY_COLUMNS.split(","))


@dataclass(frozen=True)
class SqlDialect:
    """What differs between the databases in the dashboard queries.

    Attributes:
        param: The driver's parameter marker.
        prefix: Prefix of the store's table names.
        any_of: ``(column, values) -> (clause, params)``: the column is one of ``values``.
        contains: Clause: the rollout id contains the parameter.
        bucket: Expression: the integer bucket of ``end_time`` given parameters start and width.
        insertion_order: Column that orders rows of the LLM-call table as they were inserted.
    """

    param: str
    prefix: str
    any_of: Callable[[str, Sequence[Any]], tuple[str, list[Any]]]
    contains: str
    bucket: str
    insertion_order: str


def _sqlite_any_of(column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    # a JSON array is one parameter however many values (SQLite limits the number of parameters)
    return f"{column} IN (SELECT value FROM json_each(?))", [to_json(list(values)).decode()]


def _postgres_any_of(column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    return f"{column} = ANY(%s)", [list(values)]


SQLITE = SqlDialect(
    param="?",
    prefix="",
    any_of=_sqlite_any_of,
    contains="instr(rollout_id, ?) > 0",
    bucket="CAST((end_time - ?) / ? AS INTEGER)",
    insertion_order="rowid",
)
POSTGRES = SqlDialect(
    param="%s",
    prefix="agl_",
    any_of=_postgres_any_of,
    contains="strpos(rollout_id, %s) > 0",
    bucket="floor((end_time - %s) / %s)::bigint",
    insertion_order="seq",
)


def _where(d: SqlDialect, query: RolloutQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, values in (("status", query.status), ("mode", query.mode)):
        if values is not None:
            clause, more = d.any_of(column, values)
            clauses.append(clause)
            params += more
    if query.group_id is not None:
        clauses.append(f"group_id = {d.param}")
        params.append(query.group_id)
    if query.search is not None:
        clauses.append(d.contains)
        params.append(query.search)
    if query.model_version is not None:
        clauses.append(f"rollout_id IN (SELECT rollout_id FROM {d.prefix}attempts WHERE model_version = {d.param})")
        params.append(query.model_version)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def list_rollouts(d: SqlDialect, conn: Any, query: RolloutQuery) -> RolloutPage:
    """`LightningStore.list_rollouts` in SQL: one count, one page, one look-up of the page's attempts."""
    where, params = _where(d, query)
    p = d.param
    total = conn.execute(f"SELECT COUNT(*) FROM {d.prefix}rollouts{where}", params).fetchone()[0]
    rows = conn.execute(
        f"SELECT {_SUMMARY_COLUMNS} FROM {d.prefix}rollouts{where} ORDER BY seq DESC LIMIT {p} OFFSET {p}",
        [*params, query.limit, query.offset],
    ).fetchall()
    facts: dict[str, list[AttemptFacts]] = {row[0]: [] for row in rows}
    if rows:
        clause, ids = d.any_of("rollout_id", list(facts))
        cursor = conn.execute(
            f"SELECT {ATTEMPT_COLUMNS}, reward, model_version FROM {d.prefix}attempts WHERE {clause}", ids
        )
        for row in cursor:
            facts[row[0]].append(AttemptFacts(attempt=attempt_from_row(row), reward=row[9], model_version=row[10]))
    at = now()
    page = [summary_row(dict(zip(_SUMMARY_KEYS, row, strict=True)), facts[row[0]], at) for row in rows]
    return RolloutPage(total=total, offset=query.offset, limit=query.limit, rollouts=page)


def _version_groups(d: SqlDialect, conn: Any, query: RunStatsQuery) -> tuple[dict[str, int], list[Any]]:
    """Attempt counts per status and per-(model version, mode) statistics of finished attempts."""
    attempts_table = f"{d.prefix}attempts"
    # finished attempts come from the covering index of finished attempts, running ones from the running index
    running = conn.execute(f"SELECT COUNT(*) FROM {attempts_table} WHERE status = 'running'").fetchone()[0]
    attempts: dict[str, int] = {"running": running} if running else {}
    groups: dict[tuple[Any, Any], list[Any]] = {}
    for version, mode, status, count, rewarded, reward_sum, successes, first, last in conn.execute(
        "SELECT model_version, mode, status, COUNT(*), COUNT(reward), COALESCE(SUM(reward), 0.0), "
        f"COALESCE(SUM(CASE WHEN reward >= {d.param} THEN 1 ELSE 0 END), 0), MIN(end_time), MAX(end_time) "
        f"FROM {attempts_table} WHERE status <> 'running' GROUP BY model_version, mode, status",
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
    return attempts, versions


def _policy_groups(d: SqlDialect, conn: Any) -> list[Any]:
    """Per (policy, agent, model version, mode): calls, attempts and the attempts' rewards (finished attempts)."""
    # the inner query has one row per (key, attempt), so an attempt's reward counts once per key however many calls
    rows = conn.execute(
        "SELECT policy, agent_name, model_version, mode, SUM(n), COUNT(*), COUNT(reward), COALESCE(SUM(reward), 0.0) "
        "FROM (SELECT c.policy, c.agent_name, c.model_version, a.mode, a.reward, COUNT(*) AS n "
        f"FROM {d.prefix}llm_calls c JOIN {d.prefix}attempts a ON a.attempt_id = c.attempt_id "
        "WHERE a.status <> 'running' "
        "GROUP BY c.policy, c.agent_name, c.model_version, c.attempt_id, a.mode, a.reward) per_attempt "
        "GROUP BY policy, agent_name, model_version, mode"
    ).fetchall()
    return policy_stats({(r[0], r[1], r[2], r[3]): (int(r[4]), r[5], r[6], float(r[7])) for r in rows})


def _worker_groups(d: SqlDialect, conn: Any) -> list[WorkerStats]:
    """Per worker id: attempts by status and the first and last start (`RunStats.workers`)."""
    rows = conn.execute(
        "SELECT worker_id, status, COUNT(*), MIN(start_time), MAX(start_time) "
        f"FROM {d.prefix}attempts WHERE worker_id IS NOT NULL GROUP BY worker_id, status"
    ).fetchall()
    return worker_stats((r[0], r[1], int(r[2]), r[3], r[4]) for r in rows)


def run_stats(d: SqlDialect, conn: Any, query: RunStatsQuery) -> RunStats:
    """`LightningStore.run_stats` in SQL (grouped aggregates; the same numbers as the reference code)."""
    at = now()
    rollouts = dict.fromkeys(ALL_ROLLOUT_STATUSES, 0)
    for status, count in conn.execute(f"SELECT status, COUNT(*) FROM {d.prefix}rollouts GROUP BY status"):
        rollouts[status] = count
    attempts, versions = _version_groups(d, conn, query)
    start, buckets = empty_buckets(query, at)
    p = d.param
    for index, finished, failed in conn.execute(
        f"SELECT {d.bucket} AS bucket, COUNT(*), SUM(CASE WHEN status <> 'succeeded' THEN 1 ELSE 0 END) "
        f"FROM {d.prefix}attempts WHERE status <> 'running' AND end_time >= {p} AND end_time < {p} GROUP BY 1",
        (start, query.bucket, start, start + len(buckets) * query.bucket),
    ):
        if 0 <= index < len(buckets):
            buckets[index] = [finished, int(failed)]
    return RunStats(
        now=at,
        rollouts=rollouts,
        attempts=attempts,
        versions=versions,
        policies=_policy_groups(d, conn),
        workers=_worker_groups(d, conn),
        throughput=throughput(start, query.bucket, buckets),
        bucket=query.bucket,
        success_reward=query.success_reward,
    )
