"""Light spans (our own root, LLM, reward spans without the SDK's span objects) give the store the same records.

The same spans are recorded twice into a real `MemoryStore`, once through the light path and once through the
OpenTelemetry SDK's spans, and the stored records are compared field by field (ids and times aside); then where the
light path applies (inside a rollout, our processor alone) and where it hands over to the SDK (outside a rollout,
an OTLP exporter or any other processor on the provider).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Status, StatusCode

from agentlightning import semconv
from agentlightning.store import MemoryStore
from agentlightning.testing import start_attempts
from agentlightning.tracing import aflush, agent_of_span, get_span_processor, get_tracer, rollout_context
from agentlightning.tracing._light import LightSpan, LightTracer
from agentlightning.tracing._provider import get_tracer_provider, light_tracer


def _tracer(light: bool) -> LightTracer:
    scope = "light-test"
    return LightTracer(get_tracer(scope), get_span_processor(), InstrumentationScope(scope), lambda: light)


def _record_spans(tracer: trace.Tracer) -> None:
    """Root (current) span with a child SDK span, an LLM span with late attributes and an error, a reward span."""
    with tracer.start_as_current_span(
        "agentlightning.rollout",
        attributes={semconv.SPAN_KIND: semconv.KIND_ROLLOUT, semconv.GEN_AI_AGENT_NAME: "solver"},
        record_exception=False,
        set_status_on_exception=False,
    ) as root:
        child = get_tracer("light-test-framework").start_span("framework step", attributes={"step": 1})
        assert agent_of_span(child) == "solver"  # the agent is inherited from the light parent
        child.end()
        llm = tracer.start_span("chat toy", attributes={semconv.SPAN_KIND: semconv.KIND_LLM, "tags": ["a", "b"]})
        llm.set_attributes({"gen_ai.response.id": "r-1", "tags": ["c"], "count": 3, "ratio": 0.5, "ok": True})
        llm.set_attribute("gen_ai.response.id", "r-2")  # set again: moves to the end, as in the SDK's map
        llm.add_event("scores", {"loss": math.inf, "steps": [1.0, math.nan]})  # stored as text, not refused
        llm.record_exception(ValueError("bad answer"))
        llm.set_status(Status(StatusCode.ERROR, "ValueError: bad answer"))
        llm.set_status(StatusCode.UNSET)  # ignored
        llm.end()
        reward = tracer.start_span(
            "agentlightning.reward",
            attributes={semconv.SPAN_KIND: semconv.KIND_REWARD, semconv.REWARD_VALUE: 1.0, "raw": math.nan},
            start_time=5,
        )
        reward.end(end_time=5)
        root.set_status(Status(StatusCode.OK))
        root.set_status(Status(StatusCode.ERROR, "too late"))  # OK is final


def _comparable(span: Any) -> dict[str, Any]:
    data = span.model_dump()
    for key in ("trace_id", "span_id", "parent_id", "start_time", "end_time", "rollout_id", "attempt_id"):
        data.pop(key)
    for event in data["events"]:
        event.pop("timestamp")
        event["attributes"].pop("exception.stacktrace", None)  # the line numbers differ between the two calls
    data["attributes"].pop(semconv.ROLLOUT_ID)
    data["attributes"].pop(semconv.ATTEMPT_ID)
    data["attribute_order"] = list(data["attributes"])
    return data


async def _stored(light: bool) -> list[Any]:
    store = MemoryStore()
    ids = await start_attempts(store, ["r-light" if light else "r-sdk"])
    ((rollout_id, attempt_id),) = ids.items()
    with rollout_context(store, rollout_id, attempt_id):
        _record_spans(_tracer(light))
    await aflush()
    return sorted(await store.query_spans(rollout_id), key=lambda s: s.sequence_id)


async def test_light_spans_store_the_same_records_as_sdk_spans() -> None:
    light, sdk = await _stored(True), await _stored(False)
    assert [_comparable(s) for s in light] == [_comparable(s) for s in sdk]
    assert [s.name for s in light] == ["agentlightning.rollout", "framework step", "chat toy", "agentlightning.reward"]
    root, child, llm, reward = light
    assert child.parent_id == root.span_id and child.trace_id == root.trace_id  # an SDK child of a light parent
    assert llm.parent_id == root.span_id and reward.parent_id == root.span_id
    assert llm.attributes["tags"] == ["c"] and list(llm.attributes)[-1] == "gen_ai.response.id"
    assert llm.events[0].attributes == {"loss": "inf", "steps": ["1.0", "nan"]}
    assert llm.events[1].attributes["exception.type"] == "ValueError"
    assert reward.attributes["raw"] == "nan" and reward.attributes[semconv.REWARD_VALUE] == 1.0
    assert llm.status.code == "error" and root.status.code == "ok"
    assert (reward.start_time, reward.end_time) == (5e-9, 5e-9)


async def test_light_path_only_inside_a_rollout_with_our_processor_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Our processor alone, whatever earlier tests of this process added to the provider (the SDK cannot remove a
    # processor; an active one left by another test would rightly keep every span on the SDK path).
    monkeypatch.setattr(get_tracer_provider(), "others", [])
    store = MemoryStore()
    ((rollout_id, attempt_id),) = (await start_attempts(store, ["r-where"])).items()
    tracer = light_tracer("light-test-where")
    outside = tracer.start_span("outside")
    assert isinstance(outside, SdkSpan)  # no rollout: the SDK's span, dropped by our processor as ever
    outside.end()
    with rollout_context(store, rollout_id, attempt_id):
        inside = tracer.start_span("inside")
        assert isinstance(inside, LightSpan)
        inside.end()
        inside.end()  # a second end warns and records nothing more
        seen: list[str] = []

        class Watcher(SpanProcessor):  # another processor on our provider (an OTLP exporter, a user's own)
            active = True

            def reads_own_spans(self) -> bool:  # `OwnSpanReader`: it can be switched off, as the OTLP exporter can
                return self.active

            def on_end(self, span: ReadableSpan) -> None:
                seen.append(span.name)

        watcher = Watcher()
        get_tracer_provider().add_span_processor(watcher)
        try:
            exported = tracer.start_span("seen by the other processor")
            assert isinstance(exported, SdkSpan)
            exported.end()
        finally:
            watcher.active = False  # switched off (as `stop_otlp_export` does): light spans again
        assert seen == ["seen by the other processor"]
        assert isinstance(tracer.start_span("light again"), LightSpan)
    await aflush()
    names = {s.name for s in await store.query_spans(rollout_id)}
    assert names == {"inside", "seen by the other processor"}  # "light again" never ended: not stored


@pytest.mark.parametrize("value", [[1, "mixed"], object()])
async def test_light_spans_drop_bad_attribute_values_as_the_sdk_does(value: Any) -> None:
    store = MemoryStore()
    ((rollout_id, attempt_id),) = (await start_attempts(store, ["r-bad"])).items()
    with rollout_context(store, rollout_id, attempt_id):
        for light in (True, False):
            span = _tracer(light).start_span(f"bad {light}")
            span.set_attributes({"good": 1, "bad": value})
            span.end()
    await aflush()
    spans = {s.name: s.attributes for s in await store.query_spans(rollout_id)}
    assert spans.get("bad True") == spans.get("bad False")  # the same record, or the same refusal (logged)


async def test_a_framework_span_mapper_on_the_provider_keeps_our_spans_light(monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter's mapper of its framework's spans (AutoGen's, added once to the provider and never removed) does
    not read our own spans: while it is there, and on, our spans inside a rollout stay light."""
    from agentlightning.adapters import GatedSpanProcessor, add_processor_once

    monkeypatch.setattr(get_tracer_provider(), "others", [])
    mapper = GatedSpanProcessor()
    mapper.enabled = True
    add_processor_once(get_tracer_provider(), mapper)
    store = MemoryStore()
    ((rollout_id, attempt_id),) = (await start_attempts(store, ["r-mapper"])).items()
    with rollout_context(store, rollout_id, attempt_id):
        span = light_tracer("light-test-mapper").start_span("with a mapper")
        assert isinstance(span, LightSpan)
        span.end()
    mapper.enabled = False
    await aflush()
    assert {s.name for s in await store.query_spans(rollout_id)} == {"with a mapper"}


