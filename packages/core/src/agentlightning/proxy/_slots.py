"""Runner slots on the LLM proxy, and the attempts their runners reported ended.

An agent framework caches its HTTP client per base URL (langchain-openai builds new httpx clients, with their TLS
contexts and connection pools, for every URL it has not seen). With one URL per rollout that is paid on every
rollout. A runner slot's URL, ``{proxy}/slot/{key}/v1``, stays the same while the slot runs rollout after rollout:
the runner tells the proxy which attempt the slot runs before it starts the agent (``PUT /slot/{key}`` with
``{"rollout_id": ..., "attempt_id": ...}``), again with each heartbeat, and that the attempt ended once its agent
returned. ``PUT /slots`` carries many of these in one request: ``{"slots": {key: {"rollout_id": ...,
"attempt_id": ...}, ...}, "ended": [{"rollout_id": ..., "attempt_id": ..., "slot": key or null}, ...]}`` (both
parts optional; all of it, or nothing when one entry is invalid). ``DELETE /slot/{key}`` forgets a slot (a body
with the ids: only if it still runs that attempt, which then counts as ended).

Who may change slots: only holders of the proxy's **runner token** (``Authorization: Bearer <runner token>``), which
the trainer publishes to runners as `LLMResource.runner_token` and runners never hand to agents. The agents' token
(`LLMResource.api_key`, which every agent holds) does not open these routes, so one agent cannot move another
runner's slot to its own rollout or clear it. Slot keys are random (the runner draws them), so one slot's URL tells
nothing about another's. A registered slot's key is also its agent's credential for LLM calls on the slot's URL
(`agentlightning.proxy._routes.slot_refusal`): the URL the runner hands its agent is enough, whatever ``api_key``
the agent passes; once the slot is cleared or moved to a new key the old URL admits nothing without the agents' token.

Correctness rules:
- A call on a slot with no registered attempt is refused (404, ``slot_not_registered``), never recorded.
- A call for an attempt whose end was reported (through its slot or its per-rollout URL, or by the store refusing
  a record of it as late) is refused (409, ``attempt_finished``) and counted (`LLMProxy.late_calls`,
  ``/admin/status``): a finished rollout's training data never grows. The ended attempts are kept in memory, the
  latest `MAX_ENDED` of them; the check is a dict lookup, not a store round trip.
- A runner whose agent ended uncleanly (timeout, cancellation, an exception: parts of it may still run) moves the
  slot to a new key, so the old occupant's late calls can never reach the slot's next rollout.
- The table is bounded (`MAX_SLOTS`): a registration that would overflow it drops only slots not renewed for
  ``stale_after_s`` (a runner renews its running slots with each heartbeat); with none to drop it is refused (503,
  ``slot_table_full``: that runner's agents use per-rollout URLs), never by evicting a live slot. One request
  carries at most `MAX_PER_REQUEST` entries (413 above).
- The table lives in the proxy's memory: runners register again with each heartbeat, so a restarted proxy learns
  the running slots back; a runner that cannot register falls back to the per-rollout URL.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from starlette.responses import JSONResponse, Response

from agentlightning._urls import check_slot_key
from agentlightning.proxy._asgi import RawResponse, raw_headers

__all__ = [
    "ATTEMPT_FINISHED",
    "MAX_ENDED",
    "MAX_PER_REQUEST",
    "MAX_SLOTS",
    "SLOT_NOT_REGISTERED",
    "SLOT_TABLE_FULL",
    "Slot",
    "SlotTable",
    "SlotTableFull",
    "clear_slot",
    "register_slot",
    "update_slots",
]

SLOT_NOT_REGISTERED = "slot_not_registered"
ATTEMPT_FINISHED = "attempt_finished"
SLOT_TABLE_FULL = "slot_table_full"
MAX_SLOTS = 65_536
"""Most slots a proxy holds."""
MAX_ENDED = 65_536
"""Most ended attempts a proxy remembers (the oldest are forgotten first)."""
MAX_PER_REQUEST = 4096
"""Most entries (slots and ended attempts together) in one ``PUT /slots``."""
STALE_AFTER_S = 300.0
"""A slot not renewed for this long may be dropped when the table is full (runners renew every heartbeat)."""

Ids = tuple[str, str]


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


class SlotTableFull(Exception):
    """A registration would need to evict a live slot."""


class Slot:
    """The attempt one slot runs: its ids, when its runner last renewed it, and whether the attempt ended."""

    __slots__ = ("attempt_id", "ended", "renewed", "rollout_id")

    def __init__(self, rollout_id: str, attempt_id: str, renewed: float, ended: bool) -> None:
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.renewed = renewed
        self.ended = ended


class SlotTable:
    """Slot key -> the attempt it runs, plus the attempts reported ended (both bounded; see the module docs).

    Args:
        max_slots: Most slots held.
        stale_after_s: Seconds after its last registration a slot may be dropped to make room.
        max_ended: Most ended attempts remembered.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        max_slots: int = MAX_SLOTS,
        stale_after_s: float = STALE_AFTER_S,
        max_ended: int = MAX_ENDED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slots: OrderedDict[str, Slot] = OrderedDict()  # least recently renewed first
        self._ended: OrderedDict[Ids, None] = OrderedDict()
        self._max = max_slots
        self._stale_after = stale_after_s
        self._max_ended = max_ended
        self._clock = clock

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[str]:
        """The registered slot keys, least recently renewed first."""
        return iter(list(self._slots))

    def register(self, key: str, rollout_id: str, attempt_id: str) -> None:
        """Route calls on ``key`` to this attempt from now on (replacing the previous occupant).

        Raises:
            SlotTableFull: ``key`` is new and the table is full of live slots.
        """
        self.register_many([(key, (rollout_id, attempt_id))])

    def register_many(self, entries: list[tuple[str, Ids]]) -> None:
        """Register every entry (later entries of a key win), or none.

        Raises:
            SlotTableFull: The new keys do not fit, even after dropping every stale slot.
        """
        slots = self._slots
        new = len({key for key, _ in entries if key not in slots})
        t = self._clock()
        if len(slots) + new > self._max:
            self._drop_stale(len(slots) + new - self._max, t)
            if len(slots) + new > self._max:
                raise SlotTableFull(
                    f"the LLM proxy holds {len(slots)} live runner slots (its limit is {self._max}) and "
                    f"cannot take {new} more without evicting a live one; this runner's agents use per-rollout URLs"
                )
        for key, (rollout_id, attempt_id) in entries:
            ended = (rollout_id, attempt_id) in self._ended  # a late renewal never revives an ended attempt
            slot = slots.get(key)
            if slot is None:
                slots[key] = Slot(rollout_id, attempt_id, t, ended)
                continue
            slot.rollout_id, slot.attempt_id, slot.renewed, slot.ended = rollout_id, attempt_id, t, ended
            slots.move_to_end(key)

    def _drop_stale(self, wanted: int, t: float) -> None:
        """Drop up to ``wanted`` slots not renewed for ``stale_after_s`` (the least recently renewed first)."""
        slots = self._slots
        while wanted > 0 and slots:
            key, slot = next(iter(slots.items()))
            if t - slot.renewed < self._stale_after:
                return
            del slots[key]
            wanted -= 1

    def end(self, rollout_id: str, attempt_id: str, key: str | None = None) -> None:
        """The attempt ended: refuse its calls from now on (and on slot ``key``, if that still runs it)."""
        ids = (rollout_id, attempt_id)
        self._ended[ids] = None
        self._ended.move_to_end(ids)
        while len(self._ended) > self._max_ended:
            self._ended.popitem(last=False)
        slot = self._slots.get(key) if key is not None else None
        if slot is not None and slot.rollout_id == rollout_id and slot.attempt_id == attempt_id:
            slot.ended = True  # kept with the slot: forgetting old ended attempts cannot revive it

    def has_ended(self, rollout_id: str, attempt_id: str) -> bool:
        """Whether the attempt's end was reported (and is still remembered)."""
        return (rollout_id, attempt_id) in self._ended

    def clear(self, key: str, occupant: Ids | None = None) -> bool:
        """Forget ``key`` (only if it still runs ``occupant``, which then counts as ended); whether it was cleared."""
        current = self._slots.get(key)
        if current is None or (occupant is not None and (current.rollout_id, current.attempt_id) != occupant):
            return False
        del self._slots[key]
        if occupant is not None:
            self.end(*occupant)
        return True

    def occupant(self, key: str) -> Slot | None:
        """The slot ``key`` (its attempt, and whether that ended), or ``None``."""
        return self._slots.get(key)

    def resolve(self, key: str) -> Ids | None:
        """The ``(rollout_id, attempt_id)`` registered on ``key`` now, or ``None``."""
        slot = self._slots.get(key)
        return None if slot is None else (slot.rollout_id, slot.attempt_id)


