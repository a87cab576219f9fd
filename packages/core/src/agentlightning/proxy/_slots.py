"""Runner slots on the LLM proxy: a stable URL per runner worker slot, mapped to the attempt it runs now.

An agent framework caches its HTTP client per base URL (langchain-openai builds new httpx clients, with their TLS
contexts and connection pools, for every URL it has not seen). With one URL per rollout that is paid on every
rollout. A runner slot's URL, ``{proxy}/slot/{key}/v1``, stays the same while the slot runs rollout after rollout:
the runner tells the proxy which attempt the slot runs before it starts the agent (``PUT /slot/{key}`` with
``{"rollout_id": ..., "attempt_id": ...}``) and clears it when the agent could not be stopped cleanly
(``DELETE /slot/{key}``; a body with the ids clears only that occupant). ``PUT /slots`` registers many slots in one
request (``{"slots": {key: {"rollout_id": ..., "attempt_id": ...}, ...}}``: all of them, or none when one entry is
invalid), so a runner whose slots start rollouts together pays one request, not one per rollout.

Correctness rules:
- A call on a slot with no registered attempt is refused (404, ``slot_not_registered``), never recorded.
- A runner whose agent ended uncleanly (timeout, cancellation, an exception: parts of it may still run) clears
  the slot and moves on to a new key (the key carries a generation number), so the old occupant's late calls
  get 404 instead of landing in the next rollout.
- The table lives in the proxy's memory: runners register again with each heartbeat, so a restarted proxy learns
  the running slots back; a runner that cannot register falls back to the per-rollout URL.

Both routes need the agents' token when the proxy has one (the runner has it as `LLMResource.api_key`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, cast

from starlette.responses import JSONResponse, Response

from agentlightning._urls import check_slot_key
from agentlightning.proxy._assemble import loads

__all__ = ["SLOT_NOT_REGISTERED", "SlotTable", "slot_route", "slots_route"]

SLOT_NOT_REGISTERED = "slot_not_registered"
_MAX_SLOTS = 100_000


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


class SlotTable:
    """Slot key -> the ``(rollout_id, attempt_id)`` it runs now (bounded: the oldest registrations go first)."""

    def __init__(self, max_slots: int = _MAX_SLOTS) -> None:
        self._slots: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._max = max_slots

    def __len__(self) -> int:
        return len(self._slots)

    def register(self, key: str, rollout_id: str, attempt_id: str) -> None:
        """Route calls on ``key`` to this attempt from now on (replacing the previous occupant)."""
        self._slots[key] = (rollout_id, attempt_id)
        self._slots.move_to_end(key)
        while len(self._slots) > self._max:
            self._slots.popitem(last=False)

    def clear(self, key: str, occupant: tuple[str, str] | None = None) -> bool:
        """Forget ``key`` (only if it still runs ``occupant``, when given); returns whether it was cleared."""
        current = self._slots.get(key)
        if current is None or (occupant is not None and current != occupant):
            return False
        del self._slots[key]
        return True

    def resolve(self, key: str) -> tuple[str, str] | None:
        """The attempt ``key`` runs now, or ``None``."""
        return self._slots.get(key)


def _ids(body: bytes) -> tuple[str, str] | str | None:
    """``(rollout_id, attempt_id)`` from a JSON body, ``None`` for an empty body, or why the body is wrong."""
    if not body.strip():
        return None
    try:
        data = loads(body)
    except ValueError:
        return 'the body must be JSON: {"rollout_id": ..., "attempt_id": ...}'
    return _ids_of(data)


def _ids_of(data: Any) -> tuple[str, str] | str:
    """``(rollout_id, attempt_id)`` from a parsed JSON value, or why it is wrong."""
    if not isinstance(data, dict):
        return 'the body must be a JSON object: {"rollout_id": ..., "attempt_id": ...}'
    fields = cast(dict[str, Any], data)
    rollout_id, attempt_id = fields.get("rollout_id"), fields.get("attempt_id")
    if not isinstance(rollout_id, str) or not rollout_id or not isinstance(attempt_id, str) or not attempt_id:
        return "'rollout_id' and 'attempt_id' must be non-empty strings"
    return rollout_id, attempt_id


def slot_route(table: SlotTable, method: str, key: str, body: bytes) -> Response:
    """Answer ``PUT /slot/{key}`` (register) or ``DELETE /slot/{key}`` (clear); the caller checked the token."""
    ids = _ids(body)
    if isinstance(ids, str):
        return _error(400, ids)
    if method == "PUT":
        if ids is None:
            return _error(400, 'registering a slot needs {"rollout_id": ..., "attempt_id": ...}')
        table.register(key, *ids)
        return JSONResponse({"slot": key, "rollout_id": ids[0], "attempt_id": ids[1]})
    if method == "DELETE":
        return JSONResponse({"slot": key, "cleared": table.clear(key, ids)})
    return _error(405, f"{method} /slot/{{key}} is not supported: use PUT (register) or DELETE (clear)")


def slots_route(table: SlotTable, body: bytes) -> Response:
    """Answer ``PUT /slots``: register every slot of ``{"slots": {key: ids, ...}}``, or none if one is invalid."""
    try:
        data = loads(body)
    except ValueError:
        data = None
    entries = cast(dict[str, Any], data).get("slots") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        return _error(400, 'registering slots needs {"slots": {key: {"rollout_id": ..., "attempt_id": ...}, ...}}')
    checked: list[tuple[str, tuple[str, str]]] = []
    for key, value in cast(dict[str, Any], entries).items():
        ids = _ids_of(value)
        try:
            check_slot_key(key)
        except ValueError as exc:
            ids = str(exc)
        if isinstance(ids, str):
            return _error(400, f"slot {key!r}: {ids}; no slot was registered")
        checked.append((key, ids))
    for key, ids in checked:
        table.register(key, *ids)
    return JSONResponse({"registered": len(checked)})
