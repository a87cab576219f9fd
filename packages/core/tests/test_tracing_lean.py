"""Our instrumentation of the ``openai`` client: what each call records, and that nothing else changes.

Against a real `ScriptedModelServer` on 127.0.0.1 with the real ``openai`` client (async and sync, streamed,
raw responses, errors), inside a rollout writing to a `MemoryStore`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator

import openai
import pytest
from opentelemetry import trace

from agentlightning import semconv
from agentlightning.adapters import (
    OpenAIAdapter,
    acquire_openai_hook,
    lightning_tracer,
    pending_llm_spans,
    release_openai_hook,
)
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer
from agentlightning.tracing import aflush, rollout_context

MESSAGES = [{"role": "user", "content": "a reply long enough for many chunks"}]


async def _attempt(store: MemoryStore) -> tuple[str, str]:
    await store.enqueue_rollout({})
    claim = await store.dequeue_rollout("lean-test")
    assert claim is not None
    return claim.rollout.rollout_id, claim.attempt.attempt_id


@contextlib.asynccontextmanager
async def _framework_rollout(
    store: MemoryStore, server: ScriptedModelServer
) -> AsyncGenerator[tuple[str, trace.Tracer, openai.AsyncOpenAI]]:
    """A rollout traced by an agent framework's tracer with the openai hook on; its spans flushed at the end."""
    rid, aid = await _attempt(store)
    tracer = lightning_tracer("lean-test-framework")
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="t")
    acquire_openai_hook()
    try:
        with rollout_context(store, rid, aid):
            yield rid, tracer, client
        await aflush()
    finally:
        release_openai_hook()


@pytest.fixture
def adapter() -> OpenAIAdapter:
    adapter = OpenAIAdapter.default()
    adapter.instrument()
    yield adapter
    adapter.uninstrument()


async def test_a_call_is_one_llm_span_with_ids_model_and_usage(
    adapter: OpenAIAdapter, agl_store: MemoryStore, agl_model_server: ScriptedModelServer
) -> None:
    rid, aid = await _attempt(agl_store)
    client = openai.AsyncOpenAI(base_url=agl_model_server.base_url, api_key="t")
    with rollout_context(agl_store, rid, aid):
        reply = await client.chat.completions.create(model="toy", messages=MESSAGES)  # type: ignore[arg-type]
    await aflush()
    (span,) = await agl_store.query_spans(rid)
    (served,) = agl_model_server.served
    assert span.name == "chat toy"
    assert span.attributes[semconv.SPAN_KIND] == semconv.KIND_LLM
    assert span.attributes[semconv.ADAPTER_NAME] == "openai"
    assert span.attributes[semconv.GEN_AI_REQUEST_MODEL] == "toy"
    assert span.attributes[semconv.GEN_AI_RESPONSE_ID] == served.response_id == reply.id
    assert span.attributes[semconv.GEN_AI_RESPONSE_MODEL] == reply.model
    assert reply.usage is not None
    assert span.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == reply.usage.prompt_tokens
    assert span.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == reply.usage.completion_tokens == len(served.token_ids)
    assert not any(key.startswith(("gen_ai.prompt", "gen_ai.completion")) for key in span.attributes)  # no contents


async def test_a_stream_is_one_span_ended_when_read(
    adapter: OpenAIAdapter, agl_store: MemoryStore, agl_model_server: ScriptedModelServer
) -> None:
    rid, aid = await _attempt(agl_store)
    client = openai.AsyncOpenAI(base_url=agl_model_server.base_url, api_key="t")
    with rollout_context(agl_store, rid, aid):
        stream = await client.chat.completions.create(
            model="toy",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        assert isinstance(stream, openai.AsyncStream)  # frameworks check the type
        await aflush()
        assert await agl_store.query_spans(rid) == []  # not ended before the stream is read
        async with stream:
            chunks = [chunk async for chunk in stream]
    await aflush()
    assert len(chunks) > 5
    (span,) = await agl_store.query_spans(rid)
    (served,) = agl_model_server.served
    assert span.attributes[semconv.GEN_AI_RESPONSE_ID] == served.response_id
    assert span.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == len(served.token_ids)
    assert span.events == []  # no event per chunk


def test_sync_client_and_raw_response(agl_store: MemoryStore, agl_model_server: ScriptedModelServer) -> None:
    import asyncio

    async def attempt() -> tuple[str, str]:
        return await _attempt(agl_store)

    rid, aid = asyncio.run(attempt())
    client = openai.OpenAI(base_url=agl_model_server.base_url, api_key="t")
    adapter = OpenAIAdapter.default()
    adapter.instrument()
    try:
        with rollout_context(agl_store, rid, aid):
            client.chat.completions.create(model="toy", messages=MESSAGES)  # type: ignore[arg-type]
            raw = client.chat.completions.with_raw_response.create(model="toy", messages=MESSAGES)  # type: ignore[arg-type]
            assert raw.parse().id == agl_model_server.served[1].response_id
            for _ in client.chat.completions.create(model="toy", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
                pass
    finally:
        adapter.uninstrument()
    from agentlightning.tracing import flush

    flush()
    spans = asyncio.run(agl_store.query_spans(rid))
    assert sorted(str(s.attributes[semconv.GEN_AI_RESPONSE_ID]) for s in spans) == sorted(
        c.response_id for c in agl_model_server.served
    )


async def test_a_failed_call_is_an_error_span(adapter: OpenAIAdapter, agl_store: MemoryStore) -> None:
    rid, aid = await _attempt(agl_store)
    with ScriptedModelServer([]) as server:  # an exhausted script answers HTTP 500
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="t", max_retries=0)
        with rollout_context(agl_store, rid, aid), pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="toy", messages=MESSAGES)  # type: ignore[arg-type]
    await aflush()
    (span,) = await agl_store.query_spans(rid)
    assert span.status.code == "error"
    assert "InternalServerError" in (span.status.description or "")
    assert [event.name for event in span.events] == [semconv.EVENT_EXCEPTION]


