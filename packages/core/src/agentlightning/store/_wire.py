"""Request and response bodies of the served store (``agl store serve``), shared by server and client.

Every body is a frozen pydantic model that rejects unknown fields, so the OpenAPI schema at ``/openapi.json``
describes exactly what the server accepts and a malformed request fails with a message naming the field. Ids follow
the store's one rule (`agentlightning._models.StoreId`), as at the boundary every backend goes through
(`agentlightning.store._boundary`).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import from_json

from agentlightning._fast import fast_model
from agentlightning._models import (
    Attempt,
    AttemptStatus,
    Claim,
    LLMCall,
    RequestId,
    Resources,
    Rollout,
    RolloutStatus,
    Span,
    StoreId,
)
from agentlightning.store._base import MAX_DEQUEUE_MANY, RolloutRequest
from agentlightning.store._span_check import spans_from_dicts

__all__ = [
    "API_PREFIX",
    "ATTEMPT_ENDED",
    "MAX_BATCH",
    "MAX_WAIT_SECONDS",
    "AddedResponse",
    "AttemptRef",
    "AttemptsResponse",
    "DequeueManyRequest",
    "DequeueManyResponse",
    "DequeueRequest",
    "DequeueResponse",
    "EnqueueRequest",
    "ErrorResponse",
    "FinishRequest",
    "HealthResponse",
    "HeartbeatManyRequest",
    "LLMCallsRequest",
    "LLMCallsResponse",
    "QueryRolloutsRequest",
    "RecordQuery",
    "ResourcesListResponse",
    "ResourcesQuery",
    "ResourcesResponse",
    "RolloutRef",
    "RolloutsResponse",
    "SpansRequest",
    "SpansResponse",
    "WaitRequest",
    "read_spans_request",
    "spans_request_json",
]

API_PREFIX = "/v1"
"""Every store endpoint lives under this prefix (``/healthz`` and ``/openapi.json`` do not)."""

MAX_WAIT_SECONDS = 20.0
"""Longest a single ``wait`` long-poll is held open by the server; clients loop for longer waits."""

ATTEMPT_ENDED = "attempt_ended"
"""The ``error`` of a 409 refusing records of an attempt that no longer runs (`AttemptEndedError`)."""

MAX_BATCH = 100_000
"""Most records (rollout requests, ids, spans, LLM calls) one request body may hold."""


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _no_nul(value: str | None) -> str | None:
    # No database column can hold NUL (PostgreSQL refuses it): the same rule as the store boundary's.
    if value is not None and "\x00" in value:
        raise ValueError("error must not contain NUL characters (\\x00); replace them before reporting")
    return value


class ErrorResponse(_Body):
    """Body of every 4xx/5xx answer.

    Attributes:
        error: Machine-readable kind: ``invalid``, ``not_found``, ``conflict``, ``attempt_ended`` (a 409 refusing
            records of an attempt that no longer runs), ``unauthorized``, ``forbidden``
            (a request a foreign web page could have sent: HTTP 403), ``unsupported_media_type`` (a write that is
            not ``application/json``: 415), ``too_large``, ``not_allowed``, ``storage`` (disk full or read-only
            database: HTTP 507, not worth retrying), ``unavailable`` (the database cannot be reached: HTTP 503, retried)
            or ``internal``.
        message: What was wrong, naming the offending field or id.
    """

    error: str
    message: str


class HealthResponse(_Body):
    """Body of ``GET /healthz``: ``ok`` (HTTP 200), or ``failing`` (HTTP 503) with why writes fail.

    Attributes:
        status: ``ok`` while the store can serve; ``failing`` while its database cannot be reached (PostgreSQL:
            asked on each probe), or after a write failed because the disk is full or the database is read-only
            (until a write succeeds again).
        message: What is wrong, one line (``the PostgreSQL database ... is unreachable: ...`` / ``database or disk
            is full: ...`` / ``database is read-only: ...``).
    """

    status: Literal["ok", "failing"] = "ok"
    message: str | None = None


class EnqueueRequest(_Body):
    """Rollouts to queue, in order."""

    requests: list[RolloutRequest] = Field(max_length=MAX_BATCH)


class RolloutsResponse(_Body):
    """A list of rollouts."""

    rollouts: list[Rollout]


class DequeueRequest(_Body):
    """Claim the oldest queuing rollout.

    Attributes:
        worker_id: Who claims it.
        request_id: Client-generated id; a retried request with the same id gets the same claim back
            (a SQLite store keeps the answer in the database for an hour, across restarts), so a lost answer never
            loses a claim.
    """

    worker_id: StoreId | None = None
    request_id: RequestId | None = None


class DequeueResponse(_Body):
    """The claim, or ``null`` when the queue was empty."""

    claim: Claim | None


class DequeueManyRequest(_Body):
    """Claim up to ``len(worker_ids)`` of the oldest queuing rollouts, the i-th for ``worker_ids[i]``.

    Attributes:
        worker_ids: Who claims them (one entry per idle worker; at most `MAX_DEQUEUE_MANY`).
        request_id: As in `DequeueRequest`: a retried request gets the same claims back.
    """

    worker_ids: list[StoreId | None] = Field(max_length=MAX_DEQUEUE_MANY)
    request_id: RequestId | None = None


class DequeueManyResponse(_Body):
    """The claims in queue order (fewer than asked when the queue ran short, ``[]`` when it was empty)."""

    claims: list[Claim]


class AttemptRef(_Body):
    """Names one attempt."""

    rollout_id: StoreId
    attempt_id: StoreId


class FinishRequest(_Body):
    """End an attempt with a terminal status."""

    rollout_id: StoreId
    attempt_id: StoreId
    status: AttemptStatus
    error: Annotated[str | None, AfterValidator(_no_nul)] = None


class RolloutRef(_Body):
    """Names one rollout."""

    rollout_id: StoreId


class QueryRolloutsRequest(_Body):
    """Filter rollouts by status and/or ids (``null`` means no filter)."""

    status: list[RolloutStatus] | None = None
    rollout_ids: list[StoreId] | None = None


class HeartbeatManyRequest(_Body):
    """Beat several attempts at once (a runner's running rollouts)."""

    attempts: list[AttemptRef] = Field(max_length=MAX_DEQUEUE_MANY)


class AttemptsResponse(_Body):
    """A list of attempts."""

    attempts: list[Attempt]


class WaitRequest(_Body):
    """Long-poll until the rollouts finish; the server holds the request at most `MAX_WAIT_SECONDS`."""

    rollout_ids: list[StoreId] = Field(max_length=MAX_BATCH)
    timeout: float = Field(default=MAX_WAIT_SECONDS, ge=0, le=MAX_WAIT_SECONDS)


class SpansRequest(_Body):
    """A batch of spans, validated as a whole (one bad span rejects the batch).

    Attributes:
        spans: The spans.
        request_id: Client-generated id; a retried request with the same id gets the first answer's count.
    """

    spans: list[Span] = Field(max_length=MAX_BATCH)
    request_id: RequestId | None = None


_SPANS_REQUEST_KEYS = frozenset(SpansRequest.model_fields)
_WITHOUT_DEFAULT_TAIL = {"spans": {"__all__": {"events", "status"}}}
_events_of = operator.attrgetter("events")
_status_of = operator.attrgetter("status")
_status_parts = operator.attrgetter("code", "description")


def spans_request_json(request: SpansRequest) -> bytes:
    """The JSON body of ``request``; when no span has events or a set status, without those two fields.

    They are then at their defaults: every server reads the body alike (pydantic fills them in), and the fast lane
    (`read_spans_request`) parses ~60 fewer bytes and three fewer objects per span.
    """
    spans = request.spans
    if any(map(_events_of, spans)) or set(map(_status_parts, map(_status_of, spans))) - {("unset", None)}:
        return request.__pydantic_serializer__.to_json(request)
    return request.__pydantic_serializer__.to_json(request, exclude=_WITHOUT_DEFAULT_TAIL)


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19  # 19 digits in a row: perhaps an integer past 64 bits


def _loads(body: bytes) -> Any:
    """``body`` parsed as pydantic parses it, with orjson (twice as fast) wherever the two read it alike.

    orjson reads an integer past 64 bits as a float; such an integer has 19 digits or more, so a body with a run
    of 19 digits anywhere (found by two passes in C: digits mapped to ``0``, then a substring test) is parsed by
    pydantic's own parser instead. Bodies both refuse raise ``ValueError`` either way; one orjson takes that
    pydantic's parser refuses (nesting past its depth limit) cannot be a span batch the fast lane accepts.
    """
    if _LONG_NUMBER in body.translate(_DIGITS_AS_ZERO):
        return from_json(body, allow_inf_nan=False)
    return orjson.loads(body)


def read_spans_request(body: bytes) -> SpansRequest | None:
    """The `SpansRequest` of a usual body, read without pydantic's validation; ``None`` for any other body.

    A body of the usual shape (``spans`` a list of spans that `spans_from_dicts` takes, ``request_id`` absent,
    ``null`` or 1-128 printable characters) gives the same model as ``SpansRequest.model_validate_json`` in a
    third of the time; for anything else the caller validates with the model, which decides and says why.
    """
    try:
        data: Any = _loads(body)
    except ValueError:
        return None
    if type(data) is not dict or not data.keys() <= _SPANS_REQUEST_KEYS:
        return None
    spans, request_id = data.get("spans"), data.get("request_id")
    if type(spans) is not list or len(spans) > MAX_BATCH:
        return None
    if request_id is not None and not (
        type(request_id) is str and 0 < len(request_id) <= 128 and request_id.isprintable()
    ):
        return None
    checked = spans_from_dicts(spans, owned=True)  # parsed here: ours to build the spans of
    if checked is None:
        return None
    return fast_model(SpansRequest, {"spans": checked, "request_id": request_id})


class SpansResponse(_Body):
    """A list of spans."""

    spans: list[Span]


class LLMCallsRequest(_Body):
    """A batch of LLM-proxy records, validated as a whole (``request_id`` as in `SpansRequest`)."""

    calls: list[LLMCall] = Field(max_length=MAX_BATCH)
    request_id: RequestId | None = None


class LLMCallsResponse(_Body):
    """A list of LLM calls."""

    calls: list[LLMCall]


class AddedResponse(_Body):
    """How many records of a batch were new (the rest were already stored)."""

    added: int


class RecordQuery(_Body):
    """Spans or LLM calls of a rollout, optionally of one attempt."""

    rollout_id: StoreId
    attempt_id: StoreId | None = None


class ResourcesQuery(_Body):
    """Resources by id, or the latest when ``resources_id`` is ``null``."""

    resources_id: StoreId | None = None


class ResourcesResponse(_Body):
    """Resources, or ``null`` when none are stored yet."""

    resources: Resources | None


class ResourcesListResponse(_Body):
    """Every stored resources version, oldest first."""

    resources: list[Resources]
