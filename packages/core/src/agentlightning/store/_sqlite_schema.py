"""SQLite store internals: schema, migrations and connection setup (rows <-> models: `_sql_rows`, shared with
PostgreSQL)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from agentlightning.store._base import StorageError, StoreError
from agentlightning.store._sqlite_spans import SPANS_SCHEMA, migrate_spans_6_to_7

__all__ = ["ConnectionGuard", "StorageHealth", "connect"]

logger = logging.getLogger(__name__)

_SCHEMA_VERSION = 7
# Version 3 added the requests table (answers of retried requests, by client request id).
# Version 4: attempts keep their rollout's mode, and finished attempts are indexed for dashboard statistics.
# Version 5: spans and LLM calls are written in the compact formats of `_codec` (rows of older versions stay JSON
# text and are still read), and values they share are stored once in the blobs table.
# Version 7: spans are keyed by integers (an attempt's key in span_attempts, the span id's 64 bits): see
# `_sqlite_spans`.
_BLOBS_TABLE = """
CREATE TABLE IF NOT EXISTS blobs (
    key BLOB PRIMARY KEY,
    data BLOB NOT NULL
) WITHOUT ROWID
"""
_REQUESTS_TABLE = """
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY,
    result TEXT NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;
-- old answers are purged by age in batches: the index keeps that a range delete, not a table scan
CREATE INDEX IF NOT EXISTS ix_requests_created ON requests (created_at)
"""
_SCHEMA = (
    _REQUESTS_TABLE
    + ";"
    + """
CREATE TABLE IF NOT EXISTS rollouts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    input TEXT NOT NULL,
    mode TEXT,
    group_id TEXT,
    resources_id TEXT,
    retry_count INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    metadata TEXT NOT NULL
);
-- the queue: only queuing rollouts, so a claim dirties one index page (an index on status would dirty two)
CREATE INDEX IF NOT EXISTS ix_rollouts_queue ON rollouts (seq) WHERE status = 'queuing';
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    rollout_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    worker_id TEXT,
    status TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL,
    last_heartbeat REAL NOT NULL,
    error TEXT,
    reward REAL,
    reward_seq INTEGER,
    model_version INTEGER,
    mode TEXT
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS ix_attempts_rollout ON attempts (rollout_id, sequence);
-- only running attempts (about one per worker) are in it, so scanning it for start times is cheap
CREATE INDEX IF NOT EXISTS ix_attempts_running ON attempts (last_heartbeat, start_time) WHERE status = 'running';
-- statistics per (model version, mode) read only this index. Running attempts stay out of it, so starting an
-- attempt and its heartbeats never touch it (no semicolons in comments: the schema is split on them)
CREATE INDEX IF NOT EXISTS ix_attempts_finished ON attempts (model_version, mode, status, reward, end_time)
    WHERE status != 'running';
CREATE TABLE IF NOT EXISTS llm_calls (
    call_id TEXT PRIMARY KEY,
    rollout_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    start_time REAL NOT NULL,
    data BLOB NOT NULL,
    agent_name TEXT,
    policy TEXT,
    model_version INTEGER
);
CREATE INDEX IF NOT EXISTS ix_llm_calls_rollout ON llm_calls (rollout_id, attempt_id, start_time);
CREATE TABLE IF NOT EXISTS resources (
    version INTEGER PRIMARY KEY,
    resources_id TEXT NOT NULL UNIQUE,
    data TEXT NOT NULL
);
"""
    + _BLOBS_TABLE
    + ";"
    + SPANS_SCHEMA
)

# Version 1 -> 2: attempts keep their final reward and serving model version (for dashboards); filled in from
# the stored spans and LLM calls once, when a version-1 file is first opened.
_MIGRATE_1_TO_2 = """
ALTER TABLE attempts ADD COLUMN reward REAL;
ALTER TABLE attempts ADD COLUMN reward_seq INTEGER;
ALTER TABLE attempts ADD COLUMN model_version INTEGER;
UPDATE attempts SET model_version = (
    SELECT MAX(json_extract(c.data, '$.model_version')) FROM llm_calls c
    WHERE c.rollout_id = attempts.rollout_id AND c.attempt_id = attempts.attempt_id
);
UPDATE attempts SET (reward, reward_seq) = (
    SELECT json_extract(s.data, '$.attributes."agentlightning.reward.value"'), s.sequence_id FROM spans s
    WHERE s.rollout_id = attempts.rollout_id AND s.attempt_id = attempts.attempt_id
      AND json_extract(s.data, '$.attributes."agentlightning.span.kind"') = 'reward'
      AND json_extract(s.data, '$.attributes."agentlightning.reward.final"') = 1
      AND json_type(s.data, '$.attributes."agentlightning.reward.value"') IN ('integer', 'real')
    ORDER BY s.sequence_id DESC LIMIT 1
)
"""

_MIGRATE_3_TO_4 = """
ALTER TABLE attempts ADD COLUMN mode TEXT;
UPDATE attempts SET mode = (SELECT r.mode FROM rollouts r WHERE r.rollout_id = attempts.rollout_id);
CREATE INDEX IF NOT EXISTS ix_attempts_finished ON attempts (model_version, mode, status, reward, end_time)
    WHERE status != 'running'
