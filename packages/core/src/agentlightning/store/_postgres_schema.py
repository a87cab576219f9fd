"""PostgreSQL store internals: the driver (an optional extra), the DSN, the schema and its migrations, errors.

The driver (psycopg 3 and its connection pool) is imported only when a `PostgresStore` is opened, so the core
installs and imports without it; a missing driver fails with the pip command that installs it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from types import ModuleType
from typing import Any

from agentlightning.store._base import DatabaseUnavailableError, StorageError, StoreError

__all__ = [
    "INSTALL_HINT",
    "SCHEMA_VERSION",
    "PostgresHealth",
    "describe_dsn",
    "driver",
    "is_postgres_dsn",
    "migrate",
    "one_line",
    "unreachable",
]

logger = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "agentlightning-core[postgres]"'
"""The command that installs the PostgreSQL driver."""

SCHEMA_VERSION = 3
"""The schema this code writes; `migrate` brings older databases up to it and refuses newer ones."""

# Ids are compared byte by byte (COLLATE "C"), as SQLite compares text: orderings by id do not depend on the
# locale the database was created with. JSON documents are kept as text, exactly as the models serialised them.
_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS agl_requests (
    request_id TEXT COLLATE "C" PRIMARY KEY,
    result TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_agl_requests_created ON agl_requests (created_at);
CREATE TABLE IF NOT EXISTS agl_rollouts (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_id TEXT COLLATE "C" NOT NULL UNIQUE,
    status TEXT NOT NULL,
    input TEXT NOT NULL,
    mode TEXT,
    group_id TEXT COLLATE "C",
    resources_id TEXT COLLATE "C",
    retry_count INTEGER NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    metadata TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_agl_rollouts_queue ON agl_rollouts (seq) WHERE status = 'queuing';
CREATE INDEX IF NOT EXISTS ix_agl_rollouts_status ON agl_rollouts (status);
CREATE TABLE IF NOT EXISTS agl_attempts (
    attempt_id TEXT COLLATE "C" PRIMARY KEY,
    rollout_id TEXT COLLATE "C" NOT NULL,
    sequence INTEGER NOT NULL,
    worker_id TEXT,
    status TEXT NOT NULL,
    start_time DOUBLE PRECISION NOT NULL,
    end_time DOUBLE PRECISION,
    last_heartbeat DOUBLE PRECISION NOT NULL,
    error TEXT,
    reward DOUBLE PRECISION,
    reward_seq BIGINT,
    model_version BIGINT,
    mode TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS ix_agl_attempts_rollout ON agl_attempts (rollout_id, sequence);
CREATE INDEX IF NOT EXISTS ix_agl_attempts_running ON agl_attempts (last_heartbeat, start_time)
    WHERE status = 'running';
CREATE INDEX IF NOT EXISTS ix_agl_attempts_finished ON agl_attempts (model_version, mode, status, reward, end_time)
    WHERE status <> 'running';
CREATE TABLE IF NOT EXISTS agl_spans (
    rollout_id TEXT COLLATE "C" NOT NULL,
    attempt_id TEXT COLLATE "C" NOT NULL,
    span_id TEXT COLLATE "C" NOT NULL,
    sequence_id BIGINT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (rollout_id, attempt_id, span_id)
);
CREATE TABLE IF NOT EXISTS agl_llm_calls (
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    call_id TEXT COLLATE "C" PRIMARY KEY,
    rollout_id TEXT COLLATE "C" NOT NULL,
    attempt_id TEXT COLLATE "C" NOT NULL,
    start_time DOUBLE PRECISION NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_agl_llm_calls_rollout ON agl_llm_calls (rollout_id, attempt_id, start_time, seq);
CREATE TABLE IF NOT EXISTS agl_resources (
    version BIGINT PRIMARY KEY,
    resources_id TEXT COLLATE "C" NOT NULL UNIQUE,
    data TEXT NOT NULL
)
"""

