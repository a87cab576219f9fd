"""Spans + proxy records -> transitions: joins, agents, filters, rewards, trajectory merging, missing ids."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from pydantic import ValidationError

from agentlightning import (
    LLMCall,
    MissingTokenIdsError,
    Span,
    Transition,
    TransitionBuilder,
    TransitionConfig,
    TransitionResult,
)
from agentlightning import semconv as sc

TRACE_ID = "cd" * 16


class Trace:
    """Builds one attempt's spans and proxy records with a deterministic clock."""

    def __init__(self, rollout_id: str = "ro-1", attempt_id: str = "at-1") -> None:
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.spans: list[Span] = []
        self.calls: list[LLMCall] = []
        self.clock = 100.0

    def span(self, name: str, kind: str | None = None, parent: Span | None = None, **attrs: Any) -> Span:
        self.clock += 1.0
        attributes: dict[str, Any] = dict(attrs.pop("attributes", {}))
        if kind is not None:
            attributes[sc.SPAN_KIND] = kind
        span = Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            sequence_id=len(self.spans),
            trace_id=TRACE_ID,
            span_id=f"{len(self.spans) + 1:016x}",
            parent_id=None if parent is None else parent.span_id,
            name=name,
            start_time=self.clock,
            end_time=self.clock + 0.5,
            attributes=attributes,
        )
        self.spans.append(span)
        return span

    def agent(self, name: str | None, parent: Span | None = None, span_name: str = "agent") -> Span:
        attrs = {} if name is None else {sc.GEN_AI_AGENT_NAME: name}
        return self.span(span_name, sc.KIND_AGENT, parent, attributes=attrs)

    def llm(
        self,
        prompt: list[int],
        response: list[int],
        parent: Span | None = None,
        *,
        record: bool = True,
        logprobs: list[float] | None = None,
        attributes: dict[str, Any] | None = None,
        response_id: str | None = "auto",
        version: int | None = 3,
    ) -> Span:
        rid = f"chatcmpl-{len(self.spans) + 1}" if response_id == "auto" else response_id
        attrs = dict(attributes or {})
        if rid is not None:
            attrs[sc.GEN_AI_RESPONSE_ID] = rid
        span = self.span("chat", sc.KIND_LLM, parent, attributes=attrs)
        if record:
            self.calls.append(
                LLMCall(
                    call_id=f"call-{span.span_id}",
                    rollout_id=self.rollout_id,
                    attempt_id=self.attempt_id,
                    response_id=rid,
                    prompt_token_ids=prompt,
                    response_token_ids=response,
                    response_logprobs=logprobs if logprobs is not None else [-0.5] * len(response),
                    model_version=version,
                    start_time=span.start_time,
                )
            )
        return span

    def reward(self, value: Any, final: bool | None = None, parent: Span | None = None) -> Span:
        attrs: dict[str, Any] = {sc.REWARD_VALUE: value}
        if final is not None:
            attrs[sc.REWARD_FINAL] = final
        return self.span("reward", sc.KIND_REWARD, parent, attributes=attrs)


def build(trace: Trace, **config: Any) -> TransitionResult:
    return TransitionBuilder(TransitionConfig(**config)).build(trace.spans, trace.calls, group_id="g-1")


