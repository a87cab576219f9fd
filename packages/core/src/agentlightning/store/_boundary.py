"""The validation boundary of every store backend: one wrapper, one set of rules, one refusal.

Every backend (`MemoryStore`, `SqliteStore`, `PostgresStore`, `StoreClient`) derives from `StoreBoundary`. When a
class deriving from it is defined, each protocol method it defines is wrapped by that method's guard below, so a
backend's code never checks its arguments itself and cannot drift from the others: the guard checks the arguments
by the rules of the data model (`agentlightning._models.StoreId` for every id, the record models for records; see
`agentlightning.store._common` for how records are validated once) and calls the backend with the checked values
(records validated into models, ids as given).

Bad input is refused before the backend runs, so nothing of it is kept, and always the same way: an
`InvalidRequestError` (a `ValueError`) whose message is one line naming the argument or field, e.g.
``spans.2.span_id: String should match pattern '^[0-9a-f]{16}$'`` or ``rollout_id: an id must not contain control
characters (NUL, newline, tab...), got 'a\\x00b'``. A served store's client goes through the same guards before
sending, so its refusals read the same; its server validates bodies by the same models and maps the error to 422.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter, ValidationError

from agentlightning._models import LLMCall, RequestId, Resources, Rollout, Span, StoreId
from agentlightning._server_base import describe_validation
from agentlightning.store import _common
from agentlightning.store._base import MAX_DEQUEUE_MANY, InvalidRequestError, RolloutRequest
from agentlightning.store._query import RolloutQuery, RunStatsQuery

__all__ = [
    "StoreBoundary",
    "check_error",
    "check_id",
    "check_request_id",
    "describe_validation",
    "invalid",
]

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])
_STORE_ID: TypeAdapter[str] = TypeAdapter(StoreId)
_REQUEST_ID: TypeAdapter[str] = TypeAdapter(RequestId)
_NOT_IDS = frozenset({".", ".."})
_MAX_ID = 256


def invalid(exc: Exception, prefix: str = "") -> InvalidRequestError:
    """The boundary's refusal for a validation failure (pydantic's, or a `ValueError` / `TypeError` of a rule)."""
    if isinstance(exc, InvalidRequestError):
        return exc
    if isinstance(exc, ValidationError):
        return InvalidRequestError(describe_validation(exc.errors(), prefix), errors=exc.errors())
    return InvalidRequestError(" ".join(str(exc).split()) or type(exc).__name__)


def check_id(name: str, value: Any) -> str:
    """``value`` if it is an id a store can keep (`agentlightning._models.StoreId`), else `InvalidRequestError`."""
    # The usual id (printable, short, not a dot segment) passes without pydantic; anything else is decided by the
    # model's own rule, which also says what is wrong.
    if type(value) is str and 0 < len(value) <= _MAX_ID and value.isprintable() and value not in _NOT_IDS:
        return value
    try:
        return _STORE_ID.validate_python(value)
    except ValidationError as exc:
        raise InvalidRequestError(f"{name}: {_first_message(exc)}, got {_short(value)}", errors=exc.errors()) from None


def check_request_id(value: Any) -> str:
    """A client request id (`RequestId`: 1-128 printable characters), else `InvalidRequestError`."""
    if type(value) is str and 0 < len(value) <= 128 and value.isprintable():
        return value
    try:
        return _REQUEST_ID.validate_python(value)
    except ValidationError as exc:
        message = f"request_id: {_first_message(exc)}, got {_short(value)}"
        raise InvalidRequestError(message, errors=exc.errors()) from None


def check_error(value: Any) -> str | None:
    """An attempt's ``error``: ``None`` or text without NUL (no database column can hold one)."""
    if value is None or (type(value) is str and "\x00" not in value):
        return value
    if not isinstance(value, str):
        raise InvalidRequestError(f"error must be a string or None, got {type(value).__name__}")
    raise InvalidRequestError("error must not contain NUL characters (\\x00); replace them before reporting")


def _first_message(exc: ValidationError) -> str:
    message = str(exc.errors()[0].get("msg", "invalid"))
    return message.removeprefix("Value error, ")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _optional_id(name: str, value: Any) -> str | None:
    return None if value is None else check_id(name, value)


def _ids(name: str, values: Any) -> list[str]:
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise InvalidRequestError(f"{name} must be a list of ids, got {type(values).__name__}")
    return [check_id(f"{name}.{index}", value) for index, value in enumerate(values)]


def _records(validate: Callable[..., Any], value: Any, name: str, *args: Any) -> Any:
    try:
        return validate(value, *args)
    except (ValidationError, ValueError, TypeError) as exc:
        raise invalid(exc, name) from None