# Version 2: spans and LLM calls are written in the compact formats of `_codec` (bytes; rows of version 1 become
# the bytes of their JSON text, which the codec still reads), and values they share are stored once in agl_blobs.
_MIGRATE_1_TO_2 = """
ALTER TABLE agl_spans ALTER COLUMN data TYPE BYTEA USING convert_to(data, 'UTF8');
ALTER TABLE agl_llm_calls ALTER COLUMN data TYPE BYTEA USING convert_to(data, 'UTF8');
CREATE TABLE IF NOT EXISTS agl_blobs (
    key BYTEA PRIMARY KEY,
    data BYTEA NOT NULL
)
"""

# Version 3: LLM calls keep their agent, policy and model version in columns (for per-policy statistics); calls
# stored before count as of no agent, policy or version there (their records read back whole, as before).
_MIGRATE_2_TO_3 = """
ALTER TABLE agl_llm_calls ADD COLUMN IF NOT EXISTS agent_name TEXT COLLATE "C";
ALTER TABLE agl_llm_calls ADD COLUMN IF NOT EXISTS policy TEXT COLLATE "C";
ALTER TABLE agl_llm_calls ADD COLUMN IF NOT EXISTS model_version BIGINT
"""

# Version n -> n + 1 scripts go here (run in one transaction, under the migration lock); version 0 is an empty
# database, which gets the version-1 schema and then every migration.
_MIGRATIONS: dict[int, str] = {0: _SCHEMA_V1, 1: _MIGRATE_1_TO_2, 2: _MIGRATE_2_TO_3}

# pg_advisory_xact_lock keys (any constant bigint, the same in every process sharing the database)
MIGRATION_LOCK = 0x61676C0001
RESOURCES_LOCK = 0x61676C0002


def driver() -> tuple[ModuleType, ModuleType]:
    """``(psycopg, psycopg_pool)``; an `ImportError` with the install command when they are missing."""
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise ImportError(f"the PostgreSQL store needs the psycopg driver: {INSTALL_HINT}") from exc
    return psycopg, psycopg_pool


def is_postgres_dsn(value: str) -> bool:
    """Whether ``value`` names a PostgreSQL database (a ``postgresql://`` or ``postgres://`` URL)."""
    return value.startswith(("postgresql://", "postgres://"))


_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")