def test_per_call_joins_by_response_id_and_credits_rewards() -> None:
    t = Trace()
    root = t.span("rollout", sc.KIND_ROLLOUT)
    agent = t.agent("solver", root)
    t.llm([1, 2, 3], [4, 5], agent, logprobs=[-0.1, -0.2])
    tool = t.span("calculator", sc.KIND_TOOL, agent)
    t.reward(0.25, parent=tool)  # intermediate: after call 0
    t.reward(0.5, parent=tool)
    t.llm([1, 2, 3, 4, 5, 9], [6], agent)
    t.reward(1.0, final=True, parent=root)
    spans = t.spans[:]
    random.Random(7).shuffle(spans)  # arrival order must not matter
    result = TransitionBuilder().build(spans, t.calls, group_id="g-1")

    first, second = result.transitions
    assert (first.prompt_token_ids, first.response_token_ids, first.response_mask) == ([1, 2, 3], [4, 5], [1, 1])
    assert first.response_logprobs == [-0.1, -0.2]
    assert (first.agent_name, first.step_index, first.group_id) == ("solver", 0, "g-1")
    assert first.intermediate_reward == pytest.approx(0.75) and second.intermediate_reward is None
    assert first.final_reward == second.final_reward == 1.0 == result.final_reward
    assert second.step_index == 1 and second.call_ids == [f"call-{t.spans[6].span_id}"]
    assert first.metadata == {"span_ids": [t.spans[2].span_id]}
    assert first.model_version == second.model_version == 3  # the served version, from the proxy's record
    d = result.diagnostics
    assert (d.llm_spans, d.calls_trained, d.joined_by_response_id, d.rewards, d.transitions) == (2, 2, 2, 3, 2)
    assert d.unused_llm_calls == 0 and result.problems == []
    # the fast construction produces exactly what validation would
    for tr in result.transitions:
        assert Transition.model_validate(tr.model_dump()) == tr


def test_last_reward_is_final_when_none_is_marked() -> None:
    t = Trace()
    t.llm([1], [2])
    t.reward(0.1)
    t.llm([1, 2, 3], [4])
    t.reward(0.7)
    result = build(t)
    assert result.final_reward == 0.7
    assert [tr.intermediate_reward for tr in result.transitions] == [0.1, None]


def test_reward_problems_are_reported() -> None:
    t = Trace()
    t.reward(0.3)  # before any call: cannot be credited
    t.llm([1], [2])
    t.reward("high")  # not a number
    t.reward(True)  # a bool is not a reward (NaN cannot reach a span: the model refuses it)
    t.reward(0.2, final=True)
    t.reward(0.9, final=True)
    result = build(t)
    d = result.diagnostics
    assert (d.unattached_rewards, d.invalid_rewards, d.multiple_final_rewards) == (1, 2, 1)
    assert result.final_reward == 0.9
    assert result.transitions[0].intermediate_reward == 0.2  # the earlier final-marked reward counts as intermediate
    assert any("'high'" in p for p in result.problems)


def test_agent_name_resolution() -> None:
    t = Trace()
    outer = t.agent("planner")
    inner = t.agent(None, outer, span_name="CoderAgent")  # no gen_ai.agent.name: the span name
    tool = t.span("tool", sc.KIND_TOOL, inner)
    t.llm([1], [2], tool)  # nearest agent ancestor, through a tool span
    t.llm([1], [3], outer, attributes={sc.GEN_AI_AGENT_NAME: "critic"})  # the span's own name wins
    t.llm([1], [4])  # outside any agent
    assert [tr.agent_name for tr in build(t).transitions] == ["CoderAgent", "critic", None]


@pytest.mark.parametrize(
    ("agent_filter", "expected"),
    [
        (["writer"], ["writer", "writer"]),
        (["writer", "reviewer"], ["writer", "reviewer", "writer"]),
        ("rev.*", ["reviewer"]),
        ("view", []),  # a regex must match the whole name
        (None, ["writer", "reviewer", "writer", None]),
    ],
)
def test_multi_agent_filter(agent_filter: Any, expected: list[str | None]) -> None:
    t = Trace()
    writer = t.agent("writer")
    reviewer = t.agent("reviewer")
    t.llm([1], [2], writer)
    t.llm([1], [3], reviewer)
    t.llm([1, 2, 5], [6], writer)
    t.llm([7], [8])  # no agent: trained only without a filter
    result = build(t, agent_filter=agent_filter)
    assert [tr.agent_name for tr in result.transitions] == expected
    assert [tr.step_index for tr in result.transitions] == list(range(len(expected)))
    assert result.diagnostics.calls_filtered == 4 - len(expected)


def test_token_ids_from_span_attributes_when_no_proxy_record() -> None:
    t = Trace()
    t.llm(
        [1, 2],
        [3, 4],
        record=False,
        attributes={sc.PROMPT_TOKEN_IDS: [1, 2], sc.RESPONSE_TOKEN_IDS: [3, 4], sc.RESPONSE_LOGPROBS: [-1.0, -2.0]},
    )
    result = build(t)
    (tr,) = result.transitions
    assert (tr.prompt_token_ids, tr.response_token_ids, tr.response_logprobs, tr.call_ids) == (
        [1, 2],
        [3, 4],
        [-1.0, -2.0],
        [],
    )
    assert result.diagnostics.joined_by_span_attributes == 1


