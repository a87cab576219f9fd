"""Logic every store backend shares: input validation, the rule on records' attempts, and waiting.

Backends keep their own storage; what a rollout or attempt becomes (retry policy, timeouts) is decided once, in
`agentlightning.store._lifecycle`, so the in-memory, SQLite and PostgreSQL stores (and a served store behind them)
cannot drift apart.

How records are validated at the boundary (`agentlightning.store._boundary`, which every backend goes through and
which calls the ``validate_*`` functions below). Dicts are validated; models made by validation are kept as they
are (they were validated once, when made); models made without it (``model_construct``, ``model_copy(update=...)``,
see `agentlightning._models.is_validated`) are validated again, so an unchecked record is refused by every backend
the same way. Past this boundary records are trusted (`agentlightning._fast`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import operator
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from itertools import chain
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, TypeAdapter

from agentlightning import semconv
from agentlightning._models import (
    TERMINAL_ROLLOUT_STATUSES,
    AttemptStatus,
    LLMCall,
    Resources,
    RolloutStatus,
    Span,
    _Unvalidated,  # pyright: ignore[reportPrivateUsage]
    check_json_finite,
    is_validated,
)
from agentlightning.store._base import AttemptEndedError, RolloutRequest
from agentlightning.store._span_check import CheckedSpans, spans_from_dicts

__all__ = [
    "ALL_ROLLOUT_STATUSES",
    "ChangeNotifier",
    "check_finish_status",
    "check_record_attempts",
    "check_spans_finite",
    "check_statuses",
    "judgement_batch",
    "revalidate_unchecked",
    "validate_calls",
    "validate_requests",
    "validate_resources",
    "validate_spans",
    "wait_until_finished",
]

_M = TypeVar("_M", bound=BaseModel)

ALL_ROLLOUT_STATUSES: tuple[str, ...] = get_args(RolloutStatus)
_ATTEMPT_STATUSES: tuple[str, ...] = get_args(AttemptStatus)

# A whole batch is validated in one call so the error location names the record index and field
# (e.g. ``3.span_id``); model instances pass through without being re-validated.
_SPANS = TypeAdapter(list[Span])
_CALLS = TypeAdapter(list[LLMCall])
_REQUESTS = TypeAdapter(list[RolloutRequest])
_RESOURCES = TypeAdapter(Resources)
# readers of a model's validation mark (see agentlightning._models.is_validated) and fields, for C-level passes
_fields_set = operator.attrgetter("__pydantic_fields_set__")
_values_of = operator.attrgetter("__dict__")
_start_of, _end_of = operator.itemgetter("start_time"), operator.itemgetter("end_time")
_events_of, _attributes_of = operator.itemgetter("events"), operator.itemgetter("attributes")
_LIST_ITEM_TYPES = frozenset({str, bool, int, float})


def _as_list(value: Any, what: str) -> list[Any]:
    if isinstance(value, str | bytes | dict | BaseModel) or not hasattr(value, "__iter__"):
        raise TypeError(f"{what} must be a sequence of records, got {type(value).__name__}")
    return list(value)  # pyright: ignore[reportUnknownArgumentType]


def _plain(value: Any) -> Any:
    """A model made without validation, as the plain data validation takes (nested models too)."""
    if isinstance(value, BaseModel):
        return {key: _plain(item) for key, item in value.__dict__.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}  # pyright: ignore[reportUnknownVariableType]
    return value


def _unchecked_as_data(items: list[Any], kind: type[BaseModel]) -> list[Any]:
    """``items`` with every ``kind`` model that was made without validation replaced by its plain data.

    Only the records themselves are looked at: their nested parts (span events and status, resource items) are
    validated again whenever their record is (`agentlightning._models`), so a validated record holds validated parts.
    """
    try:
        if _Unvalidated not in map(type, map(_fields_set, items)):  # is_validated for each, at C speed
            return items
    except AttributeError:  # dicts among the records: checked one by one
        pass
    for index, item in enumerate(items):
        if isinstance(item, kind) and not is_validated(item):
            items[index] = _plain(item)
    return items


def _usual_and_finite(spans: Sequence[Span]) -> bool:
    """Whether no span has events or list attributes and every float is finite: whole columns at a time, in C."""
    values = list(map(_values_of, spans))
    starts, ends = list(map(_start_of, values)), list(map(_end_of, values))
    if any(map(_events_of, values)) or not (math.isfinite(sum(starts)) and math.isfinite(sum(ends))):
        return False
    attributes = list(chain.from_iterable(map(dict.values, map(_attributes_of, values))))
    kinds = set(map(type, attributes))
    if list in kinds:  # list values (token ids, log-probs): their items, one level down
        items = list(chain.from_iterable(v for v in attributes if type(v) is list))
        item_kinds = set(map(type, items))
        if not item_kinds <= _LIST_ITEM_TYPES:  # nested lists, dicts...: checked span by span
            return False
        if float in item_kinds and not math.isfinite(sum(v for v in items if type(v) is float)):
            return False
    return float not in kinds or math.isfinite(sum(v for v in attributes if type(v) is float))


def check_spans_finite(spans: Sequence[Span]) -> None:
    """Raise a `ValueError` naming the first span field that holds NaN or Infinity.

    Validated spans cannot hold one (their models refuse non-finite floats); this catches a NaN put into a
    validated span's attributes afterwards (the dict inside a frozen model can still be changed).
    """
    if _usual_and_finite(spans):
        return
    isfinite = math.isfinite
    for index, span in enumerate(spans):
        values = span.__dict__
        # Fast path for the usual span (finite times, scalar attributes, no events); anything else is checked
        # exactly by check_json_finite, which raises naming the field.
        if isfinite(values["start_time"]) and isfinite(values["end_time"]) and not values["events"]:
            for value in values["attributes"].values():
                if (type(value) is float and not isfinite(value)) or type(value) is list:
                    break
            else:
                continue
        check_json_finite(values["start_time"], f"spans.{index}.start_time")
        check_json_finite(values["end_time"], f"spans.{index}.end_time")
        check_json_finite(values["attributes"], f"spans.{index}.attributes")
        events = [{"timestamp": e.timestamp, "attributes": e.attributes} for e in values["events"]]
        check_json_finite(events, f"spans.{index}.events")


def validate_spans(spans: Sequence[Span] | Any, check_finite: bool = True) -> Sequence[Span]:
    """Validate a batch of spans (models or dicts) as a whole (see the module docstring for what is validated).

    Args:
        spans: The batch.
        check_finite: Also check for NaN / Infinity put into a validated span afterwards (`check_spans_finite`).

    Raises:
        pydantic.ValidationError: A span is malformed (the location names its index and field).
        ValueError: A span holds NaN or Infinity.
    """
    if type(spans) is CheckedSpans:
        return spans  # checked by the fast lane from dicts it owned (finite numbers too): nothing can have changed
    items = _as_list(spans, "spans")
    kinds = set(map(type, items))
    if kinds == {dict}:
        checked = spans_from_dicts(items)  # the usual batch, by the same rules at C speed (finite numbers too)
        if checked is not None:
            return checked
    if kinds == {Span} and _Unvalidated not in map(type, map(_fields_set, items)):
        batch = items  # validated spans: what pydantic's validation would hand back (the same objects)
    else:
        batch = _SPANS.validate_python(_unchecked_as_data(items, Span))
    if check_finite:
        check_spans_finite(batch)
    return batch


def validate_calls(calls: Sequence[LLMCall] | Any) -> list[LLMCall]:
    """Validate a batch of LLM calls (models or dicts) as a whole; raises `pydantic.ValidationError`."""
    batch = _CALLS.validate_python(_unchecked_as_data(_as_list(calls, "calls"), LLMCall))
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


_ADAPTERS: dict[type[BaseModel], TypeAdapter[Any]] = {}


def revalidate_unchecked(items: Sequence[_M], kind: type[_M], what: str) -> Sequence[_M]:
    """``items`` as they are when every one was made by validation; else a list with the others validated now.

    For code past the boundary that takes records from a caller (`build_training_batch`'s transitions):
    a model made without validation (``model_construct``, ``model_copy(update=...)``) is checked there as it
    would be at a store, so what comes out never breaks the rules of its model.

    Raises:
        pydantic.ValidationError: A model made without validation breaks its rules (the location names its index).
    """
    if _Unvalidated not in map(type, map(_fields_set, items)):  # is_validated for each, at C speed
        return items
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = TypeAdapter(list[kind])  # pyright: ignore[reportInvalidTypeForm]
    return adapter.validate_python(_unchecked_as_data(_as_list(items, what), kind))


def validate_requests(requests: Sequence[RolloutRequest] | Any) -> list[RolloutRequest]:
    """Validate a batch of rollout requests (models or dicts) as a whole."""
    return _REQUESTS.validate_python(_unchecked_as_data(_as_list(requests, "requests"), RolloutRequest))


def validate_resources(resources: Resources | Any) -> Resources:
    """Validate a resources set (model or dict)."""
    if isinstance(resources, Resources) and not is_validated(resources):
        resources = _plain(resources)
    return _RESOURCES.validate_python(resources)


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


def judgement_batch(spans: Sequence[Span]) -> bool:
    """Whether every span of a non-empty batch is a judge's verdict (kind ``judge``): such a batch may be added to
    an attempt that has ended (a judge reads a rollout only once it finished)."""
    return bool(spans) and all(span.attributes.get(semconv.SPAN_KIND) == semconv.KIND_JUDGE for span in spans)


def check_record_attempts(
    pairs: Iterable[tuple[str, str]],
    status_of: Callable[[str, str], str | None],
    what: str,
    unknown: Callable[[str, str], Exception],
    ended_ok: bool = False,
) -> None:
    """The rule every backend applies to a batch of records (spans, LLM calls): each of their attempts runs now.

    ``ended_ok``: the batch holds only judge verdicts (`judgement_batch`), which annotate a finished attempt and
    so may target one that ended; the attempt must still exist.

    Called by each backend inside the transaction (or under the lock) that writes the batch, after it has read (and,
    on PostgreSQL, locked) the attempts' rows, so that a record and its attempt's end are ordered: a record either
    lands before the end or is refused. ``status_of(rollout_id, attempt_id)`` is the status read there (``None``:
    no such attempt); ``unknown`` builds the error for an attempt the store never started.

    Raises:
        NotFoundError: (from ``unknown``) an attempt the store never started.
        AttemptEndedError: an attempt whose status is no longer ``running`` (finished through the API, timed out,
            cancelled, released): a late record; nothing of the batch is to be stored.
    """
    for rollout_id, attempt_id in sorted(pairs):
        status = status_of(rollout_id, attempt_id)
        if status is None:
            raise unknown(rollout_id, attempt_id)
        if status != "running" and not ended_ok:
            raise AttemptEndedError(
                f"attempt {attempt_id!r} of rollout {rollout_id!r} already ended ({status}): {what} of an attempt "
                "that no longer runs are refused and not stored (late records never join a finished attempt)"
            )


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
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that lands as the
            # event is set, and a Ctrl-C'd run would wait on (its loop going on) instead of stopping
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await entry[1].wait()
    finally:
        notifier.unregister(entry)


def is_terminal(status: str) -> bool:
    """Whether a rollout status is final."""
    return status in TERMINAL_ROLLOUT_STATUSES