"""

# Version 5 -> 6: LLM calls keep their agent, policy and model version in columns (for per-policy statistics),
# filled in from rows still in JSON text (written before version 5); rows in the compact format of version 5 count
# as of no agent, policy or version in those statistics (their records read back whole, as before).
_MIGRATE_5_TO_6 = """
ALTER TABLE llm_calls ADD COLUMN agent_name TEXT;
ALTER TABLE llm_calls ADD COLUMN policy TEXT;
ALTER TABLE llm_calls ADD COLUMN model_version INTEGER;
UPDATE llm_calls SET agent_name = json_extract(data, '$.agent_name'), policy = json_extract(data, '$.policy'),
    model_version = json_extract(data, '$.model_version') WHERE typeof(data) = 'text'
"""


def connect(path: Path, synchronous: str, busy_timeout: float) -> sqlite3.Connection:
    """Open ``path`` in WAL mode with the store schema (created if the file is new)."""
    try:
        conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open SQLite store at {path}: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, 1, 2, 3, 4, 5, 6, _SCHEMA_VERSION):
            raise StoreError(
                f"{path} has store schema version {version}; this agentlightning reads versions 1 to "
                f"{_SCHEMA_VERSION} (a newer agentlightning-core wrote it: upgrade to open it)"
            )
        if version != _SCHEMA_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Read again under the write lock: another process may have set the file up meanwhile.
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                script = {
                    0: _SCHEMA,
                    1: _MIGRATE_1_TO_2 + ";" + _REQUESTS_TABLE + ";" + _MIGRATE_3_TO_4 + ";" + _BLOBS_TABLE,
                    2: _REQUESTS_TABLE + ";" + _MIGRATE_3_TO_4 + ";" + _BLOBS_TABLE,
                    3: _MIGRATE_3_TO_4 + ";" + _BLOBS_TABLE,
                    4: _BLOBS_TABLE,
                }.get(version, "")
                if 1 <= version <= 5:
                    script += ";" + _MIGRATE_5_TO_6
                for statement in script.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                if 1 <= version <= 6:
                    migrate_spans_6_to_7(conn)
                conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"cannot use {path} as a SQLite store: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


class StorageHealth:
    """Whether the last write could reach the disk: ``error`` holds the last storage failure, ``None`` once a
    write succeeds again. Read by the served store's ``/healthz``."""

    __slots__ = ("error", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: str | None = None

    def failed(self, exc: sqlite3.Error) -> StorageError | None:
        """The `StorageError` for a disk-full or read-only failure (recorded and logged once), else ``None``."""
        text = str(exc).lower()
        if "database or disk is full" in text:
            message = (
                f"database or disk is full: the SQLite store {self.path} cannot grow; free disk space (nothing "
                "was written by this request)"
            )
        elif "readonly database" in text or "read-only" in text:
            message = (
                f"database is read-only: the SQLite store {self.path} cannot be written; check the permissions "
                "of the file and its directory and that the disk is mounted read-write"
            )
        else:
            return None
        if message != self.error:
            logger.error("%s (%s)", message, exc)
        self.error = message
        return StorageError(message)


class ConnectionGuard:
    """``with guard as conn``: the store lock held and, for writes, one ``BEGIN IMMEDIATE`` transaction.

    A class rather than a generator context manager because it runs around every store call (a generator-based
    one costs several microseconds per use). It keeps no per-use state, so nesting a read inside a write on the
    same thread (the lock is re-entrant) and sharing it between threads are both safe. A write that fails because
    the disk is full or the database is read-only raises `StorageError` and is recorded in ``health``.

    Args:
        lock: The store's re-entrant lock.
        get_conn: Returns the open connection, or ``None`` once the store is closed.
        closed_message: Message of the `StoreError` raised when the store is closed.
        write: Wrap the block in ``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` if it raises).
        health: Where storage failures of writes are recorded.
    """

    __slots__ = ("_closed_message", "_get_conn", "_health", "_lock", "_write")

    def __init__(
        self,
        lock: threading.RLock,
        get_conn: Callable[[], sqlite3.Connection | None],
        closed_message: str,
        write: bool,
        health: StorageHealth | None = None,
    ) -> None:
        self._lock = lock
        self._get_conn = get_conn
        self._closed_message = closed_message
        self._write = write
        self._health = health

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            conn = self._get_conn()
            if conn is None:
                raise StoreError(self._closed_message)
            if self._write:
                conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._lock.release()
            self._raise_storage(exc)
            raise
        except BaseException:
            self._lock.release()
            raise
        return conn

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            conn = self._get_conn()
            if self._write and conn is not None:
                if exc_type is None:
                    try:
                        conn.execute("COMMIT")
                    except sqlite3.Error as commit_exc:
                        _rollback(conn)  # a failed COMMIT must not leave the transaction open for the next caller
                        self._raise_storage(commit_exc)
                        raise
                    except BaseException:
                        _rollback(conn)
                        raise
                    health = self._health
                    if health is not None and health.error is not None:
                        logger.warning("SQLite store %s accepts writes again", health.path)
                        health.error = None
                else:
                    _rollback(conn)
                    if isinstance(exc, sqlite3.Error):
                        self._raise_storage(exc)
        finally:
            self._lock.release()

    def _raise_storage(self, exc: sqlite3.Error) -> None:
        if self._write and self._health is not None:
            error = self._health.failed(exc)
            if error is not None:
                raise error from exc


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite may already have rolled back by itself (e.g. on a full disk); a second ROLLBACK would raise.
    if conn.in_transaction:
        conn.execute("ROLLBACK")