def _statuses(value: Any) -> list[str] | None:
    try:
        return _common.check_statuses(value)
    except (ValueError, TypeError) as exc:
        raise invalid(exc) from None


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < 0:
        raise InvalidRequestError(f"timeout must be a non-negative number of seconds or None, got {_short(value)}")
    return value


def _query(model: type[RolloutQuery] | type[RunStatsQuery], value: Any) -> Any:
    try:
        return model.model_validate(value if value is not None else {})
    except ValidationError as exc:
        raise invalid(exc, "query") from None


# ---------------------------------------------------------------------------------------------------- the guards
# One per protocol method: the method's own signature, its arguments checked, the backend called with the results.


def _enqueue_rollouts(method: Any) -> Any:
    async def enqueue_rollouts(self: Any, requests: Sequence[RolloutRequest]) -> Any:
        return await method(self, _records(_common.validate_requests, requests, "requests"))

    return enqueue_rollouts


def _dequeue_rollout(method: Any) -> Any:
    async def dequeue_rollout(self: Any, worker_id: str | None = None, *, request_id: str | None = None) -> Any:
        worker_id = _optional_id("worker_id", worker_id)
        if request_id is None:
            return await method(self, worker_id)
        return await method(self, worker_id, request_id=check_request_id(request_id))

    return dequeue_rollout


def _dequeue_many(method: Any) -> Any:
    async def dequeue_many(self: Any, worker_ids: Sequence[str | None], *, request_id: str | None = None) -> Any:
        if isinstance(worker_ids, str | bytes) or not hasattr(worker_ids, "__iter__"):
            raise InvalidRequestError(f"worker_ids must be a list of ids or None, got {type(worker_ids).__name__}")
        workers = [_optional_id(f"worker_ids.{index}", worker) for index, worker in enumerate(worker_ids)]
        if len(workers) > MAX_DEQUEUE_MANY:
            message = f"dequeue_many claims at most {MAX_DEQUEUE_MANY} rollouts per request, got {len(workers)}"
            raise InvalidRequestError(message)
        if request_id is None:
            return await method(self, workers)
        return await method(self, workers, request_id=check_request_id(request_id))

    return dequeue_many


def _heartbeat_many(method: Any) -> Any:
    async def heartbeat_many(self: Any, attempts: Sequence[tuple[str, str]]) -> Any:
        if isinstance(attempts, str | bytes) or not hasattr(attempts, "__iter__"):
            raise InvalidRequestError(
                f"attempts must be a list of (rollout_id, attempt_id), got {type(attempts).__name__}"
            )
        refs: list[tuple[str, str]] = []
        for index, ref in enumerate(cast(Sequence[Any], attempts)):
            if not isinstance(ref, tuple | list) or len(ref) != 2:  # pyright: ignore[reportUnknownArgumentType]
                raise InvalidRequestError(
                    f"attempts.{index} must be a (rollout_id, attempt_id) pair, got {_short(ref)}"
                )
            refs.append(
                (check_id(f"attempts.{index}.rollout_id", ref[0]), check_id(f"attempts.{index}.attempt_id", ref[1]))
            )
        if len(refs) > MAX_DEQUEUE_MANY:
            raise InvalidRequestError(f"heartbeat_many takes at most {MAX_DEQUEUE_MANY} attempts, got {len(refs)}")
        return await method(self, refs)

    return heartbeat_many


def _attempt_ref(method: Any) -> Any:
    async def attempt_ref(self: Any, rollout_id: str, attempt_id: str) -> Any:
        return await method(self, check_id("rollout_id", rollout_id), check_id("attempt_id", attempt_id))

    return attempt_ref


def _rollout_ref(method: Any) -> Any:
    async def rollout_ref(self: Any, rollout_id: str) -> Any:
        return await method(self, check_id("rollout_id", rollout_id))

    return rollout_ref


def _finish_attempt(method: Any) -> Any:
    async def finish_attempt(self: Any, rollout_id: str, attempt_id: str, status: Any, error: str | None = None) -> Any:
        rollout_id, attempt_id = check_id("rollout_id", rollout_id), check_id("attempt_id", attempt_id)
        try:
            status = _common.check_finish_status(status)
        except ValueError as exc:
            raise invalid(exc) from None
        return await method(self, rollout_id, attempt_id, status, check_error(error))

    return finish_attempt


