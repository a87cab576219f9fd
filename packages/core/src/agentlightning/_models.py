"""The data model every package shares: rollouts, attempts, spans, LLM calls, resources (transitions and training
samples: `agentlightning._training_models`).

All models are pydantic v2, frozen, and reject unknown fields so a malformed record fails with an error
that names the offending field instead of being stored half-right.

The validation rule: every record entering a store has been validated by pydantic exactly once. A model made by
validation (``Span(...)``, ``Span.model_validate(...)``) counts as validated; a model made without it
(``model_construct``, ``model_copy(update=...)``) is marked, and the store boundary (`agentlightning.store`)
validates it again. Past the boundary, code that builds models from known-good data does so through
`agentlightning._fast`, the one module allowed to skip validation.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from agentlightning._finite import check_json_finite
from agentlightning._urls import rollout_base_url

__all__ = [
    "MAX_ID_LENGTH",
    "TERMINAL_ATTEMPT_STATUSES",
    "TERMINAL_ROLLOUT_STATUSES",
    "Attempt",
    "AttemptStatus",
    "AttributeValue",
    "Claim",
    "LLMCall",
    "LLMResource",
    "PromptTemplateResource",
    "RequestId",
    "Resource",
    "Resources",
    "Rollout",
    "RolloutMode",
    "RolloutStatus",
    "Span",
    "SpanEvent",
    "SpanStatus",
    "SpanStatusCode",
    "StoreId",
    "ValueResource",
    "check_json_finite",
    "new_id",
    "now",
]

RolloutStatus = Literal["queuing", "running", "succeeded", "failed", "cancelled"]
"""queuing -> running -> succeeded | failed | cancelled; a failed attempt with retries left sends it back to queuing."""

AttemptStatus = Literal["running", "succeeded", "failed", "timeout", "unresponsive", "cancelled"]
"""`timeout`: ran past the rollout timeout; `unresponsive`: stopped heartbeating."""

RolloutMode = Literal["train", "val", "test"]
SpanStatusCode = Literal["unset", "ok", "error"]

TERMINAL_ROLLOUT_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
TERMINAL_ATTEMPT_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "timeout", "unresponsive", "cancelled"})

AttributeValue = str | bool | int | float | list[str] | list[bool] | list[int] | list[float] | None
"""OpenTelemetry attribute values (scalars or homogeneous lists)."""


_ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"
"""Client-assigned ids: any printable text (control characters such as NUL are rejected)."""

MAX_ID_LENGTH = 256
"""Longest id a store accepts (the served store's routes and the dashboard's filters take no longer)."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _printable(value: str) -> str:
    # NUL and the other control characters: PostgreSQL cannot store NUL, and logs, terminals and URLs mangle them.
    if not value.isprintable() and _CONTROL.search(value) is not None:  # isprintable: the usual id, at C speed
        raise ValueError("an id must not contain control characters (NUL, newline, tab...)")
    return value


def _routable(value: str) -> str:
    # ``.`` and ``..`` are dot segments: HTTP clients and browsers resolve them away, so no URL can name such a
    # rollout (``/v1/rollouts/..`` becomes ``/v1/``). Every other printable id survives percent-encoding.
    if value in (".", ".."):
        raise ValueError(f"an id cannot be {value!r}: no URL can carry it (a client resolves it as a path segment)")
    return _printable(value)


StoreId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ID_LENGTH, json_schema_extra={"pattern": _ID_PATTERN}),
    AfterValidator(_routable),
]
"""The one rule for every id a store is given (rollout, attempt, group, resources, call, worker): 1-256 printable
characters, not ``.`` or ``..``. Refused by every backend, in records and in arguments alike (the store boundary,
`agentlightning.store`), so whatever a store holds the HTTP API and the dashboard can name."""

RequestId = Annotated[
    str, Field(min_length=1, max_length=128, json_schema_extra={"pattern": _ID_PATTERN}), AfterValidator(_printable)
]
"""A client's request id (what makes a retried store request answer as the first one): 1-128 printable characters."""


def new_id(prefix: str) -> str:
    """Return a fresh random id such as ``ro-3f2a...`` (prefix + 32 hex chars)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> float:
    """Wall-clock time in seconds since the epoch (the unit used by every timestamp in the model)."""
    return time.time()


class _Unvalidated(set[str]):
    """The ``__pydantic_fields_set__`` of a model made without validation (see `is_validated`)."""

    __slots__ = ()


def is_validated(model: BaseModel) -> bool:
    """Whether ``model`` (not the models inside it) was made by pydantic validation or by `agentlightning._fast`.

    ``False`` for a model made by ``model_construct`` or ``model_copy(update=...)``: pydantic checks neither, so
    the store boundary validates such a model again before keeping it.
    """
    return type(model.__pydantic_fields_set__) is not _Unvalidated


def _mark_unvalidated(model: BaseModel) -> None:
    object.__setattr__(model, "__pydantic_fields_set__", _Unvalidated(model.__pydantic_fields_set__))


class RecordModel(BaseModel):
    """Base of every record model: frozen, no unknown fields, no NaN/Infinity; unvalidated copies are marked.

    Core-internal (not exported): request models of the store subclass it too, so the boundary treats them alike.
    """

    # Non-finite floats are refused on every typed field: JSON would turn them into null (see check_json_finite).
    # Serialised as the constants NaN / Infinity rather than null, so that one that slipped past validation
    # is refused by the next validation instead of silently becoming null.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, ser_json_inf_nan="constants")

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:
        """Pydantic's construction without validation; the result is marked, so a store validates it (`is_validated`).

        Args:
            _fields_set: As in pydantic.
            **values: The fields, unchecked.
        """
        model = super().model_construct(_fields_set, **values)
        _mark_unvalidated(model)
        return model

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Pydantic's copy; with ``update`` (which pydantic does not validate) the copy is marked as unvalidated.

        Args:
            update: Fields to change, unchecked.
            deep: Copy nested values too.
        """
        copied = super().model_copy(update=update, deep=deep)
        if update:
            _mark_unvalidated(copied)
        return copied


