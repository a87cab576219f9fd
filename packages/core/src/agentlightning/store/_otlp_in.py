"""OTLP in: the served store takes OpenTelemetry traces over OTLP/HTTP (``POST /v1/traces``, protobuf or JSON).

An agent in any language, instrumented with any OpenTelemetry SDK, sends its spans here with no line of our code:
its runner (`agentlightning.runner.CommandAgent`) sets ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` to this route,
``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` to the attempt's own credential (`agentlightning._otlp_auth`) and
``OTEL_RESOURCE_ATTRIBUTES`` to ``agentlightning.rollout_id=...,agentlightning.attempt_id=...``.

Each span becomes a store `Span` of the attempt its resource names, mapped as the Python span sources are
(`agentlightning.tracing._genai`): ``gen_ai.operation.name`` ``chat`` / ``text_completion`` is an LLM call (joined
to the proxy's token ids by ``gen_ai.response.id``), ``invoke_agent`` an agent (``gen_ai.agent.name``),
``execute_tool`` a tool (``gen_ai.tool.name``), as are OpenLLMetry's ``traceloop.span.kind`` spans; a span with a
numeric ``agentlightning.reward.value`` is a reward (``agentlightning.reward.final``: the episode's final one).

Refused, nothing stored: a body that does not parse (400), names no attempt in its resource (400), holds no span
(400), is over the server's body limit (413), comes without a credential (401), or with an attempt's credential
but spans of another attempt (403); spans of an attempt that does not exist (404) or no longer runs (409).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from pydantic import ValidationError

from agentlightning import semconv
from agentlightning._models import Span
from agentlightning._otlp_auth import OTLP_CREDENTIAL_PREFIX, attempt_of_credential
from agentlightning._routing import Route
from agentlightning._server_base import describe_validation
from agentlightning.store._base import LightningStore
from agentlightning.tracing import _genai

__all__ = ["OTLP_AUTH", "OTLP_PATH", "OtlpError", "OtlpRequest", "otlp_routes", "spans_from_otlp"]

OTLP_PATH = "/v1/traces"
"""The OTLP/HTTP traces path (what SDKs append to ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
OTLP_AUTH = "otlp"
"""The route's auth rule: the store's token, or an attempt's OTLP credential (the body is then checked)."""
SOURCE_NAME = "otlp"
"""``agentlightning.span.source`` (and ``agentlightning.adapter``) of spans that came in over OTLP."""
_INSTALL = 'pip install "agentlightning-core[otlp]"'


class OtlpError(Exception):
    """A refused OTLP body: its HTTP status and one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class OtlpRequest(NamedTuple):
    """What the OTLP route's handler gets: the ``Authorization`` header and the raw body."""

    authorization: str | None
    body: bytes


def credential_attempt(token: str, authorization: str | None) -> tuple[str, str] | None:
    """The attempt an ``Authorization: Bearer agl-otlp...`` header is good for (``None``: not such a credential)."""
    if not authorization:
        return None
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip().startswith(OTLP_CREDENTIAL_PREFIX):
        return None
    return attempt_of_credential(token, given.strip())


# ---------------------------------------------------------------------------------------------- decoding
def _value(any_value: Mapping[str, Any]) -> Any:
    """An OTLP ``AnyValue`` (as a JSON-shaped dict) as an attribute value of ours."""
    if "stringValue" in any_value:
        return str(any_value["stringValue"])
    if "boolValue" in any_value:
        return bool(any_value["boolValue"])
    if "intValue" in any_value:
        return int(any_value["intValue"])  # JSON carries 64-bit integers as strings
    if "doubleValue" in any_value:
        return float(any_value["doubleValue"])  # "NaN" / "Infinity" as text in JSON: dropped by `_attributes`
    if "bytesValue" in any_value:
        return str(any_value["bytesValue"])  # base64 already
    if "arrayValue" in any_value:
        items = [_value(item) for item in any_value["arrayValue"].get("values", [])]
        kinds = {type(item) for item in items}
        return items if len(kinds) <= 1 and not kinds & {list, dict} else [json.dumps(item) for item in items]
    if "kvlistValue" in any_value:
        return json.dumps(_attributes(any_value["kvlistValue"].get("values", [])))
    return None


def _attributes(pairs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        value = _value(pair.get("value") or {})
        if value is not None and not (isinstance(value, float) and not math.isfinite(value)):
            out[str(pair["key"])] = value
    return out


def _hex_id(value: Any, size: int) -> str | None:
    """A trace or span id as lower-case hex: JSON sends hex, protobuf bytes (``MessageToDict``: base64)."""
    if not value:
        return None
    text = str(value)
    if len(text) == 2 * size and all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise OtlpError(400, f"malformed OTLP id {text!r}") from None
    if len(raw) != size:
        raise OtlpError(400, f"malformed OTLP id {text!r}")
    return raw.hex()


def _decode(body: bytes) -> dict[str, Any]:
    """The body as OTLP/JSON's shape; protobuf is recognised by its first byte (JSON starts with ``{``)."""
    if not body.strip():
        raise OtlpError(400, "empty OTLP body: no spans")
    if body.lstrip()[:1] == b"{":
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise OtlpError(400, f"malformed OTLP/JSON body: {exc}") from None
        if not isinstance(data, dict):
            raise OtlpError(400, "an OTLP/JSON body is an object with resourceSpans")
        return data  # pyright: ignore[reportUnknownVariableType]
    try:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError:
        raise OtlpError(415, f"OTLP protobuf bodies need opentelemetry-proto on the store server: {_INSTALL}") from None
    try:
        message = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise OtlpError(400, f"malformed OTLP protobuf body: {exc}") from None
    return MessageToDict(message)


def _kind(attributes: dict[str, Any]) -> None:
    """Our span kind from the span's GenAI (or OpenLLMetry) attributes, and rewards, as the span sources map them."""
    if attributes.get(semconv.SPAN_KIND) is not None:
        return  # an agent that writes our conventions itself
    reward = attributes.get(semconv.REWARD_VALUE)
    if isinstance(reward, int | float) and not isinstance(reward, bool):
        attributes[semconv.SPAN_KIND] = semconv.KIND_REWARD
        return
    attributes[semconv.SPAN_SOURCE] = attributes[semconv.ADAPTER_NAME] = SOURCE_NAME
    _genai.source_attributes(attributes)


def _span(raw: Mapping[str, Any], ids: tuple[str, str], sequence: int) -> Span:
    attributes = _attributes(raw.get("attributes", []))
    attributes[semconv.ROLLOUT_ID], attributes[semconv.ATTEMPT_ID] = ids
    _kind(attributes)
    status: Mapping[str, Any] = raw.get("status") or {}
    codes: dict[Any, str] = {"STATUS_CODE_OK": "ok", "STATUS_CODE_ERROR": "error", 1: "ok", 2: "error"}
    code = codes.get(status.get("code"), "unset")
    start = int(raw.get("startTimeUnixNano", 0)) / 1e9
    end = max(int(raw.get("endTimeUnixNano", 0)) / 1e9, start)
    events = [
        {
            "name": str(event.get("name", "")),
            "timestamp": int(event.get("timeUnixNano", 0)) / 1e9,
            "attributes": _attributes(event.get("attributes", [])),
        }
        for event in raw.get("events", [])
    ]
    return Span.model_validate(
        {
            "rollout_id": ids[0],
            "attempt_id": ids[1],
            "sequence_id": sequence,
            "trace_id": _hex_id(raw.get("traceId"), 16),
            "span_id": _hex_id(raw.get("spanId"), 8),
            "parent_id": _hex_id(raw.get("parentSpanId"), 8),
            "name": str(raw.get("name", "")),
            "start_time": start,
            "end_time": end,
            "attributes": attributes,
            "events": events,
            "status": {"code": code, "description": status.get("message") or None},
        }
    )


def spans_from_otlp(body: bytes, allowed: tuple[str, str] | None) -> list[Span]:
    """The store spans of an OTLP body; ``allowed``: the one attempt its credential may write (``None``: any).

    Raises:
        OtlpError: The body is refused (see the module docstring); nothing of it is to be stored.
    """
    data = _decode(body)
    spans: list[Span] = []
    try:
        for resource_spans in data.get("resourceSpans", []):
            resource = _attributes((resource_spans.get("resource") or {}).get("attributes", []))
            rollout_id, attempt_id = resource.get(semconv.ROLLOUT_ID), resource.get(semconv.ATTEMPT_ID)
            if not (isinstance(rollout_id, str) and rollout_id and isinstance(attempt_id, str) and attempt_id):
                raise OtlpError(
                    400,
                    f"a resource names no attempt: its attributes need {semconv.ROLLOUT_ID} and {semconv.ATTEMPT_ID} "
                    "(the runner sets them in OTEL_RESOURCE_ATTRIBUTES)",
                )
            if allowed is not None and (rollout_id, attempt_id) != allowed:
                raise OtlpError(
                    403,
                    f"spans of attempt {attempt_id} of rollout {rollout_id} sent with the credential of attempt "
                    f"{allowed[1]} of rollout {allowed[0]}: an agent writes only its own attempt",
                )
            raws = [raw for scope in resource_spans.get("scopeSpans", []) for raw in scope.get("spans", [])]
            raws.sort(key=lambda raw: int(raw.get("startTimeUnixNano", 0)))
            spans.extend(_span(raw, (rollout_id, attempt_id), i) for i, raw in enumerate(raws))
    except ValidationError as exc:
        raise OtlpError(400, f"invalid span: {describe_validation(exc.errors())}") from None
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise OtlpError(400, f"malformed OTLP body: {exc!r}") from None
    if not spans:
        raise OtlpError(400, "the OTLP body holds no span")
    return spans


def otlp_routes(store: LightningStore, token: str) -> list[Route]:
    """``POST /v1/traces`` over ``store``; ``token`` is the store's (it keys the attempts' credentials)."""
    from starlette.responses import Response

    from agentlightning.store._asgi import error_bytes

    async def traces(request: OtlpRequest) -> Any:
        try:
            spans = spans_from_otlp(request.body, credential_attempt(token, request.authorization))
        except OtlpError as exc:
            return exc.status, error_bytes("invalid" if exc.status < 403 else "forbidden", str(exc))
        await store.add_spans(spans)  # one batch: a refused attempt stores none of it
        if request.body.lstrip()[:1] == b"{":
            return b"{}"
        return Response(b"", media_type="application/x-protobuf")  # an empty ExportTraceServiceResponse

    return [
        Route(
            "POST",
            OTLP_PATH,
            traces,
            "otlp_traces",
            "OpenTelemetry traces over OTLP/HTTP (protobuf or JSON), each resource naming its attempt "
            f"({semconv.ROLLOUT_ID}, {semconv.ATTEMPT_ID}); the store's token or the attempt's OTLP credential.",
            errors={403: "spans of another attempt than the credential's", 404: "unknown attempt", 409: "ended"},
            tags=("records",),
            auth=OTLP_AUTH,
        )
    ]