async def test_under_a_framework_llm_span_only_that_span_is_recorded(
    agl_store: MemoryStore, agl_model_server: ScriptedModelServer
) -> None:
    """The client call hands its response id and usage up instead of being stored as a second span."""
    async with _framework_rollout(agl_store, agl_model_server) as (rid, tracer, client):
        current = tracer.start_span("chat current", attributes={semconv.SPAN_KIND: semconv.KIND_LLM})
        with trace.use_span(current, end_on_exit=True):
            await client.chat.completions.create(model="toy", messages=MESSAGES)  # type: ignore[arg-type]
        pending = tracer.start_span("chat pending", attributes={semconv.SPAN_KIND: semconv.KIND_LLM})
        pending_llm_spans.add(pending)  # a callback framework cannot make its span current
        stream = await client.chat.completions.create(model="toy", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        async for _ in stream:
            pass
        pending.end()
    spans = {s.name: s for s in await agl_store.query_spans(rid)}
    assert sorted(spans) == ["chat current", "chat pending"]
    first, second = agl_model_server.served
    assert spans["chat current"].attributes[semconv.GEN_AI_RESPONSE_ID] == first.response_id
    assert spans["chat current"].attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == len(first.token_ids)
    assert spans["chat pending"].attributes[semconv.GEN_AI_RESPONSE_ID] == second.response_id


async def test_a_framework_span_keeps_what_it_recorded_itself(
    agl_store: MemoryStore, agl_model_server: ScriptedModelServer
) -> None:
    """Only the attributes the framework span lacks are handed up; its own values stay."""
    own = {semconv.SPAN_KIND: semconv.KIND_LLM, semconv.GEN_AI_RESPONSE_ID: "framework-id"}
    async with _framework_rollout(agl_store, agl_model_server) as (rid, tracer, client):
        span = tracer.start_span("chat framework", attributes={**own, semconv.GEN_AI_USAGE_INPUT_TOKENS: 7})
        with trace.use_span(span, end_on_exit=True):
            await client.chat.completions.create(model="toy", messages=MESSAGES)  # type: ignore[arg-type]
    (recorded,) = await agl_store.query_spans(rid)
    (served,) = agl_model_server.served
    assert recorded.attributes[semconv.GEN_AI_RESPONSE_ID] == "framework-id"
    assert recorded.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 7
    assert recorded.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == len(served.token_ids)  # it lacked this one
    assert recorded.attributes[semconv.GEN_AI_RESPONSE_MODEL]


async def test_outside_a_rollout_or_when_off_nothing_is_recorded_and_the_client_is_restored(
    agl_store: MemoryStore, agl_model_server: ScriptedModelServer
) -> None:
    chat = openai.resources.chat.AsyncCompletions
    original = chat.create
    environ = dict(os.environ)
    client = openai.AsyncOpenAI(base_url=agl_model_server.base_url, api_key="t")
    adapter = OpenAIAdapter.default()
    adapter.instrument()
    try:
        assert chat.create is not original  # wrapped while on
        await client.chat.completions.create(model="toy", messages=MESSAGES)  # type: ignore[arg-type]
    finally:
        adapter.uninstrument()
    assert chat.create is original  # the client's own method is back
    assert dict(os.environ) == environ  # no process-wide setting was changed
    rid, aid = await _attempt(agl_store)
    with rollout_context(agl_store, rid, aid):
        await client.chat.completions.create(model="toy", messages=MESSAGES)  # type: ignore[arg-type]
    await aflush()
    assert await agl_store.query_spans(rid) == []
    assert len(agl_model_server.served) == 2
