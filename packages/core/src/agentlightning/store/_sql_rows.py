"""Rows of the rollouts and attempts tables, shared by the SQL stores (SQLite and PostgreSQL): neither dialect owns
them.

Both schemas keep the same columns in the same order (PostgreSQL's tables are only prefixed ``agl_``), so one list
of columns and one row -> model conversion serve both.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json

from agentlightning._fast import fast_factory
from agentlightning._models import Attempt, Rollout

__all__ = ["ATTEMPT_COLUMNS", "ROLLOUT_COLUMNS", "attempt_from_row", "dump_json", "rollout_from_row"]

_new_rollout = fast_factory(Rollout)
_new_attempt = fast_factory(Attempt)

ROLLOUT_COLUMNS = (
    "rollout_id, status, input, mode, group_id, resources_id, retry_count, created_at, updated_at, metadata"
)
"""The rollouts table's columns, in the order `rollout_from_row` reads them."""
ATTEMPT_COLUMNS = "rollout_id, attempt_id, sequence, worker_id, status, start_time, end_time, last_heartbeat, error"
"""The attempts table's columns, in the order `attempt_from_row` reads them."""


def rollout_from_row(row: Any) -> Rollout:
    """Build a rollout from a row of `ROLLOUT_COLUMNS` (written by the store from a validated rollout: trusted)."""
    return _new_rollout(
        {
            "rollout_id": row[0],
            "input": from_json(row[2]),
            "status": row[1],
            "mode": row[3],
            "group_id": row[4],
            "resources_id": row[5],
            "retry_count": row[6],
            "created_at": row[7],
            "updated_at": row[8],
            "metadata": from_json(row[9]),
        }
    )


def attempt_from_row(row: Any) -> Attempt:
    """Build an attempt from a row of `ATTEMPT_COLUMNS` (written by the store: trusted)."""
    return _new_attempt(
        {
            "rollout_id": row[0],
            "attempt_id": row[1],
            "sequence": row[2],
            "worker_id": row[3],
            "status": row[4],
            "start_time": row[5],
            "end_time": row[6],
            "last_heartbeat": row[7],
            "error": row[8],
        }
    )


def dump_json(value: Any, what: str) -> str:
    """JSON text of ``value``; a `ValueError` naming ``what`` if it cannot be serialised."""
    try:
        return to_json(value).decode()
    except PydanticSerializationError as exc:
        raise ValueError(f"{what} must be JSON-serialisable to be stored: {exc}") from exc