def mask_password(text: str) -> str:
    """``text`` with the password of every URL in it masked (``postgresql://agl:***@host/db``)."""
    return _PASSWORD.sub(r"\1***@", text)


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (libpq's run over several lines), any URL's password masked."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    return _PASSWORD.sub(r"\1***@", line)


def unreachable(psycopg: Any, exc: BaseException) -> bool:
    """Whether a driver error means the database cannot be reached (down, restarting, the network), not a bad query.

    The pool's timeout, a connection refused or lost (no SQLSTATE: the client saw it), class 08 (connection
    exception) and 57P (the server shutting down or starting up).
    """
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    sqlstate: str = getattr(exc, "sqlstate", None) or ""
    return not sqlstate or sqlstate.startswith(("08", "57P"))


def describe_dsn(dsn: str) -> str:
    """``user@host:port/dbname`` of ``dsn`` without its password, for messages and logs.

    Raises:
        StoreError: The DSN cannot be parsed (one line, without the DSN's password).
    """
    psycopg, _ = driver()
    try:
        parts: dict[str, Any] = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise StoreError(
            f"not a valid PostgreSQL DSN: {one_line(exc)} (expected postgresql://user@host:port/dbname)"
        ) from None
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = parts.get("host") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"{user}{host}{port}/{parts.get('dbname') or ''}"


def migrate(conn: Any, where: str) -> int:
    """Create the schema in an empty database or migrate an older one; returns the version found.

    Runs in one transaction under an advisory lock, so several servers opening one database at once migrate
    it once. A database written by a newer version of this code is refused (`StoreError`).
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS agl_schema (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM agl_schema").fetchone()
        found = 0 if row is None else int(row[0])
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"the PostgreSQL store {where} has schema version {found}; this agentlightning reads versions up to "
                f"{SCHEMA_VERSION} (upgrade agentlightning-core)"
            )
        for version in range(found, SCHEMA_VERSION):
            logger.info("migrating the PostgreSQL store %s from schema version %d", where, version)
            for statement in _MIGRATIONS[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
        if row is None:
            conn.execute("INSERT INTO agl_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
        elif found != SCHEMA_VERSION:
            conn.execute("UPDATE agl_schema SET version = %s", (SCHEMA_VERSION,))
    return found


class PostgresHealth:
    """What the store knows of its database: whether it accepted the last write, and whether it can be reached.

    ``error`` holds why the database refused a write (disk full, read-only), ``None`` once one succeeds; the refused
    request gets 507. ``unreachable`` holds why the database cannot be reached (stopped, restarting, the network),
    ``None`` once any statement runs again; requests meanwhile get 503. Each change is logged once, in one line: an
    outage is one line when it starts and one when it ends, however many requests fail in between. Read by the
    served store's ``/healthz`` (503 while either is set). Shared by the store's worker threads.
    """

    __slots__ = ("_lock", "error", "refused", "since", "unreachable", "where")

    def __init__(self, where: str) -> None:
        self.where = where
        self.error: str | None = None
        self.unreachable: str | None = None
        self.since = 0.0
        self.refused = 0  # requests that failed during the current outage
        self._lock = threading.Lock()

    @property
    def problem(self) -> str | None:
        """Why the store cannot serve now (the database unreachable, or refusing writes), ``None`` when it can."""
        return self.unreachable or self.error

    def failed(self, exc: BaseException) -> StorageError | None:
        """The `StorageError` for a full disk or a read-only database (recorded, logged once), else ``None``."""
        sqlstate = getattr(exc, "sqlstate", None) or ""
        if sqlstate == "53100":  # disk_full
            message = (
                f"database or disk is full: the PostgreSQL store {self.where} refused the write ({one_line(exc)}); "
                "free space on the database server (nothing was written by this request)"
            )
        elif sqlstate in ("25006", "42501"):  # read_only_sql_transaction, insufficient_privilege
            message = (
                f"database is read-only: the PostgreSQL store {self.where} cannot be written ({one_line(exc)}); "
                "check that it is the primary and that the user may write its tables"
            )
        else:
            return None
        if message != self.error:
            logger.error("%s", message)
        self.error = message
        return StorageError(message)

    def lost(self, exc: BaseException) -> DatabaseUnavailableError:
        """The database could not be reached (``exc``): the error to raise; the outage's first one is logged."""
        with self._lock:
            self.refused += 1
            if self.unreachable is None:
                self.since = time.monotonic()
                self.unreachable = f"the PostgreSQL database {self.where} is unreachable: {one_line(exc)}"
                logger.error("%s (requests get 503 until it is back)", self.unreachable)
            return DatabaseUnavailableError(self.unreachable)

    def still_down(self) -> DatabaseUnavailableError:
        """The error for one more request refused during the current outage (counted, not logged)."""
        with self._lock:
            self.refused += 1
            return DatabaseUnavailableError(self.unreachable or f"the PostgreSQL database {self.where} is unreachable")

    def reached(self) -> None:
        """A statement ran: the database is reachable (an outage's end is logged once)."""
        if self.unreachable is None:  # the usual case: no lock taken
            return
        with self._lock:
            if self.unreachable is None:  # pyright: ignore[reportUnnecessaryComparison]  # another thread ended it
                return
            logger.warning(
                "the PostgreSQL database %s is reachable again after %.1f s (%d request(s) failed meanwhile)",
                self.where,
                time.monotonic() - self.since,
                self.refused,
            )
            self.unreachable = None
            self.refused = 0

    def succeeded(self) -> None:
        """A write went through: clear a recorded failure."""
        self.reached()
        if self.error is not None:
            logger.warning("PostgreSQL store %s accepts writes again", self.where)
            self.error = None
