"""Spans of other GenAI instrumentations (OpenLLMetry, OpenTelemetry's ``openai-v2``) read as our spans.

An app already instrumented with one of them emits an OpenTelemetry span per LLM call (``gen_ai.*`` attributes,
OpenLLMetry's ``llm.*`` / ``traceloop.*`` ones in older releases), plus agent, workflow and tool spans where the
framework has them. When such a *span source* is in use (`agentlightning.adapters` registers it here), the span
processor maps its spans onto our conventions:

- at start (the span is still writable; only what the start attributes tell): ``agentlightning.adapter`` is set to
  the source's name and, for an LLM call, ``agentlightning.span.kind=llm``, so the openai client relay can hand it a
  response id its instrumentation does not record (the OpenAI Agents instrumentation with a chat-completions model);
- when converted for the store (`source_attributes`, in the writer thread): the kind, agent name and tool name from
  the final attributes.

Nothing here imports an instrumentation package: spans are recognised by their instrumentation scope name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.trace import SpanKind

from agentlightning import semconv

__all__ = [
    "SourceRegistration",
    "by_scope",
    "client_calls_recorded",
    "is_source_span",
    "live_agent_name",
    "mark_end",
    "mark_start",
    "register_source",
    "source_attributes",
    "source_in_use",
    "unregister_source",
]

# gen_ai.operation.name values of an LLM call (chat, text completion; Gemini-style generate_content).
_LLM_OPERATIONS = frozenset({"chat", "text_completion", "completion", "generate_content"})
# OpenLLMetry's pre-gen_ai name of the call type.
_LLM_REQUEST_TYPE = "llm.request.type"
_TRACELOOP_KIND = "traceloop.span.kind"
_TRACELOOP_ENTITY = "traceloop.entity.name"
# OpenLLMetry's LangChain instrumentation copies LangChain's run metadata onto its spans: a LangGraph node's own task
# span is the one whose entity is the node itself (a function the node calls is a task of another name).
LANGGRAPH_NODE = "traceloop.association.properties.langgraph_node"


class SourceRegistration:
    """One registered span source: its name (written as ``agentlightning.adapter``) and when to stand aside.

    Args:
        name: The source's adapter name (e.g. ``"openllmetry_langchain"``).
        suppressed: Returns ``True`` while its spans must not be mapped (our own adapter for the same calls was
            instrumented explicitly: one span per call, and ours wins).
        client: It records every ``openai`` client call (so our client hook need not record one).
        on_llm_start: Called with each of its LLM spans as it starts (a framework source whose LLM span is not the
            current span registers it for our client hook, as our framework adapters do).
        on_llm_end: Called with each of its LLM spans as it ends.
        agent_attribute: The attribute (or attributes: the first one set wins) its live spans name their agent in,
            set after they start (so the processor's start hook does not see it): read by `live_agent_name` for the
            agent header of a call made inside one.
    """

    __slots__ = ("agent_attribute", "client", "name", "on_llm_end", "on_llm_start", "suppressed")

    def __init__(
        self,
        name: str,
        suppressed: Callable[[], bool],
        client: bool = False,
        on_llm_start: Callable[[SdkSpan], None] | None = None,
        on_llm_end: Callable[[Any], None] | None = None,
        agent_attribute: str | tuple[str, ...] | None = None,
    ) -> None:
        self.name = name
        self.agent_attribute: tuple[str, ...] = (
            (agent_attribute,) if isinstance(agent_attribute, str) else tuple(agent_attribute or ())
        )
        self.suppressed = suppressed
        self.client = client
        self.on_llm_start = on_llm_start
        self.on_llm_end = on_llm_end


by_scope: dict[str, SourceRegistration] = {}
"""Instrumentation scope name -> source. Empty unless a source is in use: the processor checks it first."""
# A one-element list, not a rebindable global: a ``from _genai import ...`` of a bool would copy a stale value.
# Read through `source_in_use`.
_registered_once: list[bool] = [False]


def source_in_use() -> bool:
    """Whether a span source was registered once in this process.

    Stays ``True`` after `unregister_source`: spans it marked may still be waiting for conversion in the writer.
    """
    return _registered_once[0]


def register_source(scopes: tuple[str, ...], registration: SourceRegistration) -> None:
    """Map spans of these instrumentation scopes from now on (idempotent)."""
    for scope in scopes:
        by_scope[scope] = registration
    _registered_once[0] = True


def unregister_source(scopes: tuple[str, ...], name: str) -> None:
    """Stop mapping spans of these scopes (spans already started keep what they were given)."""
    for scope in scopes:
        if (found := by_scope.get(scope)) is not None and found.name == name:
            del by_scope[scope]


def _kind(attrs: Mapping[str, Any]) -> str | None:
    operation = attrs.get(semconv.GEN_AI_OPERATION)
    if operation in _LLM_OPERATIONS or attrs.get(_LLM_REQUEST_TYPE) in ("chat", "completion"):
        return semconv.KIND_LLM
    traceloop = attrs.get(_TRACELOOP_KIND)
    if operation == "invoke_agent" or traceloop == "agent" or _langgraph_node(attrs) is not None:
        return semconv.KIND_AGENT
    if operation == "execute_tool" or traceloop == "tool":
        return semconv.KIND_TOOL
    return None


def _langgraph_node(attrs: Mapping[str, Any]) -> str | None:
    """The LangGraph node whose own task span these attributes are (OpenLLMetry's LangChain spans), else ``None``."""
    if attrs.get(_TRACELOOP_KIND) != "task":
        return None
    node = attrs.get(LANGGRAPH_NODE)
    return node if isinstance(node, str) and node and node == attrs.get(_TRACELOOP_ENTITY) else None


def mark_start(span: SdkSpan) -> None:
    """Processor ``on_start`` hook: tag a span of a registered source (cheap when no source is registered)."""
    scope = span.instrumentation_scope
    registration = by_scope.get(scope.name) if scope is not None else None
    if registration is None or registration.suppressed():
        return
    attributes: dict[str, Any] = {semconv.ADAPTER_NAME: registration.name, semconv.SPAN_SOURCE: registration.name}
    # Tagged now, so that our openai client hook, called inside it, knows the call is recorded already (and relays
    # the response id where the source lacks it). Instrumentations set most attributes after the start: a CLIENT
    # span of these sources is an LLM call; the final attributes confirm it at conversion (`source_attributes`).
    llm = span.kind is SpanKind.CLIENT or _kind(span.attributes or {}) == semconv.KIND_LLM
    if llm:
        attributes[semconv.SPAN_KIND] = semconv.KIND_LLM
    span.set_attributes(attributes)
    if llm and registration.on_llm_start is not None:
        registration.on_llm_start(span)


def mark_end(span: Any) -> None:
    """Processor ``on_end`` hook: tell the source's registration that one of its LLM spans ended."""
    scope = span.instrumentation_scope
    registration = by_scope.get(scope.name) if scope is not None else None
    if registration is not None and registration.on_llm_end is not None:
        attributes = span.attributes
        if attributes and attributes.get(semconv.SPAN_SOURCE) and attributes.get(semconv.SPAN_KIND) == semconv.KIND_LLM:
            registration.on_llm_end(span)


def client_calls_recorded() -> bool:
    """Whether a registered, not suppressed, client-level source records every ``openai`` client call."""
    return any(r.client and not r.suppressed() for r in by_scope.values())


def is_source_span(span: Any) -> bool:
    """Whether ``span`` (a live SDK span) was tagged as a span of a registered source."""
    attributes = getattr(span, "attributes", None)
    return bool(attributes) and attributes.get(semconv.SPAN_SOURCE) is not None


def live_agent_name(span: Any) -> str | None:
    """The agent a live span of a registered source runs under, as the source names it on the span itself
    (`SourceRegistration.agent_attribute`); ``None`` for any other span or when the attribute is not set."""
    scope = getattr(span, "instrumentation_scope", None)
    registration = by_scope.get(scope.name) if scope is not None else None
    if registration is None or not registration.agent_attribute or not is_source_span(span):
        return None
    attributes = span.attributes
    for key in registration.agent_attribute:
        name = attributes.get(key)
        if isinstance(name, str) and name:
            return name
    return None


def source_attributes(attrs: dict[str, Any]) -> None:
    """Complete, in place, our attributes of a finished span of a source (anything else is left alone)."""
    if attrs.get(semconv.SPAN_SOURCE) is None:
        return
    kind = _kind(attrs)
    if kind is None:
        if attrs.get(semconv.GEN_AI_OPERATION) is not None:  # e.g. embeddings: a CLIENT span but no LLM call
            attrs.pop(semconv.SPAN_KIND, None)
        return  # else keep what the start decided
    attrs[semconv.SPAN_KIND] = kind
    if kind == semconv.KIND_AGENT and _langgraph_node(attrs) is not None:
        attrs[semconv.GEN_AI_AGENT_NAME] = attrs[_TRACELOOP_ENTITY]  # the node is the agent, as our adapter has it
        return
    entity = attrs.get(_TRACELOOP_ENTITY)
    if kind == semconv.KIND_AGENT and not attrs.get(semconv.GEN_AI_AGENT_NAME) and isinstance(entity, str) and entity:
        attrs[semconv.GEN_AI_AGENT_NAME] = entity
    elif kind == semconv.KIND_TOOL and not attrs.get(semconv.GEN_AI_TOOL_NAME) and isinstance(entity, str) and entity:
        attrs[semconv.GEN_AI_TOOL_NAME] = entity