def test_order_fallback_joins_unreferenced_proxy_records_and_reports_it(caplog: pytest.LogCaptureFixture) -> None:
    t = Trace()
    t.llm([1], [2], record=False, response_id=None)
    t.llm([1, 2, 3], [4], record=False, response_id="not-recorded")
    # the proxy recorded two calls whose response ids no span mentions
    for n, (p, r) in enumerate([([1], [2]), ([1, 2, 3], [4])]):
        t.calls.append(
            LLMCall(
                call_id=f"px-{n}",
                rollout_id="ro-1",
                attempt_id="at-1",
                response_id=f"other-{n}",
                prompt_token_ids=p,
                response_token_ids=r,
                start_time=200.0 + n,
            )
        )
    with pytest.raises(MissingTokenIdsError, match=r"order_fallback=True\) would join them by order"):
        build(t)  # joining by a guess is opt-in
    with caplog.at_level(logging.WARNING, logger="agentlightning.transitions._builder"):
        result = build(t, order_fallback=True)
    assert [tr.call_ids for tr in result.transitions] == [["px-0"], ["px-1"]]
    assert result.diagnostics.joined_by_order == 2
    assert sum("by order" in p for p in result.problems) == 2
    assert any("joined to proxy records by order" in r.getMessage() for r in caplog.records)


def test_calls_without_llm_spans_train_from_proxy_records_alone(caplog: pytest.LogCaptureFixture) -> None:
    # An agent run without its adapter: the runner's root and reward spans, the proxy's records, no LLM span.
    t = Trace()
    root = t.span("rollout", sc.KIND_ROLLOUT)
    for n, (p, r) in enumerate([([1], [2]), ([1, 2, 3], [4, 5])]):
        t.calls.append(
            LLMCall(
                call_id=f"px-{n}",
                rollout_id="ro-1",
                attempt_id="at-1",
                response_id=f"resp-{n}",
                prompt_token_ids=p,
                response_token_ids=r,
                response_logprobs=[-0.5] * len(r),
                model_version=3,
                start_time=t.clock + 0.5 + n,
            )
        )
    t.clock += 5
    t.reward(1.0, parent=root, final=True)
    with caplog.at_level(logging.WARNING, logger="agentlightning.transitions._builder"):
        result = build(t)
        build(t)
    steps = [(tr.prompt_token_ids, tr.response_token_ids, tr.agent_name, tr.step_index) for tr in result.transitions]
    assert steps == [
        ([1], [2], None, 0),
        ([1, 2, 3], [4, 5], None, 1),
    ]
    assert [tr.call_ids for tr in result.transitions] == [["px-0"], ["px-1"]]
    assert all(tr.final_reward == 1.0 and tr.model_version == 3 for tr in result.transitions)
    assert all(Transition.model_validate(tr.model_dump()) == tr for tr in result.transitions)
    merged = build(t, mode="trajectory").transitions  # the proxy's records alone merge into one trajectory too
    merged_steps = [(tr.response_token_ids, tr.response_mask, tr.model_version) for tr in merged]
    assert merged_steps == [([2, 3, 4, 5], [1, 0, 1, 1], 3)]
    assert Transition.model_validate(merged[0].model_dump()) == merged[0]
    assert result.diagnostics.proxy_only_calls == 2 and result.diagnostics.unused_llm_calls == 0
    warnings = [r.getMessage() for r in caplog.records if "no LLM span" in r.getMessage()]
    assert len(warnings) <= 1  # once per process (an earlier test may have used it up)
    # the agent filter needs agent names, which only the adapter gives: nothing is trained, and it is said
    filtered = build(t, agent_filter=["writer"])
    assert filtered.transitions == [] and filtered.diagnostics.calls_filtered == 2


