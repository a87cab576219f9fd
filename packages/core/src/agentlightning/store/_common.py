"""Logic every store backend shares: input validation, the retry decision, timeouts and waiting.

Backends keep their own storage; what a rollout or attempt becomes is decided here, once, so the
in-memory and SQLite stores (and a served store behind them) cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter

from agentlightning._models import (
    TERMINAL_ROLLOUT_STATUSES,
    AttemptStatus,
    LLMCall,
    Resources,
    RolloutStatus,
    Span,
    check_json_finite,
)
from agentlightning.store._base import RetryPolicy, RolloutRequest

__all__ = [
    "ALL_ROLLOUT_STATUSES",
    "ChangeNotifier",
    "check_finish_status",
    "check_id",
    "check_spans_finite",
    "check_statuses",
    "rollout_status_after",
    "timed_out_status",
    "validate_calls",
    "validate_ids",
    "validate_requests",
    "validate_resources",
    "validate_spans",
    "wait_until_finished",
]

ALL_ROLLOUT_STATUSES: tuple[str, ...] = get_args(RolloutStatus)
_ATTEMPT_STATUSES: tuple[str, ...] = get_args(AttemptStatus)

# A whole batch is validated in one call so the error location names the record index and field
# (e.g. ``3.span_id``); model instances pass through without being re-validated.
_SPANS = TypeAdapter(list[Span])
_CALLS = TypeAdapter(list[LLMCall])
_REQUESTS = TypeAdapter(list[RolloutRequest])
_RESOURCES = TypeAdapter(Resources)
_IDS = TypeAdapter(list[str])


def _as_list(value: Any, what: str) -> Any:
    if isinstance(value, str | bytes | dict | BaseModel) or not hasattr(value, "__iter__"):
        raise TypeError(f"{what} must be a sequence of records, got {type(value).__name__}")
    return list(value)


def _attributes_finite(attributes: dict[str, Any]) -> bool:
    isfinite = math.isfinite
    for value in attributes.values():
        if type(value) is float:
            if not isfinite(value):
                return False
        elif (
            type(value) is list
            and value
            and type(value[0]) is float  # pyright: ignore[reportUnknownArgumentType]
            and not all(isfinite(x) for x in value)  # pyright: ignore[reportUnknownVariableType,reportUnknownArgumentType]
        ):
            return False
    return True


def _span_finite(values: Mapping[str, Any]) -> bool:
    isfinite = math.isfinite
    if not (isfinite(values["start_time"]) and isfinite(values["end_time"])):
        return False
    if values["attributes"] and not _attributes_finite(values["attributes"]):
        return False
    return all(isfinite(e.timestamp) and _attributes_finite(e.attributes) for e in values["events"])


def check_spans_finite(spans: Sequence[Span]) -> None:
    """Raise a `ValueError` naming the first span field that holds NaN or Infinity.

    Validated spans cannot hold one (their models refuse non-finite floats); this catches spans built without
    validation (``model_construct``) before JSON would turn the number into ``null``.
    """
    for index, span in enumerate(spans):
        values = span.__dict__
        if _span_finite(values):
            continue
        fields: dict[str, Any] = {
            "start_time": values["start_time"],
            "end_time": values["end_time"],
            "attributes": values["attributes"],
            "events": [{"timestamp": e.timestamp, "attributes": e.attributes} for e in values["events"]],
        }
        for name, value in fields.items():
            check_json_finite(value, f"spans.{index}.{name}")


def validate_spans(spans: Sequence[Span] | Any) -> list[Span]:
    """Validate a batch of spans (models or dicts) as a whole.

    Raises:
        pydantic.ValidationError: A span is malformed (the location names its index and field).
        ValueError: A span built without validation holds NaN or Infinity.
    """
    batch = _SPANS.validate_python(_as_list(spans, "spans"))
    check_spans_finite(batch)
    return batch


def validate_calls(calls: Sequence[LLMCall] | Any) -> list[LLMCall]:
    """Validate a batch of LLM calls (models or dicts) as a whole; raises `pydantic.ValidationError`."""
    batch = _CALLS.validate_python(_as_list(calls, "calls"))
    for index, call in enumerate(batch):
        values = call.__dict__
        logprobs = values["response_logprobs"]
        if not (
            math.isfinite(values["start_time"]) and (values["end_time"] is None or math.isfinite(values["end_time"]))
        ):
            check_json_finite([values["start_time"], values["end_time"]], f"calls.{index}.start_time/end_time")
        if logprobs and not all(math.isfinite(x) for x in logprobs):
            check_json_finite(logprobs, f"calls.{index}.response_logprobs")
    return batch


def validate_requests(requests: Sequence[RolloutRequest] | Any) -> list[RolloutRequest]:
    """Validate a batch of rollout requests (models or dicts) as a whole."""
    return _REQUESTS.validate_python(_as_list(requests, "requests"))


def validate_resources(resources: Resources | Any) -> Resources:
    """Validate a resources set (model or dict)."""
    return _RESOURCES.validate_python(resources)


def validate_ids(ids: Sequence[str] | Any, what: str) -> list[str]:
    """Validate a list of ids (each a non-empty string)."""
    values = _IDS.validate_python(_as_list(ids, what))
    for value in values:
        check_id(what, value)
    return values


def check_id(name: str, value: Any) -> str:
    """Return ``value`` if it is a non-empty string, else raise a `ValueError` naming the argument."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def check_finish_status(status: Any) -> AttemptStatus:
    """An attempt can only be finished with a terminal attempt status."""
    if status not in _ATTEMPT_STATUSES or status == "running":
        allowed = ", ".join(s for s in _ATTEMPT_STATUSES if s != "running")
        raise ValueError(f"cannot finish an attempt with status {status!r}; expected one of: {allowed}")
    return status