class _NestedRecord(RecordModel):
    """A model that lives inside another record (span events and status, resource items).

    Validated again whenever its parent is validated, so a record made by validation never holds a part made
    without it (pydantic keeps model instances as they are by default); the store boundary then only needs to
    look at the record itself (`is_validated`).
    """

    model_config = ConfigDict(revalidate_instances="always")


class Rollout(RecordModel):
    """One task to run the agent on, and where it stands.

    Attributes:
        rollout_id: Client-assigned or generated id; enqueueing the same id twice is a no-op.
        input: The task, any JSON value; passed to the agent as is.
        status: Position in the status machine.
        mode: Whether the rollout is for training, validation or test.
        group_id: Rollouts of the same task share a group (GRPO normalises within it).
        resources_id: Resources the rollout must run with; ``None`` means the latest.
        retry_count: How many attempts were started beyond the first.
        created_at: Enqueue time.
        updated_at: Last status change.
        metadata: Free-form user data.
    """

    rollout_id: StoreId
    input: Any = None
    status: RolloutStatus = "queuing"
    mode: RolloutMode | None = None
    group_id: StoreId | None = None
    resources_id: StoreId | None = None
    retry_count: int = Field(default=0, ge=0)
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("input", "metadata")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        return check_json_finite(value, info.field_name or "value")


class Attempt(RecordModel):
    """One try at running a rollout, by one worker.

    Attributes:
        rollout_id: The rollout this attempt belongs to.
        attempt_id: Unique id of the attempt.
        sequence: 1 for the first attempt of a rollout, 2 for the first retry, ...
        worker_id: Who runs it (free-form, e.g. ``host:pid:index``).
        status: ``running`` until finished, timed out or found unresponsive.
        start_time: When the attempt was started.
        end_time: When it reached a terminal status.
        last_heartbeat: Last sign of life from the worker.
        error: A message for failed attempts.
    """

    rollout_id: str
    attempt_id: str
    sequence: int = Field(ge=1)
    worker_id: str | None = None
    status: AttemptStatus = "running"
    start_time: float = Field(default_factory=now)
    end_time: float | None = None
    last_heartbeat: float = Field(default_factory=now)
    error: str | None = None


class Claim(RecordModel):
    """What ``dequeue_rollout`` hands a worker: the rollout and the attempt just started for it."""

    rollout: Rollout
    attempt: Attempt


class SpanEvent(_NestedRecord):
    """A timestamped event inside a span (e.g. an exception with its traceback)."""

    name: str
    timestamp: float
    attributes: dict[str, AttributeValue] = Field(default_factory=dict)


class SpanStatus(_NestedRecord):
    """OpenTelemetry span status."""

    code: SpanStatusCode = "unset"
    description: str | None = None


class Span(RecordModel):
    """An OpenTelemetry-shaped span, tagged with the rollout and attempt it belongs to.

    Attributes:
        rollout_id: Rollout the span was recorded in.
        attempt_id: Attempt the span was recorded in.
        sequence_id: Per-attempt sequence number assigned when the span started (orders spans without clocks).
        trace_id: 32 hex chars.
        span_id: 16 hex chars; unique within (rollout_id, attempt_id). Re-adding it is a no-op.
        parent_id: 16 hex chars of the parent span, or ``None`` for a root.
        name: Span name.
        start_time: Seconds since the epoch.
        end_time: Seconds since the epoch (``>= start_time``).
        attributes: OpenTelemetry attributes (``gen_ai.*`` and ``agentlightning.*``).
        events: Span events.
        status: Span status.
    """

    rollout_id: StoreId
    attempt_id: StoreId
    sequence_id: int = Field(ge=0)
    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    parent_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    name: str
    start_time: float
    end_time: float
    attributes: dict[str, AttributeValue] = Field(default_factory=dict)
    events: list[SpanEvent] = Field(default_factory=list)
    status: SpanStatus = Field(default_factory=SpanStatus)

    @model_validator(mode="after")
    def _check_times(self) -> Span:
        if self.end_time < self.start_time:
            raise ValueError(f"end_time ({self.end_time}) is before start_time ({self.start_time})")
        return self