def test_missing_token_ids_raise_naming_the_span() -> None:
    t = Trace(rollout_id="ro-miss", attempt_id="at-miss")
    agent = t.agent("solver")
    t.llm([1], [2], agent)
    lost = t.llm([1], [2], agent, record=False, response_id="chatcmpl-lost")
    with pytest.raises(MissingTokenIdsError) as info:
        build(t)
    message = str(info.value)
    for needle in (lost.span_id, "'chat'", "ro-miss", "at-miss", "chatcmpl-lost", "no proxy record"):
        assert needle in message
    assert [m.span_id for m in info.value.missing] == [lost.span_id]


def test_proxy_record_without_ids_is_named_as_such() -> None:
    t = Trace()
    span = t.llm([], [], record=True)
    t.calls[0] = t.calls[0].model_copy(update={"response_logprobs": None, "error": "backend returned 500"})
    with pytest.raises(MissingTokenIdsError) as info:
        build(t)
    assert span.span_id in str(info.value) and "has no token ids" in str(info.value)
    assert "backend returned 500" in str(info.value)


def test_missing_token_ids_warn_and_skip(caplog: pytest.LogCaptureFixture) -> None:
    t = Trace()
    t.llm([1], [2])
    lost = t.llm([1], [2], record=False)
    with caplog.at_level(logging.WARNING, logger="agentlightning"):
        warned = build(t, on_missing="warn")
    assert len(warned.transitions) == 1 and warned.diagnostics.missing_token_ids == 1
    assert any(lost.span_id in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentlightning"):
        skipped = build(t, on_missing="skip")
    assert len(skipped.transitions) == 1 and caplog.records == []
    assert any(lost.span_id in p for p in skipped.problems)


def test_filtered_agents_need_no_token_ids() -> None:
    t = Trace()
    t.llm([1], [2], t.agent("writer"))
    t.llm([1], [2], t.agent("judge"), record=False)
    assert len(build(t, agent_filter=["writer"]).transitions) == 1


def test_trajectory_merges_exact_prefix_with_masked_observations() -> None:
    t = Trace()
    agent = t.agent("solver")
    t.llm([1, 2], [3, 4], agent, logprobs=[-0.1, -0.2])
    t.reward(0.5)
    t.llm([1, 2, 3, 4, 7, 8], [9], agent, logprobs=[-0.3])  # observation 7, 8
    t.llm([1, 2, 3, 4, 7, 8, 9], [10, 11], agent, logprobs=[-0.4, -0.5])  # nothing in between
    t.reward(1.0, final=True)
    result = build(t, mode="trajectory")
    (tr,) = result.transitions
    assert tr.prompt_token_ids == [1, 2]
    assert tr.response_token_ids == [3, 4, 7, 8, 9, 10, 11]
    assert tr.response_mask == [1, 1, 0, 0, 1, 1, 1]
    assert tr.response_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3, -0.4, -0.5]
    assert tr.intermediate_reward == 0.5 and tr.final_reward == 1.0 and len(tr.call_ids) == 3
    assert result.diagnostics.merged_calls == 2 and result.diagnostics.trajectory_breaks == 0
    assert Transition.model_validate(tr.model_dump()) == tr
    assert t.calls[0].response_token_ids == [3, 4]  # the proxy records were not mutated


@pytest.mark.parametrize(("versions", "merged"), [((5, 4, 5), 4), ((5, None, 5), None)])
def test_a_merged_trajectory_carries_its_oldest_model_version(
    versions: tuple[int | None, ...], merged: int | None
) -> None:
    t = Trace()
    agent = t.agent("solver")
    t.llm([1], [2], agent, version=versions[0])
    t.llm([1, 2, 3], [4], agent, version=versions[1])
    t.llm([1, 2, 3, 4, 5], [6], agent, version=versions[2])
    t.reward(1.0, final=True)
    (tr,) = build(t, mode="trajectory").transitions
    assert tr.model_version == merged and len(tr.call_ids) == 3
    assert Transition.model_validate(tr.model_dump()) == tr