def check_statuses(statuses: Sequence[str] | None) -> list[str] | None:
    """Validate a rollout status filter."""
    if statuses is None:
        return None
    values = list(_as_list(statuses, "status"))
    for status in values:
        if status not in ALL_ROLLOUT_STATUSES:
            raise ValueError(f"unknown rollout status {status!r}; expected one of: {', '.join(ALL_ROLLOUT_STATUSES)}")
    return values


def rollout_status_after(policy: RetryPolicy, attempt_status: AttemptStatus, attempt_sequence: int) -> RolloutStatus:
    """What a rollout becomes when its attempt number ``attempt_sequence`` ends with ``attempt_status``.

    ``queuing`` means the rollout goes back to the queue for another attempt.
    """
    if attempt_status == "succeeded":
        return "succeeded"
    if attempt_status in policy.retry_on and attempt_sequence < policy.max_attempts:
        return "queuing"
    if attempt_status == "cancelled":
        return "cancelled"
    return "failed"


def timed_out_status(policy: RetryPolicy, start_time: float, last_heartbeat: float, at: float) -> AttemptStatus | None:
    """``timeout`` or ``unresponsive`` if a running attempt has run or stayed silent too long, else ``None``."""
    if policy.rollout_timeout is not None and at - start_time > policy.rollout_timeout:
        return "timeout"
    if at - last_heartbeat > policy.heartbeat_timeout:
        return "unresponsive"
    return None


class ChangeNotifier:
    """Wakes waiters (in any thread or event loop) when a rollout reaches a terminal status."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def register(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Event]:
        """Create an event that `notify` will set; pair with `unregister`."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(entry)
        return entry

    def unregister(self, entry: tuple[asyncio.AbstractEventLoop, asyncio.Event]) -> None:
        """Forget a waiter."""
        with self._lock:
            self._waiters.discard(entry)

    def notify(self) -> None:
        """Set every registered event, thread-safely."""
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            if loop.is_closed():
                continue
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # loop closed between the check and the call
                continue


async def wait_until_finished(
    notifier: ChangeNotifier,
    poll: Callable[[], Awaitable[tuple[list[Any], bool]]],
    timeout: float | None,
    poll_interval: float,
) -> list[Any]:
    """Call ``poll`` until it reports all done or ``timeout`` passes; returns its last finished list.

    ``poll`` returns ``(finished, all_done)``. In-process changes wake the waiter at once through
    ``notifier``; ``poll_interval`` bounds the delay for changes made elsewhere (other processes, timeouts).
    """
    if timeout is not None and (math.isnan(timeout) or timeout < 0):
        raise ValueError(f"timeout must be a non-negative number of seconds or None, got {timeout!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    entry = notifier.register()
    try:
        while True:
            entry[1].clear()
            finished, done = await poll()
            if done:
                return finished
            wait = poll_interval
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return finished
                wait = min(wait, remaining)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry[1].wait(), wait)
    finally:
        notifier.unregister(entry)


def is_terminal(status: str) -> bool:
    """Whether a rollout status is final."""
    return status in TERMINAL_ROLLOUT_STATUSES
