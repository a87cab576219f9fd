"""The user API: @agl.rollout, emit_reward, emit_annotation, llm_base_url."""

from __future__ import annotations

import math
import pickle

import pytest

import agentlightning as agl
from agentlightning import semconv
from agentlightning.runner import RolloutAgent, reward_from_result
from agentlightning.store import MemoryStore


@agl.rollout
def task_only(task):
    return task * 2


@agl.rollout
def with_resources(task, resources):
    return (task, resources)


@agl.rollout
async def async_agent(task, resources=None):
    return task


async def _claim(store: MemoryStore) -> tuple[str, str]:
    await store.enqueue_rollout({"q": 1})
    claim = await store.dequeue_rollout("test")
    assert claim is not None
    return claim.rollout.rollout_id, claim.attempt.attempt_id


def test_decorator_detects_arity_and_kind() -> None:
    assert isinstance(task_only, RolloutAgent)
    assert not task_only.takes_resources and not task_only.is_async
    assert with_resources.takes_resources and not with_resources.is_async
    assert async_agent.takes_resources and async_agent.is_async
    assert task_only.invoke(3, None) == 6
    assert with_resources.invoke(1, "r") == (1, "r")
    assert task_only.__name__ == "task_only"


def test_decorated_function_is_a_plain_call_outside_a_runner() -> None:
    assert task_only(21) == 42
    assert with_resources("t", "r") == ("t", "r")


def test_module_level_agent_pickles_by_name() -> None:
    assert pickle.loads(pickle.dumps(task_only)) is task_only


@pytest.mark.parametrize(
    "fn",
    [
        lambda: 1,
        lambda a, b, c: 1,
        lambda a, *, key: 1,
    ],
)
def test_decorator_rejects_signatures_it_cannot_call(fn) -> None:
    with pytest.raises(TypeError, match=r"signature|first positional"):
        agl.rollout(fn)


def test_decorator_rejects_non_callables() -> None:
    with pytest.raises(TypeError, match="needs a function"):
        agl.rollout(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("result", "expected"),
    [(1, 1.0), (0.5, 0.5), (None, None), ({"reward": 2}, 2.0), ({"reward": None, "extra": 1}, None)],
)
def test_final_reward_accepts(result, expected) -> None:
    assert reward_from_result(result) == expected


@pytest.mark.parametrize(
    ("result", "error"),
    [("1.0", TypeError), (True, TypeError), ({"score": 1}, TypeError), (math.nan, ValueError), (math.inf, ValueError)],
)
def test_final_reward_rejects(result, error) -> None:
    with pytest.raises(error):
        reward_from_result(result)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("1", TypeError, "must be a number"),
        (None, TypeError, "must be a number"),
        (True, TypeError, "must be a number"),
        (math.nan, ValueError, "finite"),
        (-math.inf, ValueError, "finite"),
    ],
)
async def test_emit_reward_validates_value(value, error, match) -> None:
    store = MemoryStore()
    rid, aid = await _claim(store)
    with agl.rollout_context(store, rid, aid), pytest.raises(error, match=match):
        agl.emit_reward(value)
    await agl.aflush(10)
    assert await store.query_spans(rid) == []  # nothing was recorded


async def test_emit_reward_records_a_zero_duration_reward_span() -> None:
    store = MemoryStore()
    rid, aid = await _claim(store)
    with agl.rollout_context(store, rid, aid):
        agl.emit_reward(0.25, name="format")
        agl.emit_reward(1, final=True)
    await agl.aflush(10)
    first, second = await store.query_spans(rid, aid)
    assert first.attributes[semconv.SPAN_KIND] == semconv.KIND_REWARD
    assert first.attributes[semconv.REWARD_VALUE] == 0.25
    assert first.attributes[semconv.REWARD_NAME] == "format"
    assert first.attributes[semconv.REWARD_FINAL] is False
    assert first.start_time == first.end_time
    assert second.attributes[semconv.REWARD_VALUE] == 1.0
    assert second.attributes[semconv.REWARD_FINAL] is True
    assert semconv.REWARD_NAME not in second.attributes


def test_emit_outside_a_rollout_warns_and_records_nothing() -> None:
    processor = agl.tracing.get_span_processor()
    dropped = processor.dropped_outside_rollout
    with pytest.warns(UserWarning, match="outside a rollout"):
        agl.emit_reward(1.0)
    with pytest.warns(UserWarning, match="outside a rollout"):
        agl.emit_annotation(note="x")
    assert processor.dropped_outside_rollout == dropped  # no span was even started


async def test_emit_annotation_prefixes_attributes() -> None:
    store = MemoryStore()
    rid, aid = await _claim(store)
    with agl.rollout_context(store, rid, aid):
        agl.emit_annotation(tool="search", hits=3, scores=[0.5, 1.0])
    await agl.aflush(10)
    [span] = await store.query_spans(rid)
    assert span.attributes[semconv.SPAN_KIND] == semconv.KIND_ANNOTATION
    assert span.attributes[semconv.ANNOTATION_PREFIX + "tool"] == "search"
    assert span.attributes[semconv.ANNOTATION_PREFIX + "hits"] == 3
    assert span.attributes[semconv.ANNOTATION_PREFIX + "scores"] == [0.5, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({}, ValueError), ({"x": math.nan}, ValueError), ({"x": {"a": 1}}, TypeError), ({"x": [1, "a"]}, TypeError)],
)
def test_emit_annotation_rejects_bad_values(kwargs, error) -> None:
    with pytest.raises(error):
        agl.emit_annotation(**kwargs)


async def test_llm_base_url() -> None:
    store = MemoryStore()
    rid, aid = await _claim(store)
    with pytest.raises(RuntimeError, match="outside a rollout"):
        agl.llm_base_url()
    with agl.rollout_context(store, rid, aid), pytest.raises(RuntimeError, match="no LLM resource"):
        agl.llm_base_url()
    resources = agl.Resources(
        resources_id="r1", items={"llm": agl.LLMResource(endpoint="http://127.0.0.1:9/", model="m")}
    )
    with agl.rollout_context(store, rid, aid, resources):
        assert agl.llm_base_url() == f"http://127.0.0.1:9/rollout/{rid}/attempt/{aid}/v1"