def test_trajectory_non_append_history_starts_a_new_sample() -> None:
    t = Trace()
    agent = t.agent("solver")
    t.llm([1, 2], [3], agent)
    t.llm([1, 2, 3, 5], [6], agent)  # appends
    t.llm([1, 99, 6], [7], agent)  # summarised history: does not start with 1 2 3 5 6
    t.llm([1, 99, 6, 7, 8], [9], agent)  # appends to the new sample
    result = build(t, mode="trajectory")
    assert [tr.response_mask for tr in result.transitions] == [[1, 0, 1], [1, 0, 1]]
    assert [tr.step_index for tr in result.transitions] == [0, 1]
    assert result.diagnostics.trajectory_breaks == 1
    assert any("non-append" in p for p in result.problems)


def test_trajectory_keeps_one_history_per_agent() -> None:
    t = Trace()
    a, b = t.agent("a"), t.agent("b")
    t.llm([1], [2], a)
    t.llm([50], [51], b)
    t.llm([1, 2, 3], [4], a)  # extends a's history although b spoke in between
    t.llm([50, 51], [52], b)
    result = build(t, mode="trajectory")
    assert [(tr.agent_name, tr.response_token_ids) for tr in result.transitions] == [("a", [2, 3, 4]), ("b", [51, 52])]
    assert result.diagnostics.trajectory_breaks == 0


def test_trajectory_without_logprobs_drops_them() -> None:
    t = Trace()
    t.llm([1], [2])
    t.llm([1, 2], [3])
    t.calls[1] = t.calls[1].model_copy(update={"response_logprobs": None})
    (tr,) = build(t, mode="trajectory").transitions
    assert tr.response_logprobs is None and tr.response_token_ids == [2, 3]


def test_spans_of_two_attempts_are_rejected() -> None:
    t = Trace()
    t.llm([1], [2])
    other = Trace(attempt_id="at-2")
    other.llm([1], [2])
    with pytest.raises(ValueError, match="one attempt"):
        TransitionBuilder().build(t.spans + other.spans, t.calls)


def test_foreign_proxy_records_are_ignored_and_reported() -> None:
    t = Trace()
    t.llm([1], [2])
    other = Trace(attempt_id="at-2")
    other.llm([1], [2])
    result = TransitionBuilder().build(t.spans, t.calls + other.calls)
    assert len(result.transitions) == 1 and any("another attempt" in p for p in result.problems)


def test_no_spans() -> None:
    result = TransitionBuilder().build([], [])
    assert result.transitions == [] and result.diagnostics.attempts_without_reward == 1


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"agent_filter": "("}, "not a valid regular expression"),
        ({"agent_filter": []}, "empty list"),
        ({"mode": "turns"}, "mode"),
        ({"on_missing": "ignore"}, "on_missing"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        TransitionConfig(**kwargs)


async def test_transitions_from_store_uses_the_last_attempt() -> None:
    from agentlightning import transitions_from_store
    from agentlightning.store import MemoryStore

    store = MemoryStore()
    rollout = await store.enqueue_rollout({"q": "2+2"}, group_id="task-1", rollout_id="ro-store")
    claim = await store.dequeue_rollout("w")
    assert claim is not None
    first_attempt = claim.attempt.attempt_id
    stale = Trace(rollout.rollout_id, first_attempt)
    stale.llm([1], [2])
    await store.add_spans(stale.spans)
    await store.add_llm_calls(stale.calls)
    await store.finish_attempt(rollout.rollout_id, first_attempt, "failed", error="boom")
    claim = await store.dequeue_rollout("w")
    assert claim is not None and claim.attempt.attempt_id != first_attempt
    t = Trace(rollout.rollout_id, claim.attempt.attempt_id)
    agent = t.agent("solver")
    t.llm([10, 11], [12], agent)
    t.llm([10, 11, 12, 13], [14], agent)
    t.reward(1.0, final=True)
    await store.add_spans(t.spans)
    await store.add_llm_calls(t.calls)
    await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "succeeded")

    transitions = await transitions_from_store(store, [rollout.rollout_id], TransitionConfig())
    assert [tr.response_token_ids for tr in transitions] == [[12], [14]]
    assert {tr.attempt_id for tr in transitions} == {claim.attempt.attempt_id}
    assert {tr.group_id for tr in transitions} == {"task-1"}
    assert {tr.final_reward for tr in transitions} == {1.0}
    merged = await transitions_from_store(store, [rollout.rollout_id], TransitionConfig(mode="trajectory"))
    assert [tr.response_mask for tr in merged] == [[1, 0, 1]]
    with pytest.raises(KeyError, match="ro-nope"):
        await transitions_from_store(store, ["ro-nope"])
    await store.close()


