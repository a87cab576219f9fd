"""A LangChain callback handler that turns runs into Agent Lightning spans.

Chains, chat models, LLMs and tools become OpenTelemetry spans, parented by LangChain's ``run_id`` /
``parent_run_id``. A LangGraph node run (``metadata["langgraph_node"]`` equal to the run name) becomes an agent
span named after the node, so each node is an agent for the transition builder. LangGraph's internal runnables
(tagged ``langsmith:hidden``) get no span; their children hang off the nearest recorded ancestor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import ChatGeneration, LLMResult
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, Status, StatusCode

from agentlightning import semconv
from agentlightning.adapters import lightning_tracer, pending_llm_spans

__all__ = ["LightningCallbackHandler"]

logger = logging.getLogger(__name__)

ADAPTER = "langchain"
_HIDDEN_TAG = "langsmith:hidden"


@dataclass
class _Run:
    span: Span | None  # None: a hidden run (no span of its own)
    parent: UUID | None
    agent: str | None
    token: object | None = None


class LightningCallbackHandler(BaseCallbackHandler):
    """Records LangChain / LangGraph runs as spans of the current rollout.

    Pass it explicitly (``graph.invoke(x, config={"callbacks": [LightningCallbackHandler()]})``) or call
    ``agentlightning_langchain.instrument()`` to add one to every run.

    Args:
        tracer_name: Instrumentation scope of the spans.
        tracer_provider: The OpenTelemetry SDK provider the spans go through (default: Agent Lightning's own).
    """

    run_inline = True  # called in the caller's context, so the rollout context variable is visible
    raise_error = False

    # Events this handler records nothing for: LangChain then does not dispatch them to it at all. (Not
    # ``ignore_agent``: LangChain files tool callbacks under it too.)
    @property
    def ignore_retriever(self) -> bool:
        """Retriever runs are not recorded."""
        return True

    @property
    def ignore_retry(self) -> bool:
        """Retries are not recorded."""
        return True

    @property
    def ignore_custom_event(self) -> bool:
        """Custom events are not recorded."""
        return True

    def __init__(
        self, tracer_name: str = "agentlightning_langchain", tracer_provider: TracerProvider | None = None
    ) -> None:
        super().__init__()
        self._tracer = lightning_tracer(tracer_name, tracer_provider)
        self._runs: dict[UUID, _Run] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ helpers
    def _parent(self, parent_run_id: UUID | None) -> _Run | None:
        run = self._runs.get(parent_run_id) if parent_run_id is not None else None
        while run is not None and run.span is None:
            run = self._runs.get(run.parent) if run.parent is not None else None
        return run

    def _start(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str,
        attributes: dict[str, Any],
        *,
        agent: str | None = None,
    ) -> _Run:
        parent = self._parent(parent_run_id)
        ctx = trace.set_span_in_context(parent.span) if parent is not None and parent.span is not None else None
        attributes[semconv.ADAPTER_NAME] = ADAPTER
        span = self._tracer.start_span(name, context=ctx, attributes=attributes)
        run = _Run(span, parent_run_id, agent if agent is not None else (parent.agent if parent else None))
        self._runs[run_id] = run
        return run

    def _end(self, run_id: UUID, error: BaseException | None = None, attributes: dict[str, Any] | None = None) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        if run.token is not None:
            try:
                otel_context.detach(run.token)  # type: ignore[arg-type]
            except Exception:  # ended in another context than it started: nothing to restore
                logger.debug("could not detach context of run %s", run_id)
        span = run.span
        if span is None:
            return
        if attributes:
            span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()

    # ------------------------------------------------------------------ chains (and LangGraph nodes)
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Start a chain span; a LangGraph node becomes an agent span."""
        name = kwargs.get("name") or _name(serialized, "chain")
        if tags and _HIDDEN_TAG in tags:
            self._runs[run_id] = _Run(None, parent_run_id, None)
            return
        node = (metadata or {}).get("langgraph_node")
        parent = self._parent(parent_run_id)
        if node is not None and node == name and (parent is None or parent.agent != name):
            attributes: dict[str, Any] = {
                semconv.SPAN_KIND: semconv.KIND_AGENT,
                semconv.GEN_AI_AGENT_NAME: name,
                semconv.GEN_AI_OPERATION: "invoke_agent",
            }
            self._start(run_id, parent_run_id, f"invoke_agent {name}", attributes, agent=name)
            return
        self._start(run_id, parent_run_id, name, {})

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """End a chain span."""
        self._end(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """End a chain span with an error status."""
        self._end(run_id, error)

    # ------------------------------------------------------------------ models
    def _start_llm(
        self,
        serialized: dict[str, Any] | None,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: dict[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> None:
        params: dict[str, Any] = kwargs.get("invocation_params") or {}
        meta = metadata or {}
        model = params.get("model") or params.get("model_name") or meta.get("ls_model_name")
        attributes: dict[str, Any] = {semconv.SPAN_KIND: semconv.KIND_LLM, semconv.GEN_AI_OPERATION: "chat"}
        if model:
            attributes[semconv.GEN_AI_REQUEST_MODEL] = str(model)
        if meta.get("ls_provider"):
            attributes[semconv.GEN_AI_SYSTEM] = str(meta["ls_provider"])
        run = self._start(run_id, parent_run_id, f"chat {model}" if model else "chat", attributes)
        # LangChain may call start and end callbacks in copies of the caller's context, so the span cannot be
        # made current; the openai client span of this call finds it here and hands up the response id
        # (LangChain drops it for streamed calls).
        pending_llm_spans.add(run.span)

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Start an LLM span for a chat model call."""
        self._start_llm(serialized, run_id, parent_run_id, metadata, kwargs)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Start an LLM span for a completion model call."""
        self._start_llm(serialized, run_id, parent_run_id, metadata, kwargs)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """End the LLM span with the response id (the join key to the proxy's record), model and usage."""
        self._forget_pending(run_id)
        if run_id in self._runs:
            self._end(run_id, attributes=_response_attributes(response))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """End the LLM span with an error status."""
        self._forget_pending(run_id)
        self._end(run_id, error)

    def _forget_pending(self, run_id: UUID) -> None:
        run = self._runs.get(run_id)
        if run is not None and run.span is not None:
            pending_llm_spans.discard(run.span)

    # ------------------------------------------------------------------ tools
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Start a tool span."""
        name = kwargs.get("name") or _name(serialized, "tool")
        attributes: dict[str, Any] = {
            semconv.SPAN_KIND: semconv.KIND_TOOL,
            semconv.GEN_AI_TOOL_NAME: name,
            semconv.GEN_AI_OPERATION: "execute_tool",
        }
        run = self._start(run_id, parent_run_id, f"execute_tool {name}", attributes)
        # Code the tool runs (another framework, a manual span) nests under the tool span.
        assert run.span is not None
        run.token = otel_context.attach(trace.set_span_in_context(run.span))

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """End a tool span."""
        self._end(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """End a tool span with an error status."""
        self._end(run_id, error)


def _name(serialized: dict[str, Any] | None, default: str) -> str:
    if not serialized:
        return default
    name = serialized.get("name")
    if name:
        return str(name)
    ids: Sequence[Any] = serialized.get("id") or []
    return str(ids[-1]) if ids else default


def _response_attributes(response: LLMResult) -> dict[str, Any]:
    """Response id, model and token usage from wherever the provider integration put them."""
    out: dict[str, Any] = {}
    llm_output: dict[str, Any] = response.llm_output or {}
    response_id = llm_output.get("id")
    model = llm_output.get("model_name") or llm_output.get("model")
    usage_in = usage_out = None
    for generations in response.generations:
        for generation in generations:
            info = generation.generation_info or {}
            response_id = response_id or info.get("id")
            if isinstance(generation, ChatGeneration):
                message = generation.message
                meta = message.response_metadata or {}
                response_id = response_id or meta.get("id")
                model = model or meta.get("model_name") or meta.get("model")
                usage = getattr(message, "usage_metadata", None)
                if usage:
                    usage_in, usage_out = usage.get("input_tokens"), usage.get("output_tokens")
                if response_id is None and message.id and not str(message.id).startswith(("run-", "lc_run-")):
                    response_id = message.id  # streamed chunks carry the provider's id as the message id
    if usage_in is None:
        token_usage = llm_output.get("token_usage") or {}
        usage_in, usage_out = token_usage.get("prompt_tokens"), token_usage.get("completion_tokens")
    out[semconv.GEN_AI_RESPONSE_ID] = str(response_id) if response_id else None
    out[semconv.GEN_AI_RESPONSE_MODEL] = str(model) if model else None
    out[semconv.GEN_AI_USAGE_INPUT_TOKENS] = usage_in
    out[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = usage_out
    return out