def _query_rollouts(method: Any) -> Any:
    async def query_rollouts(self: Any, status: Any = None, rollout_ids: Sequence[str] | None = None) -> Any:
        ids = None if rollout_ids is None else _ids("rollout_ids", rollout_ids)
        return await method(self, _statuses(status), ids)

    return query_rollouts


def _wait_for_rollouts(method: Any) -> Any:
    async def wait_for_rollouts(self: Any, rollout_ids: Sequence[str], timeout: float | None = None) -> Any:
        return await method(self, _ids("rollout_ids", rollout_ids), _timeout(timeout))

    return wait_for_rollouts


def _add_spans(method: Any) -> Any:
    async def add_spans(self: Any, spans: Sequence[Span], *, request_id: str | None = None) -> Any:
        batch = _records(_common.validate_spans, spans, "spans")
        if request_id is None:
            return await method(self, batch)
        return await method(self, batch, request_id=check_request_id(request_id))

    return add_spans


def _add_llm_calls(method: Any) -> Any:
    async def add_llm_calls(self: Any, calls: Sequence[LLMCall], *, request_id: str | None = None) -> Any:
        batch = _records(_common.validate_calls, calls, "calls")
        if request_id is None:
            return await method(self, batch)
        return await method(self, batch, request_id=check_request_id(request_id))

    return add_llm_calls


def _record_query(method: Any) -> Any:
    async def record_query(self: Any, rollout_id: str, attempt_id: str | None = None) -> Any:
        return await method(self, check_id("rollout_id", rollout_id), _optional_id("attempt_id", attempt_id))

    return record_query


def _add_resources(method: Any) -> Any:
    async def add_resources(self: Any, resources: Resources) -> Any:
        return await method(self, _records(_common.validate_resources, resources, "resources"))

    return add_resources


def _get_resources(method: Any) -> Any:
    async def get_resources(self: Any, resources_id: str | None = None) -> Any:
        return await method(self, _optional_id("resources_id", resources_id))

    return get_resources


def _list_rollouts(method: Any) -> Any:
    async def list_rollouts(self: Any, query: RolloutQuery | None = None) -> Any:
        return await method(self, _query(RolloutQuery, query))

    return list_rollouts


def _run_stats(method: Any) -> Any:
    async def run_stats(self: Any, query: RunStatsQuery | None = None) -> Any:
        return await method(self, _query(RunStatsQuery, query))

    return run_stats


GUARDS: dict[str, Callable[[Any], Any]] = {
    "enqueue_rollouts": _enqueue_rollouts,
    "dequeue_rollout": _dequeue_rollout,
    "dequeue_many": _dequeue_many,
    "heartbeat": _attempt_ref,
    "heartbeat_many": _heartbeat_many,
    "finish_attempt": _finish_attempt,
    "release_claim": _attempt_ref,
    "cancel_rollout": _rollout_ref,
    "get_rollout": _rollout_ref,
    "query_rollouts": _query_rollouts,
    "query_attempts": _rollout_ref,
    "wait_for_rollouts": _wait_for_rollouts,
    "add_spans": _add_spans,
    "query_spans": _record_query,
    "add_llm_calls": _add_llm_calls,
    "query_llm_calls": _record_query,
    "add_resources": _add_resources,
    "get_resources": _get_resources,
    "list_rollouts": _list_rollouts,
    "run_stats": _run_stats,
}
"""Protocol method -> its guard. Methods without arguments (``check_timeouts``, ``stats``...) need none.

A `LightningStore` method with arguments and no entry here, or an entry whose parameters differ from the method's,
fails ``packages/core/tests/test_store_guards.py``."""


def _guarded(method: _F, guard: Callable[[Any], Any]) -> _F:
    wrapped: Any = functools.wraps(method)(guard(method))
    wrapped.__agl_guarded__ = True
    return cast(_F, wrapped)


class StoreBoundary:
    """Base class of every store backend: its protocol methods are wrapped by the boundary's guards.

    Subclasses implement the protocol as usual; each method named in `GUARDS` that a subclass defines is replaced,
    when the class is created, by its guard around it (see the module docstring). Their code receives checked
    arguments: validated record models, ids that follow `StoreId`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, guard in GUARDS.items():
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "__agl_guarded__", False):
                setattr(cls, name, _guarded(method, guard))

    async def enqueue_rollout(self, input: Any = None, **fields: Any) -> Rollout:
        """Queue one rollout; ``fields`` are those of `RolloutRequest`."""
        try:
            request = RolloutRequest(input=input, **fields)
        except ValidationError as exc:
            raise invalid(exc) from None
        (rollout,) = await cast(Any, self).enqueue_rollouts([request])
        return rollout