def _full(exc: SlotTableFull) -> Response:
    return _error(503, str(exc), SLOT_TABLE_FULL)


def register_slot(table: SlotTable, key: str, ids: Ids) -> Response:
    """Answer ``PUT /slot/{key}`` (the body validated, the runner token checked)."""
    try:
        table.register(key, *ids)
    except SlotTableFull as exc:
        return _full(exc)
    return JSONResponse({"slot": key, "rollout_id": ids[0], "attempt_id": ids[1]})


def clear_slot(table: SlotTable, key: str, occupant: Ids | None) -> Response:
    """Answer ``DELETE /slot/{key}`` (with an occupant: only if the slot still runs it)."""
    return JSONResponse({"slot": key, "cleared": table.clear(key, occupant)})


def update_slots(
    table: SlotTable, registrations: list[tuple[str, Ids]], ends: list[tuple[Ids, str | None]]
) -> Response:
    """Answer ``PUT /slots``: end the ``ended`` attempts, then register the ``slots`` (all of it, or nothing)."""
    if len(registrations) + len(ends) > MAX_PER_REQUEST:
        return _error(
            413,
            f"{len(registrations)} slots and {len(ends)} ended attempts in one request: send at most {MAX_PER_REQUEST}",
        )
    for key, _ in registrations:
        try:
            check_slot_key(key)
        except ValueError as exc:
            return _error(400, f"slot {key!r}: {exc}; nothing was changed")
    for index, (_, key) in enumerate(ends):
        if key is not None:
            try:
                check_slot_key(key)
            except ValueError as exc:
                return _error(400, f"ended[{index}]: {exc}; nothing was changed")
    try:
        table.register_many(registrations)  # first: a full table refuses the whole request
    except SlotTableFull as exc:
        return _full(exc)
    for ids, key in ends:
        table.end(*ids, key=key)
    # Rendered here, not by JSONResponse (the stdlib encoder it builds per answer): runners send this every heartbeat
    body = b'{"registered":%d,"ended":%d}' % (len(registrations), len(ends))
    return RawResponse(body, 200, raw_headers(body, 200, "application/json", {}))
