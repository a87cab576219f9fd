"""`RecordRoundTripTests`: what a store gives back is exactly what was written, field by field and bit by bit.

Part of `StoreConformanceTests`. The records below exercise every field of `LLMCall` and `Span` with values a
compact storage format could get wrong: token ids past 32 and 64 bits, log-probs whose float bits matter (-0.0,
the smallest subnormal, the largest finite double), per-token log-probs in the response that equal
``response_logprobs`` and ones that differ from it only in the sign of zero, shared tools and system prompts, long
texts repeated between a call and a span, every attribute value type, events and an error status.
"""

from __future__ import annotations

import struct
from typing import Any

from agentlightning import semconv
from agentlightning._models import LLMCall, Span, SpanEvent, SpanStatus
from agentlightning.store import LightningStore

__all__ = ["RecordRoundTripTests", "round_trip_calls", "round_trip_spans"]

_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
_LONG_PROMPT = "Compute step by step, then answer with the number only. " * 6 + "Ünïcødé ✓ 数字"
_SYSTEM = "You are a careful calculator. Use the calculator tool for every operation. " * 3
_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["x"]},
        },
    }
]
_LOGPROBS = [-0.0, -5e-324, -1.7976931348623157e308, -0.1, -2.220446049250313e-16, -12.5]


def _token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": None, "top_logprobs": []}


def round_trip_calls(rollout_id: str, attempt_id: str) -> list[LLMCall]:
    """LLM calls that set every field, with the values a compact format could get wrong."""
    request: dict[str, Any] = {
        "model": "toy",
        "messages": [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _LONG_PROMPT},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function"}]},
            {"role": "tool", "tool_call_id": "t1", "content": "42"},
        ],
        "tools": _TOOLS,
        "temperature": 0.7,
        "extra": {"nested": [1, 2.5, None, True, "x", -0.0]},
    }
    same = {
        "id": "chatcmpl-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A:42"},
                "logprobs": {"content": [_token(f"t{i}", lp) for i, lp in enumerate(_LOGPROBS)]},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 6},
    }
    # the response's own log-probs differ from response_logprobs in one sign of zero: kept as they were
    differs = {
        "id": "chatcmpl-2",
        "choices": [{"index": 0, "logprobs": {"content": [_token("a", 0.0), _token("b", -1.0)]}}],
    }
    return [
        LLMCall(
            call_id="rt-call-1",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            response_id="chatcmpl-1",
            request=request,
            response=same,
            prompt_token_ids=[0, 1, 2**31, 2**32 - 1, 151_643],
            response_token_ids=[7, 0, 2**32 - 1, 3, 4, 5],
            response_logprobs=list(_LOGPROBS),
            model="toy",
            model_version=3,
            backend="inproc://backend-7",
            policy="solver-lora",
            agent_name="solver ✓",
            start_time=1_700_000_000.123_456_7,
            end_time=1_700_000_001.000_000_1,
            error=None,
        ),
        LLMCall(
            call_id="rt-call-2",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            response_id="chatcmpl-2",
            request={**request, "messages": [*request["messages"], {"role": "user", "content": "again"}]},
            response=differs,
            prompt_token_ids=[2**40, -1, 5],  # past 32 bits, and negative: 64-bit storage
            response_token_ids=[1, 2],
            response_logprobs=[-0.0, -1.0],
            model=None,
            model_version=None,
            backend=None,
            start_time=1_700_000_002.5,
            end_time=None,
            error="backend failed: ünïcode ✗",
        ),
        LLMCall(
            call_id="rt-call-3",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            request={},
            response=None,
            prompt_token_ids=[2**64 + 1],  # past 64 bits
            response_token_ids=[],
            response_logprobs=None,
            start_time=1_700_000_003.0,
        ),
    ]


def round_trip_spans(rollout_id: str, attempt_id: str) -> list[Span]:
    """Spans that set every field and every attribute value type."""
    attributes: dict[str, Any] = {
        semconv.SPAN_KIND: semconv.KIND_LLM,
        semconv.ROLLOUT_ID: rollout_id,
        semconv.ATTEMPT_ID: attempt_id,
        semconv.GEN_AI_RESPONSE_ID: "chatcmpl-1",
        semconv.GEN_AI_USAGE_INPUT_TOKENS: 5,
        "gen_ai.prompt.0.content": _LONG_PROMPT,  # the text the call above recorded: stored once
        semconv.PROMPT_TOKEN_IDS: list(range(40)),
        semconv.RESPONSE_LOGPROBS: list(_LOGPROBS),
        "custom.float": -0.0,
        "custom.int": 2**62,
        "custom.bool": False,
        "custom.none": None,
        "custom.strings": ["a", "ü", ""],
        "custom.bools": [True, False],
        "custom.empty": [],
        "ünïcode.kéy": "välue",
    }
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=0,
            trace_id=_TRACE,
            span_id="00f067aa0ba902b7",
            parent_id=None,
            name="agentlightning.rollout",
            start_time=1_700_000_000.0,
            end_time=1_700_000_009.999_999_9,
            attributes={semconv.SPAN_KIND: semconv.KIND_ROLLOUT, semconv.ROLLOUT_ID: "another-rollout"},
        ),
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=1,
            trace_id=_TRACE,
            span_id="a0f067aa0ba902b8",
            parent_id="00f067aa0ba902b7",
            name="chat toy ✓",
            start_time=1_700_000_000.123_456_7,
            end_time=1_700_000_001.000_000_1,
            attributes=attributes,
            events=[
                SpanEvent(name="exception", timestamp=1_700_000_000.5, attributes={"exception.message": "x"}),
                SpanEvent(name="empty", timestamp=5e-324),
            ],
            status=SpanStatus(code="error", description="boom ✗"),
        ),
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=2,
            trace_id=_TRACE,
            span_id="b0f067aa0ba902b9",
            parent_id="00f067aa0ba902b7",
            name="",
            start_time=0.0,
            end_time=0.0,
            status=SpanStatus(code="ok"),
        ),
    ]


