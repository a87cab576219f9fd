"""The PostgreSQL store's connection pool, and what it does while its database is down.

An outage (the database stopped, restarting, the network) is found by the first request that cannot reach it
(`PostgresHealth.lost` logs one line) or by ``/healthz`` (`PostgresPool.check`). From then on no request waits on
the pool: each asks the database directly (one connection attempt, refused at once while it is down) and gets 503
(`DatabaseUnavailableError`) until it answers; then the pool is replaced by a fresh one and the outage's end is
logged (one line). A fresh pool, because the driver's pool backs off exponentially between reconnection attempts
(1, 2, 4 ... s): after an outage it could take as long again to notice that the database is back.

The driver's pool logs each failed reconnection and each broken connection it drops (several lines a second during
an outage); for this store's pools those lines are dropped, since the outage is reported once (`_QuietPoolLog`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from agentlightning.store._base import DatabaseUnavailableError
from agentlightning.store._postgres_schema import PostgresHealth

__all__ = ["POOL_NAME_PREFIX", "PostgresPool"]

logger = logging.getLogger(__name__)

POOL_NAME_PREFIX = "agl-postgres "
"""How the name of every pool a `PostgresStore` opens starts (the driver's log records name it)."""

# The driver's log lines about an outage, as written by psycopg_pool (format strings).
_OUTAGE_MESSAGES = frozenset(
    {
        "error connecting in %r: %s",
        "reconnection attempt in pool %r failed after %s sec",
        "discarding closed connection: %s",
        "discarding broken connection: %s",
    }
)


class _QuietPoolLog(logging.Filter):
    """Drops the driver's per-attempt outage lines about this store's pools (the store logs the outage once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in _OUTAGE_MESSAGES or not isinstance(record.args, tuple) or not record.args:
            return True
        subject = record.args[0]
        # a pool's name, or a connection whose pool has one (`_pool`: the driver's back reference)
        name = subject if isinstance(subject, str) else getattr(getattr(subject, "_pool", None), "name", None)
        return not (isinstance(name, str) and name.startswith(POOL_NAME_PREFIX))


_QUIET = _QuietPoolLog()


class PostgresPool:
    """The pool of a `PostgresStore`: `get` the pool for a request, `check` the database for ``/healthz``.

    Args:
        psycopg: The driver module.
        psycopg_pool: The driver's pool module.
        dsn: Where the database is.
        health: The store's health, which logs an outage's start and end.
        pool_size: Most connections.
        connect_timeout: Seconds a connection attempt may take (a request waits three times that for a connection).
    """

    def __init__(
        self, psycopg: Any, psycopg_pool: Any, dsn: str, health: PostgresHealth, pool_size: int, connect_timeout: float
    ) -> None:
        self._psycopg = psycopg
        self._psycopg_pool = psycopg_pool
        self._dsn = dsn
        self._health = health
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._probing = threading.Lock()
        pool_logger = logging.getLogger("psycopg.pool")
        if _QUIET not in pool_logger.filters:
            pool_logger.addFilter(_QUIET)
        self.pool: Any = self._open()

    def _open(self) -> Any:
        return self._psycopg_pool.ConnectionPool(
            self._dsn,
            min_size=1,
            max_size=self._pool_size,
            kwargs={"autocommit": True},
            timeout=self._connect_timeout * 3,
            name=POOL_NAME_PREFIX + self._health.where,
            open=True,
        )

    def get(self) -> Any:
        """The pool to take a request's connection from; during an outage, only once the database answers again.

        Raises:
            DatabaseUnavailableError: The database is (still) down; the request should be answered 503.
        """
        if self._health.unreachable is not None:
            self._recover()
        return self.pool

    def _recover(self) -> None:
        """During an outage: ask the database directly; once it answers, open a fresh pool and end the outage."""
        if not self._probing.acquire(blocking=False):  # another request is asking: do not queue behind it
            raise self._health.still_down()
        try:
            if self._health.unreachable is None:  # another request found it back meanwhile
                return
            try:
                self._probe()
            except self._psycopg.Error as exc:
                raise self._health.lost(exc) from None
            old, self.pool = self.pool, self._open()
            # requests still on the old pool finish there; waiters for its connections retry on the new one
            closing = threading.Thread(target=old.close, kwargs={"timeout": 5.0}, name="agl-postgres-old-pool")
            closing.daemon = True
            closing.start()
            self._health.reached()
        finally:
            self._probing.release()

    def _probe(self) -> None:
        timeout = max(1, round(min(self._connect_timeout, 2.0)))
        with self._psycopg.connect(self._dsn, autocommit=True, connect_timeout=timeout) as conn:
            conn.execute("SELECT 1")

    def check(self) -> str | None:
        """Ask the database now (what ``/healthz`` does; blocking): ``None`` when the store can serve, else why not.

        A fresh connection, not a pooled one: the answer is the database's state now, and a pooled connection that a
        database restart broke cannot make it look down. An outage it finds, or its end, is logged once.
        """
        try:
            if self._health.unreachable is not None:
                self._recover()
            else:
                try:
                    self._probe()
                except self._psycopg.Error as exc:
                    self._health.lost(exc)
        except DatabaseUnavailableError:
            pass
        return self._health.problem

    def close(self) -> None:
        """Close the pool and its connections."""
        self.pool.close()
