"""The openai instrumentation runs lean: one span per call, no per-chunk events, nothing lost on the way."""

from __future__ import annotations

import logging

import openai
import pytest
from opentelemetry import trace

from agentlightning import semconv
from agentlightning.adapters import OpenAIAdapter, acquire_openai_hook, release_openai_hook
from agentlightning.adapters._otel import lightning_tracer
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer
from agentlightning.tracing import aflush, rollout_context


async def _attempt(store: MemoryStore) -> tuple[str, str]:
    await store.enqueue_rollout({})
    claim = await store.dequeue_rollout("lean-test")
    assert claim is not None
    return claim.rollout.rollout_id, claim.attempt.attempt_id


async def test_streamed_call_is_one_llm_span_without_chunk_events() -> None:
    adapter = OpenAIAdapter.default()
    store = MemoryStore()
    rid, aid = await _attempt(store)
    with ScriptedModelServer() as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="t")
        adapter.instrument()
        try:
            with rollout_context(store, rid, aid):
                stream = await client.chat.completions.create(
                    model="toy",
                    messages=[{"role": "user", "content": "a reply long enough for many chunks"}],
                    stream=True,
                )
                chunks = [c async for c in stream]
            await aflush()
        finally:
            adapter.uninstrument()
        served = server.served
    assert len(chunks) > 5
    (span,) = await store.query_spans(rid)
    assert span.attributes[semconv.SPAN_KIND] == semconv.KIND_LLM
    assert span.attributes[semconv.GEN_AI_RESPONSE_ID] == served[0].response_id
    assert span.events == []


async def test_client_call_under_a_framework_llm_span_records_only_that_span() -> None:
    """The client span hands its response id and usage up instead of being stored as a second span."""
    store = MemoryStore()
    rid, aid = await _attempt(store)
    tracer = lightning_tracer("lean-test-framework")
    with ScriptedModelServer() as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="t")
        acquire_openai_hook()
        try:
            with rollout_context(store, rid, aid):
                framework = tracer.start_span("chat toy", attributes={semconv.SPAN_KIND: semconv.KIND_LLM})
                with trace.use_span(framework, end_on_exit=True):
                    await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}])
            await aflush()
        finally:
            release_openai_hook()
        served = server.served
    (span,) = await store.query_spans(rid)
    assert span.name == "chat toy"
    assert span.attributes[semconv.GEN_AI_RESPONSE_ID] == served[0].response_id
    assert span.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == len(served[0].token_ids)


def test_swallowed_instrumentation_errors_still_show_their_traceback_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The instrumentation's ``dont_throw`` formats tracebacks lazily now, but a debug log still shows them."""
    adapter = OpenAIAdapter.default()
    adapter.instrument()  # installs the lean configuration (once per process)
    adapter.uninstrument()
    from opentelemetry.instrumentation.openai.utils import dont_throw

    @dont_throw
    def broken() -> None:
        raise ZeroDivisionError("lean-test")

    with caplog.at_level(logging.DEBUG, logger=__name__):
        broken()
    assert any("ZeroDivisionError: lean-test" in record.getMessage() for record in caplog.records)
