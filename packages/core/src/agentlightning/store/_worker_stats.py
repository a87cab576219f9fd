"""Per-worker attempt counts of `RunStats` (``RunStats.workers``), and per runner process (`runner_totals`).

Every runner claims under a worker id; ``agl runner`` writes ``host:pid:index`` (one index per concurrent slot), so
the attempts of one runner process, wherever it runs (a local runner, one started by hand on another machine, one
placed by Ray), are those whose worker id starts with its ``host:pid``. The store groups by the whole worker id
(it knows no format); `runner_of` and `runner_totals` group those rows per process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

__all__ = ["WorkerStats", "runner_of", "runner_totals", "worker_stats", "worker_stats_from"]

_TIMED_OUT = ("timeout", "unresponsive")


class WorkerStats(BaseModel):
    """The attempts one worker id claimed, by how they ended.

    Attributes:
        worker_id: The worker id the attempts were claimed under (``host:pid:index`` for ``agl runner``).
        attempts: Attempts claimed.
        running: Those still running.
        succeeded: Those that succeeded.
        failed: Those that failed (the agent raised).
        timed_out: Those ended as ``timeout`` or ``unresponsive``.
        cancelled: Those cancelled.
        first_start: When the first of them started.
        last_start: When the last of them started (the worker's last claim).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    worker_id: str
    attempts: int
    running: int
    succeeded: int
    failed: int
    timed_out: int
    cancelled: int
    first_start: float | None
    last_start: float | None


def worker_stats(rows: Iterable[tuple[str, str, int, float | None, float | None]]) -> list[WorkerStats]:
    """`WorkerStats` per worker id, in id order, from ``(worker id, status, count, first start, last start)`` rows
    (at most one per worker id and status; shared by every backend so they agree exactly)."""
    groups: dict[str, tuple[dict[str, int], list[float]]] = {}
    for worker_id, status, count, first, last in rows:
        counts, starts = groups.setdefault(worker_id, ({}, []))
        counts[status] = counts.get(status, 0) + int(count)
        starts += [t for t in (first, last) if t is not None]
    return [
        WorkerStats(
            worker_id=worker_id,
            attempts=sum(counts.values()),
            running=counts.get("running", 0),
            succeeded=counts.get("succeeded", 0),
            failed=counts.get("failed", 0),
            timed_out=sum(counts.get(s, 0) for s in _TIMED_OUT),
            cancelled=counts.get("cancelled", 0),
            first_start=min(starts) if starts else None,
            last_start=max(starts) if starts else None,
        )
        for worker_id, (counts, starts) in sorted(groups.items())
    ]


def worker_stats_from(attempts: Iterable[tuple[str | None, str, float | None]]) -> list[WorkerStats]:
    """The reference implementation of `RunStats.workers` from ``(worker id, status, start time)`` of every attempt
    (attempts without a worker id are not counted)."""
    rows: dict[tuple[str, str], list[float | None]] = {}
    for worker_id, status, start in attempts:
        if worker_id is None:
            continue
        entry = rows.setdefault((worker_id, status), [0, None, None])
        entry[0] = (entry[0] or 0) + 1
        if start is not None:
            entry[1] = start if entry[1] is None else min(entry[1], start)
            entry[2] = start if entry[2] is None else max(entry[2], start)
    return worker_stats((key[0], key[1], int(e[0] or 0), e[1], e[2]) for key, e in rows.items())


def runner_of(worker_id: str) -> str:
    """The runner process of a worker id: ``host:pid`` of ``host:pid:index`` or of ``host:pid:w<host_pid>.index``
    (a runner's watched host process); any other id is its own runner."""
    head, sep, index = worker_id.rpartition(":")
    hosted, dot, slot = index.partition(".")
    in_host = bool(dot) and hosted[:1] == "w" and hosted[1:].isdigit() and slot.isdigit()
    return head if sep and head and (index.isdigit() or in_host) else worker_id


def runner_totals(workers: Iterable[WorkerStats]) -> dict[str, Mapping[str, int]]:
    """Per runner process (`runner_of`), in order: ``claimed``, ``running``, ``finished`` (succeeded) and ``failed``
    (ended any other way: failed, timed out or cancelled) attempts, and its ``workers`` (worker ids seen)."""
    totals: dict[str, dict[str, int]] = {}
    for row in workers:
        total = totals.setdefault(
            runner_of(row.worker_id), {"claimed": 0, "running": 0, "finished": 0, "failed": 0, "workers": 0}
        )
        total["claimed"] += row.attempts
        total["running"] += row.running
        total["finished"] += row.succeeded
        total["failed"] += row.failed + row.timed_out + row.cancelled
        total["workers"] += 1
    return dict(sorted(totals.items()))
