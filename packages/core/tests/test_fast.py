"""Trusted construction (`agentlightning._fast`) gives the objects validated construction gives, for generated data.

Past the store boundary records are built without validation: transitions and training samples from stored
records, and records read back from a store's JSON. Each property below builds the same data both ways and
compares the objects and their serialised form (which also tells ``1`` from ``1.0``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from agentlightning import (
    LLMCall,
    Resources,
    Span,
    TrainingSample,
    Transition,
    TransitionBuilder,
    TransitionConfig,
    build_training_batch,
)
from agentlightning import semconv as sc
from agentlightning._fast import (
    call_from_json,
    calls_from_json,
    fast_model,
    fast_replace,
    resources_from_json,
    span_from_json,
    spans_from_json,
)
from agentlightning._models import SpanEvent, SpanStatus, is_validated

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ids = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f"), min_size=1, max_size=12
)
hex16 = st.text("0123456789abcdef", min_size=16, max_size=16)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
times = st.floats(min_value=0.0, max_value=4e9, allow_nan=False)
ints = st.integers(min_value=-(2**53), max_value=2**53)
attribute_values = st.one_of(
    st.none(),
    st.text(max_size=8),
    st.booleans(),
    ints,
    finite,
    st.lists(st.text(max_size=4), max_size=3),
    st.lists(st.booleans(), max_size=3),
    st.lists(ints, max_size=3),
    st.lists(finite, min_size=1, max_size=3),
)
attributes = st.dictionaries(st.text(max_size=10), attribute_values, max_size=5)


@st.composite
def span_data(draw: st.DrawFn) -> dict[str, Any]:
    start = draw(times)
    return {
        "rollout_id": draw(ids),
        "attempt_id": draw(ids),
        "sequence_id": draw(st.integers(min_value=0, max_value=2**40)),
        "trace_id": draw(hex16) * 2,
        "span_id": draw(hex16),
        "parent_id": draw(st.one_of(st.none(), hex16)),
        "name": draw(st.text(max_size=10)),
        "start_time": start,
        "end_time": start + draw(st.floats(min_value=0.0, max_value=1e4)),
        "attributes": draw(attributes),
        "events": draw(
            st.lists(st.fixed_dictionaries({"name": st.text(max_size=5), "timestamp": times, "attributes": attributes}))
        ),
        "status": draw(
            st.one_of(
                st.just({}),
                st.fixed_dictionaries(
                    {"code": st.sampled_from(["unset", "ok", "error"]), "description": st.none() | st.text(max_size=5)}
                ),
            )
        ),
    }


json_values = st.recursive(
    st.none() | st.booleans() | ints | finite | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def call_data(draw: st.DrawFn) -> dict[str, Any]:
    response = draw(st.lists(st.integers(min_value=0, max_value=200_000), max_size=6))
    return {
        "call_id": draw(ids),
        "rollout_id": draw(ids),
        "attempt_id": draw(ids),
        "response_id": draw(st.none() | ids),
        "request": draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
        "response": draw(st.none() | st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
        "prompt_token_ids": draw(st.lists(st.integers(min_value=0, max_value=200_000), max_size=6)),
        "response_token_ids": response,
        "response_logprobs": draw(st.none() | st.lists(finite, min_size=len(response), max_size=len(response))),
        "model": draw(st.none() | st.text(max_size=5)),
        "model_version": draw(st.none() | st.integers(min_value=0, max_value=2**31)),
        "backend": draw(st.none() | st.text(max_size=5)),
        "start_time": draw(times),
        "end_time": draw(st.none() | times),
        "error": draw(st.none() | st.text(max_size=5)),
    }


resource_items = st.one_of(
    st.fixed_dictionaries(
        {
            "kind": st.just("llm"),
            "endpoint": st.text(max_size=10),
            "model": st.text(max_size=5),
            "sampling_parameters": st.dictionaries(st.text(max_size=4), json_values, max_size=2),
            "api_key": st.none() | st.text(max_size=5),
        }
    ),
    st.fixed_dictionaries(
        {
            "kind": st.just("prompt_template"),
            "template": st.text(max_size=10),
            "engine": st.sampled_from(["format", "jinja"]),
        }
    ),
    st.fixed_dictionaries({"kind": st.just("value"), "value": json_values}),
)
resources_data = st.fixed_dictionaries(
    {
        "resources_id": ids,
        "version": st.integers(min_value=0, max_value=1000),
        "items": st.dictionaries(st.text(max_size=6), resource_items, max_size=3),
        "created_at": times,
    }
)


def same(fast: BaseModel, validated: BaseModel) -> None:
    assert fast == validated
    assert fast.model_dump_json() == validated.model_dump_json()  # same types too (1 vs 1.0 would differ here)
    assert is_validated(fast)


@PROPERTY
@given(span_data())
def test_stored_span_reads_back_as_validated(data: dict[str, Any]) -> None:
    span = Span.model_validate(data)
    same(span_from_json(span.model_dump_json()), span)
    same(spans_from_json([span.model_dump_json().encode(), span.model_dump(mode="json")])[1], span)


@PROPERTY
@given(call_data())
def test_stored_llm_call_reads_back_as_validated(data: dict[str, Any]) -> None:
    call = LLMCall.model_validate(data)
    same(call_from_json(call.model_dump_json()), call)
    same(calls_from_json([call.model_dump(mode="json")])[0], call)


@PROPERTY
@given(resources_data)
def test_stored_resources_read_back_as_validated(data: dict[str, Any]) -> None:
    resources = Resources.model_validate(data)
    same(resources_from_json(resources.model_dump_json()), resources)
    same(resources_from_json(resources.model_dump(mode="json")), resources)


@PROPERTY
@given(span_data(), st.integers(min_value=0, max_value=10))
def test_fast_replace_equals_a_validated_copy(data: dict[str, Any], sequence_id: int) -> None:
    span = Span.model_validate(data)
    same(fast_replace(span, sequence_id=sequence_id), Span.model_validate({**data, "sequence_id": sequence_id}))


# ------------------------------------------------------------------- spans + records -> transitions -> samples

TRACE = "ab" * 16


@st.composite
def attempts(draw: st.DrawFn) -> tuple[list[Span], list[LLMCall]]:
    """One attempt: agent spans, LLM spans joined to proxy records (or carrying ids, or neither), rewards."""
    spans: list[Span] = []
    calls: list[LLMCall] = []
    clock = [10.0]
    history: dict[str | None, list[int]] = {}

    def span(name: str, parent: str | None, attrs: dict[str, Any]) -> Span:
        clock[0] += 1.0
        made = Span(
            rollout_id="ro",
            attempt_id="at",
            sequence_id=len(spans),
            trace_id=TRACE,
            span_id=f"{len(spans) + 1:016x}",
            parent_id=parent,
            name=name,
            start_time=clock[0],
            end_time=clock[0] + 0.5,
            attributes=attrs,
        )
        spans.append(made)
        return made

    root = span("rollout", None, {sc.SPAN_KIND: sc.KIND_ROLLOUT})
    agents = {
        name: span("agent", root.span_id, {sc.SPAN_KIND: sc.KIND_AGENT, sc.GEN_AI_AGENT_NAME: name}) for name in "ab"
    }
    proxy_only = draw(st.booleans())
    for step in range(draw(st.integers(min_value=0, max_value=6))):
        if draw(st.integers(min_value=0, max_value=3)) == 0:
            value = draw(st.floats(min_value=-2, max_value=2))
            final = draw(st.none() | st.booleans())
            attrs: dict[str, Any] = {sc.SPAN_KIND: sc.KIND_REWARD, sc.REWARD_VALUE: value}
            if final is not None:
                attrs[sc.REWARD_FINAL] = final
            span("reward", root.span_id, attrs)
            continue
        agent = draw(st.sampled_from([None, "a", "b"]))
        previous = history.get(agent, [])
        extend = previous and draw(st.booleans())
        prompt = previous + draw(st.lists(st.integers(1, 50), min_size=1, max_size=3)) if extend else [1, step]
        response = draw(st.lists(st.integers(1, 50), max_size=3))
        history[agent] = prompt + response
        logprobs = draw(st.none() | st.just([-0.25] * len(response)))
        version = draw(st.none() | st.integers(0, 5))
        how = "record" if proxy_only else draw(st.sampled_from(["record", "attributes", "none"]))
        attrs = {sc.SPAN_KIND: sc.KIND_LLM, sc.GEN_AI_RESPONSE_ID: f"resp-{step}"}
        if how == "attributes":
            attrs.update({sc.PROMPT_TOKEN_IDS: prompt, sc.RESPONSE_TOKEN_IDS: response})
            if logprobs is not None and response:
                attrs[sc.RESPONSE_LOGPROBS] = logprobs
        parent = root.span_id if agent is None else agents[agent].span_id
        if not proxy_only:
            span("chat", parent, attrs)
        if how == "record":
            calls.append(
                LLMCall(
                    call_id=f"call-{step}",
                    rollout_id="ro",
                    attempt_id="at",
                    response_id=f"resp-{step}",
                    prompt_token_ids=prompt,
                    response_token_ids=response,
                    response_logprobs=logprobs,
                    model_version=version,
                    start_time=clock[0] + 0.1,
                )
            )
    if proxy_only:
        spans = [s for s in spans if s.attributes.get(sc.SPAN_KIND) != sc.KIND_AGENT]
    return draw(st.permutations(spans)), calls


@PROPERTY
@given(
    attempts(), st.sampled_from(["per_call", "trajectory"]), st.sampled_from(["identical", "discounted", "per_step"])
)
def test_transitions_and_samples_equal_validated_ones(
    attempt: tuple[list[Span], list[LLMCall]], mode: str, credit: str
) -> None:
    spans, calls = attempt
    config = TransitionConfig(mode=mode, on_missing="skip")  # type: ignore[arg-type]
    result = TransitionBuilder(config).build(spans, calls, group_id="g")
    for transition in result.transitions:
        same(transition, Transition.model_validate(transition.model_dump()))
    batch = build_training_batch(result.transitions, credit, "reinforce_pp")
    for sample in batch.samples:
        same(sample, TrainingSample.model_validate(sample.model_dump()))
        assert all(math.isfinite(x) for x in (sample.credit, sample.advantage))


# ------------------------------------------------------------------- the readers' fallback, the marks


def test_shape_tables_name_exactly_the_model_fields() -> None:
    from agentlightning import _fast as fast
    from agentlightning._models import LLMResource, PromptTemplateResource, ValueResource

    tables = {
        Span: fast._SPAN_TYPES,  # pyright: ignore[reportPrivateUsage]
        SpanStatus: fast._STATUS_TYPES,  # pyright: ignore[reportPrivateUsage]
        SpanEvent: fast._EVENT_TYPES,  # pyright: ignore[reportPrivateUsage]
        LLMCall: fast._CALL_TYPES,  # pyright: ignore[reportPrivateUsage]
        Resources: fast._RESOURCES_TYPES,  # pyright: ignore[reportPrivateUsage]
        LLMResource: fast._RESOURCE_TYPES["llm"],  # pyright: ignore[reportPrivateUsage]
        PromptTemplateResource: fast._RESOURCE_TYPES["prompt_template"],  # pyright: ignore[reportPrivateUsage]
        ValueResource: fast._RESOURCE_TYPES["value"],  # pyright: ignore[reportPrivateUsage]
    }
    for model, table in tables.items():
        assert set(table) == set(model.model_fields), model.__name__


def test_typed_fields_name_exactly_the_training_models_fields_in_order() -> None:
    from agentlightning._training_models import (
        TrainingSample,
        TrainingSampleFields,
        Transition,
        TransitionFields,
    )

    for model, fields in ((Transition, TransitionFields), (TrainingSample, TrainingSampleFields)):
        assert list(fields.__annotations__) == list(model.model_fields), model.__name__


def test_records_in_an_older_layout_are_validated_not_half_built() -> None:
    span = Span(
        rollout_id="r", attempt_id="a", sequence_id=0, trace_id="0" * 32, span_id="1" * 16, name="x",
        start_time=1.0, end_time=2.0,
    )  # fmt: skip
    old = span.model_dump(mode="json")
    del old["events"]  # a field added later: its default is filled in
    assert span_from_json(Span.model_validate(old).model_dump_json()) == span
    assert spans_from_json([old]) == [span]
    with pytest.raises(ValidationError, match="start_time"):  # NaN stored as null by an older version
        spans_from_json([{**old, "start_time": None}])
    with pytest.raises(ValueError):  # NaN itself never reads back
        span_from_json(span.model_dump_json().replace('"start_time":1.0', '"start_time":NaN'))
    call = LLMCall(call_id="c", rollout_id="r", attempt_id="a", response_token_ids=[1], response_logprobs=[-1.0])
    with pytest.raises(ValidationError, match="response_logprobs"):
        call_from_json(call.model_dump_json().replace("[-1.0]", "[null]"))


def test_only_models_made_without_validation_are_marked() -> None:
    data = {"rollout_id": "r", "attempt_id": "a", "sequence_id": 0, "trace_id": "0" * 32, "span_id": "1" * 16}
    span = Span(**data, name="x", start_time=1.0, end_time=2.0)
    assert is_validated(span) and is_validated(Span.model_validate(span.model_dump()))
    assert is_validated(span.model_copy()) and is_validated(fast_model(Span, dict(span.__dict__)))
    assert not is_validated(Span.model_construct(**span.__dict__))
    assert not is_validated(span.model_copy(update={"name": "y"}))
    assert not is_validated(Span.model_construct(**span.__dict__).model_copy())  # a copy keeps the mark