def _bits(values: list[float] | None) -> list[bytes] | None:
    return None if values is None else [struct.pack("<d", v) for v in values]


class RecordRoundTripTests:
    """Every field of spans and LLM calls reads back as written (the kit's record round trip)."""

    async def _attempt(self, store: LightningStore) -> tuple[str, str]:
        await store.enqueue_rollout({"q": "round trip"}, rollout_id="rt-rollout")
        claim = await store.dequeue_rollout(worker_id="w")
        assert claim is not None
        return claim.rollout.rollout_id, claim.attempt.attempt_id

    async def test_llm_calls_read_back_exactly_as_written(self, store: LightningStore) -> None:
        rid, aid = await self._attempt(store)
        calls = round_trip_calls(rid, aid)
        assert await store.add_llm_calls(calls) == len(calls)
        assert await store.add_llm_calls(calls) == 0  # idempotent: nothing stored twice
        for got in (await store.query_llm_calls(rid), await store.query_llm_calls(rid, aid)):
            assert got == calls
            # same JSON (key order, number types, the shortest repr of every float) and the same float bits
            assert [c.model_dump_json() for c in got] == [c.model_dump_json() for c in calls]
            assert [_bits(c.response_logprobs) for c in got] == [_bits(c.response_logprobs) for c in calls]
            logprobs = got[0].response["choices"][0]["logprobs"]["content"]  # type: ignore[index]
            assert [_bits([t["logprob"]]) for t in logprobs] == [_bits([v]) for v in _LOGPROBS]

    async def test_spans_read_back_exactly_as_written(self, store: LightningStore) -> None:
        rid, aid = await self._attempt(store)
        spans = round_trip_spans(rid, aid)
        await store.add_llm_calls(round_trip_calls(rid, aid))  # a call that shares the span's long prompt
        assert await store.add_spans(spans) == len(spans)
        assert await store.add_spans(spans) == 0
        for got in (await store.query_spans(rid), await store.query_spans(rid, aid)):
            assert got == spans
            assert [s.model_dump_json() for s in got] == [s.model_dump_json() for s in spans]
            assert list(got[1].attributes) == list(spans[1].attributes)  # attribute order kept
            assert _bits(got[1].attributes[semconv.RESPONSE_LOGPROBS]) == _bits(_LOGPROBS)  # type: ignore[arg-type]

    async def test_big_batches_store_each_span_once_exactly(self, store: LightningStore) -> None:
        # Batches of hundreds of spans take the backends' batch paths (SQLite: many rows per INSERT): spans
        # already stored and spans repeated within a batch are each stored once, every field as written.
        await self._big_batches(store, with_events=True)

    async def test_big_batches_of_usual_spans_store_each_span_once_exactly(self, store: LightningStore) -> None:
        # No events, status unset: what a served store reads in its fast lane and a SQL store encodes by columns
        await self._big_batches(store, with_events=False)

    async def _big_batches(self, store: LightningStore, with_events: bool) -> None:
        rid, aid = await self._attempt(store)
        shapes = round_trip_spans(rid, aid) if with_events else round_trip_spans(rid, aid)[:1]
        own = {semconv.ATTEMPT_ID: aid, "n": 0, semconv.ROLLOUT_ID: rid, "k": "v"}
        kinds = [own, {**own, "text": "x" * 300}, {semconv.ROLLOUT_ID: rid + "x", semconv.ATTEMPT_ID: "a"}, {}]

        def span(i: int) -> Span:
            attributes = {**kinds[i % 4], "n": [i, 0.5, -i] if i % 2 else i}
            return shapes[i % len(shapes)].model_copy(
                update={"sequence_id": i, "span_id": f"{i + 1:016x}", "attributes": attributes}
            )

        assert await store.add_spans([span(i) for i in range(70)]) == 70
        again = [span(i) for i in range(40, 120)] + [span(i) for i in range(100, 120)]
        assert await store.add_spans(again) == 50  # 40-69 stored before, 100-119 twice in the batch
        got = await store.query_spans(rid, aid)
        assert [s.model_dump_json() for s in got] == [span(i).model_dump_json() for i in range(120)]
        assert [list(s.attributes) for s in got] == [list(span(i).attributes) for i in range(120)]

    async def test_big_batches_store_each_llm_call_once_exactly(self, store: LightningStore) -> None:
        rid, aid = await self._attempt(store)
        shape = round_trip_calls(rid, aid)[0]

        def call(i: int) -> LLMCall:
            return shape.model_copy(update={"call_id": f"call-{i}", "start_time": 1_700_000_000.0 + i})

        assert await store.add_llm_calls([call(i) for i in range(40)]) == 40
        again = [call(i) for i in range(20, 90)] + [call(i) for i in range(80, 90)]
        assert await store.add_llm_calls(again) == 50  # 20-39 stored before, 80-89 twice in the batch
        got = await store.query_llm_calls(rid, aid)
        assert [c.model_dump_json() for c in got] == [call(i).model_dump_json() for i in range(90)]
