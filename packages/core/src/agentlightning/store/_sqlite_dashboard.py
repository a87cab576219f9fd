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
from typing import TypeVar

from agentlightning.store._base import StoreError
from agentlightning.store._query import RolloutPage, RolloutQuery, RunStats, RunStatsQuery
from agentlightning.store._sql_dashboard import SQLITE, list_rollouts, run_stats
from agentlightning.store._sqlite_schema import connect

__all__ = ["DashboardReader"]

_Q = TypeVar("_Q")
_R = TypeVar("_R")


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
        """`LightningStore.list_rollouts` in SQL (`agentlightning.store._sql_dashboard`)."""
        return list_rollouts(SQLITE, conn, query)

    @staticmethod
    def run_stats(conn: sqlite3.Connection, query: RunStatsQuery) -> RunStats:
        """`LightningStore.run_stats` in SQL (`agentlightning.store._sql_dashboard`)."""
        return run_stats(SQLITE, conn, query)
