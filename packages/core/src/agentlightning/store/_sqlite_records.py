"""The SQLite store's file and records: connection, request memory, spans, LLM calls, resources, dashboards.

`SqliteRecords` owns the database connection and everything appended to it by runners and the proxy (spans, LLM
calls, resources versions); `SqliteStore` (``_sqlite.py``) adds the rollout queue and the attempt lifecycle on top.
Every awaited write commits before it returns.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any, Literal

from agentlightning._fast import fast_replace, resources_from_json
from agentlightning._models import (
    Attempt,
    LLMCall,
    Resources,
    Rollout,
    Span,
    now,
)
from agentlightning.store._base import (
    AttemptEndedError,
    NotFoundError,
    RetryPolicy,
    StoreStats,
)
from agentlightning.store._boundary import StoreBoundary
from agentlightning.store._codec import decode_calls, decode_rows
from agentlightning.store._codec_spans import decode_spans
from agentlightning.store._common import (
    ALL_ROLLOUT_STATUSES,
    ChangeNotifier,
    check_record_attempts,
)
from agentlightning.store._query import (
    RolloutPage,
    RolloutQuery,
    RunStats,
    RunStatsQuery,
)
from agentlightning.store._sql_dashboard import SQLITE
from agentlightning.store._sql_records import RecordBatch, call_batch, calls_query, span_batch
from agentlightning.store._sql_rows import ATTEMPT_COLUMNS, ROLLOUT_COLUMNS, attempt_from_row, rollout_from_row
from agentlightning.store._sqlite_dashboard import DashboardReader
from agentlightning.store._sqlite_schema import ConnectionGuard, StorageHealth, connect
from agentlightning.store._sqlite_spans import SPANS_SELECT, span_rows, spans_read

__all__ = ["REQUEST_MEMORY_SECONDS", "SqliteRecords"]

logger = logging.getLogger(__name__)

_INSERT_SPAN = "INSERT OR IGNORE INTO spans (attempt_key, span_key, sequence_id, data) VALUES (?, ?, ?, ?)"
# an attempt's key for spans, and whether the attempt exists (spans can only be added to an attempt the store started)
_ATTEMPT_KEY = (
    "SELECT k.attempt_key FROM attempts a LEFT JOIN span_attempts k "
    "ON k.rollout_id = a.rollout_id AND k.attempt_id = a.attempt_id WHERE a.attempt_id = ? AND a.rollout_id = ?"
)
_ATTEMPT_STATUS = "SELECT status FROM attempts WHERE attempt_id = ? AND rollout_id = ?"
_NEW_ATTEMPT_KEY = "INSERT INTO span_attempts (rollout_id, attempt_id) VALUES (?, ?) RETURNING attempt_key"
_SET_REWARD = (
    "UPDATE attempts SET reward = ?, reward_seq = ? WHERE attempt_id = ? AND rollout_id = ? "
    "AND (reward_seq IS NULL OR reward_seq <= ?)"
)
_SET_VERSION = (
    "UPDATE attempts SET model_version = ? WHERE attempt_id = ? AND rollout_id = ? "
    "AND (model_version IS NULL OR model_version < ?)"
)
_INSERT_CALL = (
    "INSERT OR IGNORE INTO llm_calls (call_id, rollout_id, attempt_id, start_time, agent_name, policy, model_version, "
    "data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_BLOB = "INSERT OR IGNORE INTO blobs (key, data) VALUES (?, ?)"
_ROWS_PER_INSERT = 32  # rows per multi-row INSERT: a third less CPU per row than one statement per row
_SELECT_BLOBS = "SELECT key, data FROM blobs WHERE key IN ({})"
_KNOWN_ATTEMPTS_MAX = 100_000
_PURGE_EVERY = 1_000

REQUEST_MEMORY_SECONDS = 3600.0
"""How long the answer to a request with a client request id is kept for retries of that request."""


class SqliteRecords(StoreBoundary):
    """The connection and the appended records of a `SqliteStore` (its base class; use `SqliteStore`).

    Args: as `SqliteStore`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        retry_policy: RetryPolicy | None = None,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 30.0,
        poll_interval: float = 0.05,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        if busy_timeout <= 0 or poll_interval <= 0:
            raise ValueError("busy_timeout and poll_interval must be positive numbers of seconds")
        self.path = Path(path)
        self.retry_policy: RetryPolicy = retry_policy or RetryPolicy()
        self.synchronous: Literal["NORMAL", "FULL"] = synchronous
        self._busy_timeout = busy_timeout
        self._poll_interval = poll_interval
        self._lock = threading.RLock()
        self._notifier = ChangeNotifier()
        # No running attempt (in any process) can time out before this moment; see `_expired`.
        self._no_timeout_before = 0.0
        # (rollout, attempt) -> its key in span_attempts: committed keys only (they never change once committed)
        self._attempt_keys: dict[tuple[str, str], int] = {}
        self._requests_since_purge = 0
        self._conn: sqlite3.Connection | None = connect(self.path, synchronous, busy_timeout)
        closed = f"SQLite store {self.path} is closed"
        # `with self._read as conn`: the lock held; `with self._write as conn`: also one BEGIN IMMEDIATE
        # transaction, committed before the block's result is handed back.
        self._health = StorageHealth(self.path)
        self._read = ConnectionGuard(self._lock, self._get_conn, closed, write=False)
        # Dashboard reads use their own connection in a worker thread: WAL lets them run beside the writes.
        self._dashboard = DashboardReader(self.path, busy_timeout, closed)
        self._write = ConnectionGuard(self._lock, self._get_conn, closed, write=True, health=self._health)
        logger.debug("opened SQLite store %s (synchronous=%s)", self.path, synchronous)

    @property
    def storage_error(self) -> str | None:
        """Why the last write could not reach the disk (``database or disk is full`` / ``database is read-only``),
        or ``None`` when the last write succeeded."""
        return self._health.error

    # ----------------------------------------------------------------- plumbing

    def _get_conn(self) -> sqlite3.Connection | None:
        return self._conn

    def _get_rollout(self, conn: sqlite3.Connection, rollout_id: str) -> Rollout:
        row = conn.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"rollout {rollout_id!r} not found")
        return rollout_from_row(row)

    def _get_attempt(self, conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> Attempt:
        row = conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = ? AND rollout_id = ?",
            (attempt_id, rollout_id),
        ).fetchone()
        if row is None:
            self._get_rollout(conn, rollout_id)
            raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")
        return attempt_from_row(row)

    def _seen_request(self, conn: sqlite3.Connection, key: str) -> str | None:
        """The remembered answer to request ``key``, or ``None`` for a request not seen before.

        Writes of records (spans, LLM calls) ask only after inserting, and only when the batch stored fewer records
        than it was sent: a retry of a stored request finds every record present, while a first request (the hot
        path) usually stores them all and skips this lookup.
        """
        row = conn.execute("SELECT result FROM requests WHERE request_id = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _remember_request(self, conn: sqlite3.Connection, key: str, result: str, t: float) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO requests (request_id, result, created_at) VALUES (?, ?, ?)", (key, result, t)
        )
        self._requests_since_purge += 1
        if self._requests_since_purge >= _PURGE_EVERY:
            self._requests_since_purge = 0
            conn.execute("DELETE FROM requests WHERE created_at < ?", (t - REQUEST_MEMORY_SECONDS,))

    def _check_attempts(
        self, conn: sqlite3.Connection, pairs: set[tuple[str, str]], what: str, ended_ok: bool = False
    ) -> None:
        """Apply the store's rule on records (`check_record_attempts`): every attempt was started and still runs.

        Read inside the write transaction (SQLite's writes are serialised): no attempt can end between this check
        and the write of its records.
        """

        def status_of(rollout_id: str, attempt_id: str) -> str | None:
            row = conn.execute(_ATTEMPT_STATUS, (attempt_id, rollout_id)).fetchone()
            return None if row is None else row[0]

        check_record_attempts(pairs, status_of, what, lambda r, a: self._unknown_attempt(conn, r, a, what), ended_ok)

    def _unknown_attempt(self, conn: sqlite3.Connection, rollout_id: str, attempt_id: str, what: str) -> NotFoundError:
        self._get_rollout(conn, rollout_id)  # raises, naming the rollout, when it is the rollout that is unknown
        return NotFoundError(
            f"attempt {attempt_id!r} of rollout {rollout_id!r} not found: {what} can only be added to an "
            "attempt the store started (dequeue_rollout)"
        )

    def _keys_of(
        self, conn: sqlite3.Connection, pairs: set[tuple[str, str]], new: dict[tuple[str, str], int]
    ) -> dict[tuple[str, str], int]:
        """The span key of each (rollout id, attempt id), given on first use (added to ``new``, which the caller
        caches once committed); raises `NotFoundError` for an attempt this store did not start."""
        cache = self._attempt_keys
        keys: dict[tuple[str, str], int] = {}
        for pair in pairs:
            key = cache.get(pair)
            if key is None:
                row = conn.execute(_ATTEMPT_KEY, (pair[1], pair[0])).fetchone()
                if row is None:
                    raise self._unknown_attempt(conn, pair[0], pair[1], "spans")
                key = row[0] if row[0] is not None else conn.execute(_NEW_ATTEMPT_KEY, pair).fetchone()[0]
                new[pair] = key
            keys[pair] = key
        return keys

    # ----------------------------------------------------------------- spans and calls

    async def add_spans(self, spans: Sequence[Span], *, request_id: str | None = None) -> int:
        """Store spans in one transaction (idempotent on rollout, attempt and span id); returns how many were new.

        Raises `NotFoundError` for a span of an attempt the store did not start. With a ``request_id`` the count
        is remembered: a retried request (same id) gets the count of the first one, not 0.
        """
        batch = spans  # validated at the boundary (StoreBoundary), as every argument below
        if not batch:
            return 0
        key = None if request_id is None else "spans:" + request_id
        return self._add_records(span_batch(batch, rows=False), _INSERT_SPAN, _SET_REWARD, key, "spans")

    async def add_llm_calls(self, calls: Sequence[LLMCall], *, request_id: str | None = None) -> int:
        """Store proxy records in one transaction (idempotent on call_id); returns how many were new.

        Raises `NotFoundError` for a call of an attempt the store did not start; ``request_id`` as in `add_spans`.
        """
        batch = calls
        if not batch:
            return 0
        key = None if request_id is None else "calls:" + request_id
        return self._add_records(call_batch(batch), _INSERT_CALL, _SET_VERSION, key, "LLM calls")

    def _add_records(self, records: RecordBatch, insert: str, update: str, key: str | None, what: str) -> int:
        """Write ``records`` (spans: given as columns, keyed here) in one transaction; returns how many were new."""
        new_keys: dict[tuple[str, str], int] = {}
        with self._write as conn:
            try:
                self._check_attempts(conn, records.pairs, what, records.ended_ok)
            except AttemptEndedError:
                if key is not None and (seen := self._seen_request(conn, key)) is not None:
                    return int(seen)  # a retry of a request stored before its attempt ended: the first answer
                raise
            if records.columns:
                rows = span_rows(self._keys_of(conn, records.pairs, new_keys), records.columns)
            else:
                rows = records.rows
            before = conn.total_changes
            _insert_rows(conn, insert, rows)
            added = conn.total_changes - before
            if key is not None and added < len(rows) and (seen := self._seen_request(conn, key)) is not None:
                return int(seen)  # a retry (see `_seen_request`): nothing was written, the first count is the answer
            if records.blobs and added:  # a batch of records stored before adds no values they would not use
                conn.executemany(_INSERT_BLOB, records.blobs.items())
            if records.updates:
                conn.executemany(update, records.updates)
            if key is not None:
                self._remember_request(conn, key, str(added), now())
        if new_keys:  # committed: from now on these keys are this process's to reuse
            if len(self._attempt_keys) >= _KNOWN_ATTEMPTS_MAX:
                self._attempt_keys.clear()
            self._attempt_keys.update(new_keys)
        return added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (or one attempt), ordered by attempt then sequence_id."""
        if attempt_id is None:
            sql, params = SPANS_SELECT.format("k.rollout_id = ?"), (rollout_id,)
        else:
            sql, params = SPANS_SELECT.format("k.rollout_id = ? AND k.attempt_id = ?"), (rollout_id, attempt_id)
        with self._read as conn:
            rows = spans_read(conn.execute(sql, params).fetchall())
        return decode_rows(rows, decode_spans, self._fetch_blobs, f"span of rollout {rollout_id!r}")

    async def query_llm_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
        """LLM calls of a rollout (or one attempt) in start order."""
        sql, params = calls_query(SQLITE, rollout_id, attempt_id)
        with self._read as conn:
            rows = conn.execute(sql, params).fetchall()
        return decode_rows(rows, decode_calls, self._fetch_blobs, f"LLM call of rollout {rollout_id!r}")

    def _fetch_blobs(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """Stored values by content key (they never change once written: no need to read with the records)."""
        found: dict[bytes, bytes] = {}
        with self._read as conn:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                found.update(conn.execute(_SELECT_BLOBS.format(", ".join("?" * len(chunk))), chunk).fetchall())
        return found

    # ----------------------------------------------------------------- resources

    async def add_resources(self, resources: Resources) -> Resources:
        """Store a new resources version; returns it with its assigned version."""
        res = resources
        with self._write as conn:
            row = conn.execute("SELECT data FROM resources WHERE resources_id = ?", (res.resources_id,)).fetchone()
            if row is not None:
                return resources_from_json(row[0])
            version = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources").fetchone()[0]
            stored = fast_replace(res, version=version)
            conn.execute(
                "INSERT INTO resources (version, resources_id, data) VALUES (?, ?, ?)",
                (version, stored.resources_id, stored.model_dump_json()),
            )
        return stored

    async def get_resources(self, resources_id: str | None = None) -> Resources | None:
        """Resources by id, or the latest version when ``resources_id`` is ``None``."""
        with self._read as conn:
            if resources_id is None:
                row = conn.execute("SELECT data FROM resources ORDER BY version DESC LIMIT 1").fetchone()
                return None if row is None else resources_from_json(row[0])
            row = conn.execute("SELECT data FROM resources WHERE resources_id = ?", (resources_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"resources {resources_id!r} not found")
        return resources_from_json(row[0])

    async def query_resources(self) -> list[Resources]:
        """Every stored resources version, oldest first (the last one is the current one)."""
        with self._read as conn:
            rows = conn.execute("SELECT data FROM resources ORDER BY version").fetchall()
        return [resources_from_json(row[0]) for row in rows]

    # ----------------------------------------------------------------- dashboards

    async def list_rollouts(self, query: RolloutQuery | None = None) -> RolloutPage:
        """A page of rollout summaries matching ``query``, newest first (SQL, off the event loop)."""
        query = query or RolloutQuery()  # the boundary passes a validated query
        return await self._dashboard.run(self._dashboard.list_rollouts, query)

    async def run_stats(self, query: RunStatsQuery | None = None) -> RunStats:
        """Counts per status, reward and success rate per (model version, mode), and recent throughput."""
        query = query or RunStatsQuery()
        return await self._dashboard.run(self._dashboard.run_stats, query)

    # ----------------------------------------------------------------- misc

    async def stats(self) -> StoreStats:
        """Counts of what is stored (one consistent snapshot)."""
        with self._read as conn:
            conn.execute("BEGIN")
            try:
                counts = dict.fromkeys(ALL_ROLLOUT_STATUSES, 0)
                for status, count in conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status"):
                    counts[status] = count
                totals = conn.execute(
                    "SELECT (SELECT COUNT(*) FROM attempts), (SELECT COUNT(*) FROM spans), "
                    "(SELECT COUNT(*) FROM llm_calls), (SELECT COUNT(*) FROM resources)"
                ).fetchone()
            finally:
                conn.execute("COMMIT")
        return StoreStats(
            rollouts=counts, attempts=totals[0], spans=totals[1], llm_calls=totals[2], resources=totals[3]
        )

    async def close(self) -> None:
        """Close the connection (idempotent); the file keeps everything that was acknowledged."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._dashboard.close()


def _insert_rows(conn: sqlite3.Connection, insert: str, rows: list[tuple[Any, ...]]) -> None:
    """Run ``insert`` (one row's ``INSERT ... VALUES (?, ...)``) for every row, `_ROWS_PER_INSERT` rows a statement.

    One statement of many rows does what as many one-row statements do (``OR IGNORE`` skips each duplicate row, a
    later copy within the batch too), binding and stepping far fewer times; the rest go one row a statement.
    """
    size = _ROWS_PER_INSERT
    full = len(rows) // size * size
    if full:
        many = _many_rows(insert)
        for start in range(0, full, size):
            conn.execute(many, list(chain.from_iterable(rows[start : start + size])))
    if full < len(rows):
        conn.executemany(insert, rows[full:])


@functools.cache
def _many_rows(insert: str) -> str:
    values = insert[insert.rindex("VALUES ") + len("VALUES ") :]
    return insert + f", {values}" * (_ROWS_PER_INSERT - 1)
