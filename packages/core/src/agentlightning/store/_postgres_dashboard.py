"""PostgreSQL answers to the dashboard queries (`list_rollouts`, `run_stats`): the SQLite store's queries in
PostgreSQL's dialect, aggregated by the shared functions of `agentlightning.store._query` so every backend reports
the same numbers. Each runs inside one read-only snapshot (see ``_postgres_records._snapshot``).
"""

from __future__ import annotations

from typing import Any

from agentlightning._models import now
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
from agentlightning.store._sqlite_schema import ATTEMPT_COLUMNS, attempt_from_row

__all__ = ["list_rollouts_sql", "run_stats_sql"]

_SUMMARY_COLUMNS = "rollout_id, status, mode, group_id, resources_id, created_at, updated_at"
_SUMMARY_KEYS = tuple(c.strip() for c in _SUMMARY_COLUMNS.split(","))


def _where(query: RolloutQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, values in (("status", query.status), ("mode", query.mode)):
        if values is not None:
            clauses.append(f"{column} = ANY(%s)")
            params.append(list(values))
    if query.group_id is not None:
        clauses.append("group_id = %s")
        params.append(query.group_id)
    if query.search is not None:
        clauses.append("strpos(rollout_id, %s) > 0")
        params.append(query.search)
    if query.model_version is not None:
        clauses.append("rollout_id IN (SELECT rollout_id FROM agl_attempts WHERE model_version = %s)")
        params.append(query.model_version)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def list_rollouts_sql(conn: Any, query: RolloutQuery) -> RolloutPage:
    """`LightningStore.list_rollouts` in SQL: one count, one page, one look-up of the page's attempts."""
    where, params = _where(query)
    total = conn.execute(f"SELECT COUNT(*) FROM agl_rollouts{where}", params).fetchone()[0]
    rows = conn.execute(
        f"SELECT {_SUMMARY_COLUMNS} FROM agl_rollouts{where} ORDER BY seq DESC LIMIT %s OFFSET %s",
        [*params, query.limit, query.offset],
    ).fetchall()
    facts: dict[str, list[AttemptFacts]] = {row[0]: [] for row in rows}
    if rows:
        cursor = conn.execute(
            f"SELECT {ATTEMPT_COLUMNS}, reward, model_version FROM agl_attempts WHERE rollout_id = ANY(%s)",
            (list(facts),),
        )
        for row in cursor:
            facts[row[0]].append(AttemptFacts(attempt=attempt_from_row(row), reward=row[9], model_version=row[10]))
    at = now()
    page = [summary_row(dict(zip(_SUMMARY_KEYS, row, strict=True)), facts[row[0]], at) for row in rows]
    return RolloutPage(total=total, offset=query.offset, limit=query.limit, rollouts=page)


def run_stats_sql(conn: Any, query: RunStatsQuery) -> RunStats:
    """`LightningStore.run_stats` in SQL (grouped aggregates; the same numbers as the reference code)."""
    at = now()
    rollouts = dict.fromkeys(ALL_ROLLOUT_STATUSES, 0)
    for status, count in conn.execute("SELECT status, COUNT(*) FROM agl_rollouts GROUP BY status"):
        rollouts[status] = count
    running = conn.execute("SELECT COUNT(*) FROM agl_attempts WHERE status = 'running'").fetchone()[0]
    attempts: dict[str, int] = {"running": running} if running else {}
    groups: dict[tuple[Any, Any], list[Any]] = {}
    for version, mode, status, count, rewarded, reward_sum, successes, first, last in conn.execute(
        "SELECT model_version, mode, status, COUNT(*), COUNT(reward), COALESCE(SUM(reward), 0.0), "
        "COUNT(*) FILTER (WHERE reward >= %s), MIN(end_time), MAX(end_time) FROM agl_attempts "
        "WHERE status <> 'running' GROUP BY model_version, mode, status",
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
        "SELECT floor((end_time - %s) / %s)::bigint AS bucket, COUNT(*), COUNT(*) FILTER (WHERE status <> 'succeeded') "
        "FROM agl_attempts WHERE status <> 'running' AND end_time >= %s AND end_time < %s GROUP BY 1",
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