def test_proxy_only_trajectory_break_names_the_record() -> None:
    t = Trace()
    for n, prompt in enumerate([[1], [7, 8]]):  # the second prompt does not extend the first: a new sample
        t.calls.append(
            LLMCall(call_id=f"px-{n}", rollout_id="ro-1", attempt_id="at-1", prompt_token_ids=prompt,
                    response_token_ids=[2], start_time=float(n))
        )  # fmt: skip
    result = build(t, mode="trajectory")
    assert [tr.call_ids for tr in result.transitions] == [["px-0"], ["px-1"]]
    assert any("proxy record px-1" in p and "does not extend" in p for p in result.problems)


# ------------------------------------------------------------------- Transition's rules on the fast path
# Transitions are built without validation (agentlightning._fast); each rule of the model is kept by the builder
# and checked here against validated construction (test_fast.py checks the same for generated attempts).


def _validates(result: TransitionResult) -> None:
    for tr in result.transitions:
        assert Transition.model_validate(tr.model_dump()) == tr


@pytest.mark.parametrize("mode", ["per_call", "trajectory"])
def test_intermediate_rewards_that_overflow_are_reported_not_made_infinite(mode: str) -> None:
    t = Trace()
    t.llm([1], [2])
    t.reward(1e308)
    t.reward(1e308)  # 2e308 is no float: the sum would be inf, which a Transition refuses
    t.llm([1, 2, 3], [4])
    t.reward(1e308)
    t.llm([1, 2, 3, 4, 5], [6])
    t.reward(1.0, final=True)
    result = build(t, mode=mode)
    _validates(result)
    assert result.transitions[0].intermediate_reward == 1e308
    assert result.diagnostics.invalid_rewards == (2 if mode == "trajectory" else 1)  # merging overflows too
    assert any("overflow to a non-finite sum" in p for p in result.problems)


def test_span_logprobs_without_a_float_are_dropped() -> None:
    t = Trace()
    t.llm([1], [2, 3], record=False, attributes={sc.PROMPT_TOKEN_IDS: [1], sc.RESPONSE_TOKEN_IDS: [2, 3],
                                                 sc.RESPONSE_LOGPROBS: [-1, -(10**400)]})  # fmt: skip
    result = build(t)
    _validates(result)
    assert result.transitions[0].response_logprobs is None
    assert any("logprobs that do not match" in p for p in result.problems)


def test_group_id_must_be_a_string() -> None:
    t = Trace()
    t.llm([1], [2])
    with pytest.raises(TypeError, match="group_id must be a string or None, got int"):
        TransitionBuilder().build(t.spans, t.calls, group_id=7)  # type: ignore[arg-type]


def test_a_merged_trajectory_still_counts_its_llm_calls_in_the_iteration_summary() -> None:
    from agentlightning.loop._report import summarize_results

    t = Trace()
    root = t.span("rollout", sc.KIND_ROLLOUT)
    agent = t.agent("solver", root)
    t.llm([1, 2, 3], [4, 5], agent)
    t.llm([1, 2, 3, 4, 5, 9], [6], agent)
    t.reward(1.0, final=True, parent=root)
    lone = Trace()
    lone_root = lone.span("rollout", sc.KIND_ROLLOUT)
    lone.llm([1, 2], [3], lone.agent("solver", lone_root))
    lone.reward(0.0, final=True, parent=lone_root)
    for mode in ("per_call", "trajectory"):
        results = [build(t, mode=mode), build(lone, mode=mode)]
        assert [len(r.transitions) for r in results] == ([2, 1] if mode == "per_call" else [1, 1])
        summary = summarize_results(results)
        # the tool-call rate the quickstart prints: one of two episodes made a second call, whatever the mode
        assert (summary["calls_per_rollout"], summary["multi_call_rate"]) == (1.5, 0.5), mode