class LLMCall(RecordModel):
    """One request through the LLM proxy, with the exact token ids the backend produced.

    Attributes:
        call_id: Unique id (client-assigned; re-adding is a no-op).
        rollout_id: Rollout the request was made for (from the proxy URL).
        attempt_id: Attempt the request was made for.
        response_id: The ``id`` of the OpenAI response; adapters' LLM spans carry it as
            ``gen_ai.response.id`` and that is how spans join to calls.
        request: The request body as the agent sent it.
        response: The response body as returned to the agent (for streams: the assembled response).
        prompt_token_ids: Token ids of the full prompt as the backend tokenised it.
        response_token_ids: Token ids the backend generated.
        response_logprobs: Log-probability of each generated token (same length as ``response_token_ids``).
        model: Model name used by the backend.
        model_version: Version of the weights that generated the response, as the backend reported it (or, for a
            backend that reports none, the version the proxy was told when it admitted the request); ``None`` when
            unknown. Never a resources version.
        backend: Which backend served it.
        start_time: When the proxy received the request.
        end_time: When the proxy finished answering.
        error: Backend error, if the call failed.
        policy: The policy that served it (a LoRA adapter's name, or ``frozen`` for the base model), when the proxy
            routes calls by agent (`agentlightning.PolicyMap`); ``None`` otherwise.
        agent_name: The agent that made it, as the agent header named it (``None``: not named).
    """

    call_id: StoreId
    rollout_id: StoreId
    attempt_id: StoreId
    response_id: str | None = None
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)
    response_token_ids: list[int] = Field(default_factory=list)
    response_logprobs: list[float] | None = None
    model: str | None = None
    model_version: int | None = Field(default=None, ge=0)
    backend: str | None = None
    start_time: float = Field(default_factory=now)
    end_time: float | None = None
    error: str | None = None
    policy: str | None = None
    agent_name: str | None = None

    @field_validator("request", "response")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        return check_json_finite(value, info.field_name or "value")

    @model_validator(mode="after")
    def _check_logprobs(self) -> LLMCall:
        if self.response_logprobs is not None and len(self.response_logprobs) != len(self.response_token_ids):
            raise ValueError(
                f"response_logprobs has {len(self.response_logprobs)} entries "
                f"but response_token_ids has {len(self.response_token_ids)}"
            )
        return self


class LLMResource(_NestedRecord):
    """The model endpoint agents call (normally the LLM proxy) and the model version it serves.

    Attributes:
        endpoint: The proxy's address as agents reach it (``http://trainer:4748``).
        model: The model name to request.
        sampling_parameters: Keyword arguments for the agent's model client (temperature, max_tokens...).
        api_key: The bearer token the endpoint needs (a proxy started with a token); agents pass it as their
            OpenAI ``api_key``. ``None`` when the endpoint needs none.
        runner_token: The proxy's runner token (`agentlightning.proxy.LLMProxy.runner_token`), for runners only:
            with it a runner registers its slots' stable URLs and reports attempts' ends (late calls are then
            refused). Runners hand agents the resource without it. ``None``: agents get per-rollout URLs.
    """

    kind: Literal["llm"] = "llm"
    endpoint: str
    model: str
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)
    api_key: str | None = None
    runner_token: str | None = Field(default=None, repr=False)

    @field_validator("sampling_parameters")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        return check_json_finite(value, info.field_name or "value")

    def base_url(self, rollout_id: str, attempt_id: str) -> str:
        """Per-rollout base URL on the proxy: ``{endpoint}/rollout/{rollout_id}/attempt/{attempt_id}/v1``.

        Both ids are percent-encoded (see `agentlightning.proxy.rollout_base_url`), so any id the store accepts
        gives a URL the proxy routes back to the same ids.
        """
        return rollout_base_url(self.endpoint, rollout_id, attempt_id)


class PromptTemplateResource(_NestedRecord):
    """A prompt template the agent formats (``str.format`` style by default)."""

    kind: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["format", "jinja"] = "format"


class ValueResource(_NestedRecord):
    """Any JSON value the user wants versioned with the rest."""

    kind: Literal["value"] = "value"
    value: Any = None

    @field_validator("value")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        return check_json_finite(value, info.field_name or "value")


Resource = Annotated[LLMResource | PromptTemplateResource | ValueResource, Field(discriminator="kind")]


class Resources(RecordModel):
    """A named, versioned set of resources handed to every rollout.

    Attributes:
        resources_id: Unique id; adding the same id twice is a no-op.
        version: Monotonic version assigned by the store (0 before it is stored).
        items: Resources by name, e.g. ``{"llm": LLMResource(...), "system_prompt": PromptTemplateResource(...)}``.
        created_at: When it was created.
    """

    resources_id: StoreId
    version: int = Field(default=0, ge=0)
    items: dict[str, Resource] = Field(default_factory=dict)
    created_at: float = Field(default_factory=now)

    @property
    def llm(self) -> LLMResource | None:
        """The first LLM resource (usually named ``llm``), if any."""
        main = self.items.get("llm")
        if isinstance(main, LLMResource):
            return main
        for item in self.items.values():
            if isinstance(item, LLMResource):
                return item
        return None
