"""The PostgreSQL store's connections and appended records: pool, transactions, spans, LLM calls, resources.

`PostgresRecords` owns the connection pool and everything runners and the proxy append (spans, LLM calls,
resources versions); `PostgresStore` (``_postgres.py``) adds the rollout queue and the attempt lifecycle on top.

The driver is synchronous (psycopg 3 and its thread-safe pool): every store call runs as one function in a
worker thread of the store's own executor, holding one pooled connection, so the caller's event loop never waits
on the database and the store works from any loop or thread. Every awaited write commits before it returns.
Writes that lock several rows lock them in one order (rollout, then attempt; records by key), so concurrent
servers do not deadlock; a deadlock or serialization failure PostgreSQL reports anyway is retried.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agentlightning._fast import fast_replace, resources_from_json
from agentlightning._models import Attempt, LLMCall, Resources, Rollout, Span, now
from agentlightning.store._base import AttemptEndedError, NotFoundError, RetryPolicy, StoreError, StoreStats
from agentlightning.store._boundary import StoreBoundary
from agentlightning.store._codec import BlobFetch, decode_calls, decode_rows
from agentlightning.store._codec_spans import decode_spans
from agentlightning.store._common import (
    ALL_ROLLOUT_STATUSES,
    ChangeNotifier,
    check_record_attempts,
)
from agentlightning.store._postgres_pool import PostgresPool
from agentlightning.store._postgres_schema import (
    RESOURCES_LOCK,
    PostgresHealth,
    describe_dsn,
    driver,
    migrate,
    one_line,
    unreachable,
)
from agentlightning.store._query import RolloutPage, RolloutQuery, RunStats, RunStatsQuery
from agentlightning.store._sql_dashboard import POSTGRES, list_rollouts, run_stats
from agentlightning.store._sql_records import RecordBatch, call_batch, calls_query, span_batch, spans_query
from agentlightning.store._sql_rows import ATTEMPT_COLUMNS, ROLLOUT_COLUMNS, attempt_from_row, rollout_from_row

__all__ = ["PostgresRecords"]

logger = logging.getLogger(__name__)

_R = TypeVar("_R")

_LOCK_ATTEMPTS = (
    "SELECT rollout_id, attempt_id, status FROM agl_attempts WHERE attempt_id = ANY(%s) ORDER BY attempt_id "
    "FOR NO KEY UPDATE"
)
_INSERT_SPANS = (
    "INSERT INTO agl_spans (rollout_id, attempt_id, span_id, sequence_id, data) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::bytea[]) ORDER BY 1, 2, 3 "
    "ON CONFLICT DO NOTHING"
)
_INSERT_CALLS = (
    "INSERT INTO agl_llm_calls (call_id, rollout_id, attempt_id, start_time, agent_name, policy, model_version, data) "
    "SELECT c, r, a, s, g, p, v, d FROM unnest(%b::text[], %b::text[], %b::text[], %b::float8[], %b::text[], "
    "%b::text[], %b::bigint[], %b::bytea[]) WITH ORDINALITY AS t(c, r, a, s, g, p, v, d, n) ORDER BY n "
    "ON CONFLICT DO NOTHING"
)
_SET_REWARD = (
    "UPDATE agl_attempts SET reward = %s, reward_seq = %s WHERE attempt_id = %s AND rollout_id = %s "
    "AND (reward_seq IS NULL OR reward_seq <= %s)"
)
_SET_VERSION = (
    "UPDATE agl_attempts SET model_version = %s WHERE attempt_id = %s AND rollout_id = %s "
    "AND (model_version IS NULL OR model_version < %s)"
)
# Batches travel as arrays in PostgreSQL's binary format (%b): the text format quotes every JSON document inside
# the array literal, which made a batch of 500 spans cost ~70 ms in the driver instead of ~10 ms.
# Shared values in key order: two transactions storing the same new values lock them in one order.
_INSERT_BLOBS = (
    "INSERT INTO agl_blobs (key, data) SELECT * FROM unnest(%b::bytea[], %b::bytea[]) ORDER BY 1 ON CONFLICT DO NOTHING"
)
_PURGE_EVERY = 1_000
_TRANSACTION_TRIES = 5

REQUEST_MEMORY_SECONDS = 3600.0
"""How long the answer to a request with a client request id is kept for retries of that request."""


class PostgresRecords(StoreBoundary):
    """The connection pool and the appended records of a `PostgresStore` (its base class; use `PostgresStore`).

    Args: as `PostgresStore`.
    """

    def __init__(
        self,
        dsn: str,
        retry_policy: RetryPolicy | None = None,
        *,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        poll_interval: float = 0.05,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"dsn must be a PostgreSQL connection string, got {dsn!r}")
        if pool_size < 1 or connect_timeout <= 0 or poll_interval <= 0:
            raise ValueError("pool_size must be at least 1; connect_timeout and poll_interval positive seconds")
        psycopg, psycopg_pool = driver()
        self.dsn = dsn
        self.where = describe_dsn(dsn)
        self.retry_policy: RetryPolicy = retry_policy or RetryPolicy()
        self.pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._poll_interval = poll_interval
        self._psycopg = psycopg
        self._notifier = ChangeNotifier()
        self._health = PostgresHealth(self.where)
        # No running attempt (of any server) can time out before this moment; see `PostgresStore._expired`.
        self._no_timeout_before = 0.0
        self._requests_since_purge = 0
        self._closed = False
        # One plain connection first: an unreachable server or a bad DSN is one clear error here, not a pool
        # retrying in the background; it also creates or migrates the schema before the pool opens.
        try:
            conn = psycopg.connect(dsn, autocommit=True, connect_timeout=max(2, round(connect_timeout)))
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the PostgreSQL store {self.where}: {one_line(exc)}") from None
        try:
            migrate(conn, self.where)
        except psycopg.Error as exc:
            raise StoreError(f"cannot set up the PostgreSQL store {self.where}: {one_line(exc)}") from None
        finally:
            conn.close()
        self._pools = PostgresPool(psycopg, psycopg_pool, dsn, self._health, pool_size, connect_timeout)
        self._executor = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="agl-postgres")
        logger.debug("opened PostgreSQL store %s (pool of %d)", self.where, pool_size)

    @property
    def storage_error(self) -> str | None:
        """Why the store cannot serve: the database unreachable (since a request or `check_health` found it so), or
        refusing the last write (``database or disk is full`` / ``database is read-only``); ``None`` when it can."""
        return self._health.problem

    def reopen_spec(self) -> tuple[type[Any], dict[str, Any]]:
        """A picklable ``(cls, kwargs)`` with which another process opens this store: ``cls(**kwargs)``."""
        return type(self), {
            "dsn": self.dsn,
            "retry_policy": self.retry_policy,
            "pool_size": self.pool_size,
            "connect_timeout": self._connect_timeout,
            "poll_interval": self._poll_interval,
        }

    # ----------------------------------------------------------------- plumbing

    async def _read(self, fn: Callable[..., _R], *args: Any) -> _R:
        """``fn(conn, *args)`` in a worker thread on a pooled connection (autocommit: each statement alone)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, fn, args, False, False)

    async def _write(self, fn: Callable[..., _R], *args: Any) -> _R:
        """``fn(conn, *args)`` in one transaction, committed before the result is handed back."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, fn, args, True, True)

    async def _write_statement(self, fn: Callable[..., _R], *args: Any) -> _R:
        """``fn(conn, *args)`` whose writes are each one statement (its own transaction, one round trip)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, fn, args, False, True)

    def _run(self, fn: Callable[..., _R], args: tuple[Any, ...], transaction: bool, write: bool) -> _R:
        psycopg = self._psycopg
        errors = psycopg.errors
        for attempt in range(1, _TRANSACTION_TRIES + 1):
            if self._closed:
                raise StoreError(f"PostgreSQL store {self.where} is closed")
            pool = self._pools.get()  # during an outage: once the database answers again, else 503 at once
            try:
                with pool.connection() as conn:
                    if not transaction:
                        result = fn(conn, *args)
                    else:
                        with conn.transaction():
                            result = fn(conn, *args)
                if write:
                    self._health.succeeded()
                else:
                    self._health.reached()
                return result
            except (errors.DeadlockDetected, errors.SerializationFailure) as exc:
                if attempt == _TRANSACTION_TRIES:
                    raise StoreError(f"PostgreSQL store {self.where}: {one_line(exc)}") from exc
                logger.debug("retrying a transaction of the PostgreSQL store: %s", one_line(exc))
            except psycopg.DataError as exc:  # text with NUL, a number out of range: the request's fault
                reason = one_line(exc)
                if "0x00" in reason or "NUL" in reason:
                    reason = "text must not contain NUL characters (\\x00)"
                raise ValueError(f"the PostgreSQL store cannot store this value: {reason}") from None
            except psycopg.Error as exc:
                error = self._health.failed(exc) if write else None
                if error is not None:
                    raise error from exc
                if unreachable(psycopg, exc):  # one line per outage, not a traceback per request
                    if pool is not self._pools.pool:  # replaced meanwhile (the database came back): try the new one
                        continue
                    raise self._health.lost(exc) from None
                raise
        raise AssertionError("unreachable")

    async def check_health(self) -> str | None:
        """Whether the store can serve now (what a served store's ``/healthz`` asks): ``None``, else why not.

        Asks the database on a fresh connection (``SELECT 1``, at most 2 s; see `PostgresPool.check`), in a thread
        of its own: a busy store still answers its health check.
        """
        return await asyncio.to_thread(self._pools.check)

    def _get_rollout(self, conn: Any, rollout_id: str, lock: bool = False) -> Rollout:
        row = conn.execute(
            f"SELECT {ROLLOUT_COLUMNS} FROM agl_rollouts WHERE rollout_id = %s" + (" FOR UPDATE" if lock else ""),
            (rollout_id,),
        ).fetchone()
        if row is None:
            raise NotFoundError(f"rollout {rollout_id!r} not found")
        return rollout_from_row(row)

    def _get_attempt(self, conn: Any, rollout_id: str, attempt_id: str) -> Attempt:
        row = conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM agl_attempts WHERE attempt_id = %s AND rollout_id = %s",
            (attempt_id, rollout_id),
        ).fetchone()
        if row is None:
            self._get_rollout(conn, rollout_id)
            raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")
        return attempt_from_row(row)

    @staticmethod
    def _lock_request(conn: Any, key: str) -> str | None:
        """Serialise requests with one id (across servers) for this transaction; the remembered answer, if any."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
        return PostgresRecords._seen_request(conn, key)

    @staticmethod
    def _seen_request(conn: Any, key: str) -> str | None:
        row = conn.execute("SELECT result FROM agl_requests WHERE request_id = %s", (key,)).fetchone()
        return None if row is None else row[0]

    def _remember_request(self, conn: Any, key: str, result: str, t: float) -> None:
        conn.execute(
            "INSERT INTO agl_requests (request_id, result, created_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (request_id) DO UPDATE SET result = EXCLUDED.result, created_at = EXCLUDED.created_at",
            (key, result, t),
        )
        self._count_request(conn, t)

    def _count_request(self, conn: Any, t: float) -> None:
        """Count a remembered request; every `_PURGE_EVERY`, forget those older than `REQUEST_MEMORY_SECONDS`."""
        self._requests_since_purge += 1
        if self._requests_since_purge >= _PURGE_EVERY:
            self._requests_since_purge = 0
            conn.execute("DELETE FROM agl_requests WHERE created_at < %s", (t - REQUEST_MEMORY_SECONDS,))

    def _check_attempts(self, conn: Any, pairs: set[tuple[str, str]], what: str, ended_ok: bool = False) -> None:
        """Apply the store's rule on records (`check_record_attempts`): every attempt was started and still runs.

        The attempts' rows are locked (``FOR NO KEY UPDATE``, in id order) until the transaction that writes the
        records commits: an end that another server writes meanwhile waits for it, and one already written is seen
        (a late record is refused). The lock is the one the records' own reward / model version updates take.
        """
        rows = conn.execute(_LOCK_ATTEMPTS, ([a for _, a in pairs],)).fetchall()
        statuses = {(row[0], row[1]): row[2] for row in rows}

        def unknown(rollout_id: str, attempt_id: str) -> NotFoundError:
            self._get_rollout(conn, rollout_id)  # names the rollout when it is the rollout that is unknown
            return NotFoundError(
                f"attempt {attempt_id!r} of rollout {rollout_id!r} not found: {what} can only be added to an "
                "attempt the store started (dequeue_rollout)"
            )

        check_record_attempts(pairs, lambda r, a: statuses.get((r, a)), what, unknown, ended_ok)

    # ----------------------------------------------------------------- spans and calls

    async def add_spans(self, spans: Sequence[Span], *, request_id: str | None = None) -> int:
        """Store spans in one transaction (idempotent on rollout, attempt and span id); returns how many were new.

        Raises `NotFoundError` for a span of an attempt the store did not start. With a ``request_id`` the count
        is remembered: a retried request (same id), through any server, gets the count of the first one.
        """
        batch = spans  # validated at the boundary (StoreBoundary), as every argument below
        if not batch:
            return 0
        key = None if request_id is None else "spans:" + request_id
        return await self._write(self._add_records, span_batch(batch), _INSERT_SPANS, _SET_REWARD, key, "spans")

    async def add_llm_calls(self, calls: Sequence[LLMCall], *, request_id: str | None = None) -> int:
        """Store proxy records in one transaction (idempotent on call_id); returns how many were new.

        Raises `NotFoundError` for a call of an attempt the store did not start; ``request_id`` as in `add_spans`.
        """
        batch = calls
        if not batch:
            return 0
        key = None if request_id is None else "calls:" + request_id
        records = call_batch(batch)
        return await self._write(self._add_records, records, _INSERT_CALLS, _SET_VERSION, key, "LLM calls")

    def _add_records(
        self, conn: Any, records: RecordBatch, insert: str, update: str, key: str | None, what: str
    ) -> int:
        try:
            self._check_attempts(conn, records.pairs, what, records.ended_ok)
        except AttemptEndedError:
            if key is not None and (seen := self._lock_request(conn, key)) is not None:
                return int(seen)  # a retry of a request stored before its attempt ended: the first answer
            raise
        added = conn.execute(insert, [list(column) for column in zip(*records.rows, strict=True)]).rowcount
        if key is not None and added < len(records.rows):
            seen = self._lock_request(conn, key)
            if seen is not None:
                return int(seen)  # a retry: nothing was written, the first count is the answer
        if records.blobs and added:  # a batch of records stored before adds no values they would not use
            conn.execute(_INSERT_BLOBS, (list(records.blobs), list(records.blobs.values())))
        if records.updates:
            conn.cursor().executemany(update, records.updates)
        if key is not None:
            self._remember_request(conn, key, str(added), now())
        return added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (or one attempt), ordered by attempt then sequence_id."""
        sql, params = spans_query(POSTGRES, rollout_id, attempt_id)
        return await self._read(_read_records, sql, params, decode_spans, f"span of rollout {rollout_id!r}")

    async def query_llm_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
        """LLM calls of a rollout (or one attempt) in start order."""
        sql, params = calls_query(POSTGRES, rollout_id, attempt_id)
        return await self._read(_read_records, sql, params, decode_calls, f"LLM call of rollout {rollout_id!r}")

    # ----------------------------------------------------------------- resources

    async def add_resources(self, resources: Resources) -> Resources:
        """Store a new resources version; returns it with its assigned version (one at a time across servers)."""
        res = resources

        def write(conn: Any) -> Resources:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (RESOURCES_LOCK,))
            row = conn.execute("SELECT data FROM agl_resources WHERE resources_id = %s", (res.resources_id,)).fetchone()
            if row is not None:
                return resources_from_json(row[0])
            version = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM agl_resources").fetchone()[0]
            stored = fast_replace(res, version=version)
            conn.execute(
                "INSERT INTO agl_resources (version, resources_id, data) VALUES (%s, %s, %s)",
                (version, stored.resources_id, stored.model_dump_json()),
            )
            return stored

        return await self._write(write)

    async def get_resources(self, resources_id: str | None = None) -> Resources | None:
        """Resources by id, or the latest version when ``resources_id`` is ``None``."""
        if resources_id is None:
            sql, params = "SELECT data FROM agl_resources ORDER BY version DESC LIMIT 1", ()
        else:
            sql, params = "SELECT data FROM agl_resources WHERE resources_id = %s", (resources_id,)
        row = await self._read(lambda conn: conn.execute(sql, params).fetchone())
        if row is None:
            if resources_id is None:
                return None
            raise NotFoundError(f"resources {resources_id!r} not found")
        return resources_from_json(row[0])

    async def query_resources(self) -> list[Resources]:
        """Every stored resources version, oldest first (the last one is the current one)."""
        rows = await self._read(lambda conn: conn.execute("SELECT data FROM agl_resources ORDER BY version").fetchall())
        return [resources_from_json(row[0]) for row in rows]

    # ----------------------------------------------------------------- dashboards and stats

    async def list_rollouts(self, query: RolloutQuery | None = None) -> RolloutPage:
        """A page of rollout summaries matching ``query``, newest first (SQL, one snapshot)."""
        query = query or RolloutQuery()  # the boundary passes a validated query
        return await self._read(_snapshot, functools.partial(list_rollouts, POSTGRES), query)

    async def run_stats(self, query: RunStatsQuery | None = None) -> RunStats:
        """Counts per status, reward and success rate per (model version, mode), and recent throughput."""
        query = query or RunStatsQuery()
        return await self._read(_snapshot, functools.partial(run_stats, POSTGRES), query)

    async def stats(self) -> StoreStats:
        """Counts of what is stored (one consistent snapshot)."""

        def read(conn: Any) -> tuple[list[Any], Any]:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                rows = conn.execute("SELECT status, COUNT(*) FROM agl_rollouts GROUP BY status").fetchall()
                totals = conn.execute(
                    "SELECT (SELECT COUNT(*) FROM agl_attempts), (SELECT COUNT(*) FROM agl_spans), "
                    "(SELECT COUNT(*) FROM agl_llm_calls), (SELECT COUNT(*) FROM agl_resources)"
                ).fetchone()
            return rows, totals

        rows, totals = await self._read(read)
        counts = dict.fromkeys(ALL_ROLLOUT_STATUSES, 0)
        for status, count in rows:
            counts[status] = count
        return StoreStats(
            rollouts=counts, attempts=totals[0], spans=totals[1], llm_calls=totals[2], resources=totals[3]
        )

    async def close(self) -> None:
        """Close the pool (idempotent); the database keeps everything that was acknowledged."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True)
        self._pools.close()


def _snapshot(conn: Any, fn: Callable[[Any, Any], _R], query: Any) -> _R:
    """``fn(conn, query)`` in one read-only snapshot (every statement sees the same committed state)."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return fn(conn, query)


def _read_records(
    conn: Any, sql: str, params: tuple[str, ...], decode: Callable[[Any, BlobFetch], list[_R]], what: str
) -> list[_R]:
    """Rows of ``sql`` decoded, with the shared values they reference read on the same connection (in the worker
    thread: the event loop never waits on the database)."""

    def fetch(keys: list[bytes]) -> dict[bytes, bytes]:
        rows = conn.execute("SELECT key, data FROM agl_blobs WHERE key = ANY(%s)", (keys,)).fetchall()
        return {bytes(row[0]): bytes(row[1]) for row in rows}

    return decode_rows(conn.execute(sql, params).fetchall(), decode, fetch, what)