async def test_adapter_spans_are_light_and_still_known_as_llm_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Framework adapters' spans (`lightning_tracer`) take the light path too; the openai client hook still finds a
    light framework LLM span (current, or waiting in `pending_llm_spans`) to hand the response id to."""
    from agentlightning.adapters import is_llm_span, lightning_tracer, pending_llm_spans

    monkeypatch.setattr(get_tracer_provider(), "others", [])
    store = MemoryStore()
    ((rollout_id, attempt_id),) = (await start_attempts(store, ["r-adapter"])).items()
    with rollout_context(store, rollout_id, attempt_id):
        tracer = lightning_tracer("light-test-adapter")
        agent = tracer.start_span("invoke_agent a", attributes={semconv.SPAN_KIND: semconv.KIND_AGENT})
        llm = tracer.start_span("chat toy", attributes={semconv.SPAN_KIND: semconv.KIND_LLM})
        assert isinstance(agent, LightSpan) and isinstance(llm, LightSpan)
        assert is_llm_span(llm) and not is_llm_span(agent)
        pending_llm_spans.add(llm)
        assert pending_llm_spans.claim() is llm
        llm.end()
        agent.end()
        assert not is_llm_span(llm)  # ended: no longer a live LLM span
    outside = lightning_tracer("light-test-adapter").start_span("outside")
    assert isinstance(outside, SdkSpan)  # no rollout: the SDK's span, as ever
    outside.end()
    await aflush()
    assert {s.name for s in await store.query_spans(rollout_id)} == {"invoke_agent a", "chat toy"}
