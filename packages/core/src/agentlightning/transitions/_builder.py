"""Spans + proxy records of one attempt -> `Transition`s.

The join rules (see `agentlightning.semconv`):

1. An LLM call is a span whose ``agentlightning.span.kind`` is ``llm``. Its token ids come from the proxy's
   `LLMCall` whose ``response_id`` equals the span's ``gen_ai.response.id``; failing that, from the token-id
   attributes on the span itself; failing that, only with ``order_fallback=True`` (opt-in, counted and warned), from
   the next proxy record that no span references, in time order. Text is never re-tokenised: a trained call
   without ids is reported. An attempt with proxy records but no LLM span at all (an agent run without its
   adapter) gets one transition per record, in time order, without agent names (warned once).
2. The agent of a call is the span's own ``gen_ai.agent.name``, else the nearest enclosing ``agent`` span
   (its ``gen_ai.agent.name``, else its name).
3. Rewards are spans of kind ``reward``. The final reward is the last one marked ``final``; when none is
   marked, the last reward in time order is the final one (an episode usually ends with its verdict).
   Every other reward is intermediate and is credited to the latest trained call that started before it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from agentlightning._fast import fast_factory
from agentlightning._models import AttributeValue, LLMCall, Span
from agentlightning._training_models import Transition
from agentlightning.semconv import (
    GEN_AI_AGENT_NAME,
    GEN_AI_RESPONSE_ID,
    KIND_AGENT,
    KIND_LLM,
    KIND_REWARD,
    PROMPT_TOKEN_IDS,
    RESPONSE_TOKEN_IDS,
    REWARD_FINAL,
    REWARD_VALUE,
    SPAN_KIND,
    SPAN_SOURCE,
)
from agentlightning.transitions._config import (
    MissingTokenIds,
    MissingTokenIdsError,
    TransitionConfig,
    TransitionDiagnostics,
    TransitionResult,
)
from agentlightning.transitions._duplicates import drop_source_duplicates
from agentlightning.transitions._samples import (
    merge_trajectories,
    no_ids_reason,
    proxy_sample,
    reward_overflow,
    span_logprobs,
)
from agentlightning.transitions._tree import build_attempt_tree

__all__ = ["TransitionBuilder"]

logger = logging.getLogger(__name__)

_new_transition = fast_factory(Transition)


def _call_start(call: LLMCall) -> float:
    return call.start_time


def _agent_name(parent_id: str | None, by_id: dict[str, Span], parent_ids: dict[str, str | None]) -> str | None:
    """Name of the nearest ``agent`` span at or above ``parent_id``."""
    while parent_id is not None:
        span = by_id[parent_id]
        attrs = span.attributes
        if attrs.get(SPAN_KIND) == KIND_AGENT:
            name = attrs.get(GEN_AI_AGENT_NAME)
            return name if isinstance(name, str) and name else span.name
        parent_id = parent_ids[parent_id]
    return None


def _int_list(value: AttributeValue) -> list[int] | None:
    if isinstance(value, list) and value and all(type(x) is int for x in value):
        return value  # type: ignore[return-value]  # checked element-wise just above
    return None


def _reward_value(span: Span) -> float | None:
    value = span.attributes.get(REWARD_VALUE)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


_warned_proxy_only = False
_order_warnings = 0


def _warn_proxy_only(rollout_id: str, calls: int, filtered: bool) -> None:
    global _warned_proxy_only
    if _warned_proxy_only:
        return
    _warned_proxy_only = True
    logger.warning(
        "rollout %s has %d LLM call(s) recorded by the proxy but no LLM span: training on the proxy's records "
        "alone, one transition per call. Agent names%s need the framework's adapter (e.g. "
        "agentlightning_langchain.instrument() or agl.instrument_all()). Shown once.",
        rollout_id,
        calls,
        " and the agent_filter (which now trains none of these calls)" if filtered else " and agent_filter",
    )


def _warn_order(rollout_id: str, joined: int) -> None:
    global _order_warnings
    _order_warnings += 1
    if _order_warnings <= 5 or _order_warnings % 100 == 0:
        logger.warning(
            "rollout %s: %d LLM span(s) joined to proxy records by order, a guess (order_fallback=True): the spans "
            "carry no gen_ai.response.id matching a record; check the adapter (%d attempt(s) so far)",
            rollout_id,
            joined,
            _order_warnings,
        )


class TransitionBuilder:
    """Turns one attempt's spans and proxy records into transitions (see the module docstring for the rules).

    For speed, per-call transitions share their token-id lists with the proxy records instead of copying
    them, and are built without re-validating data that was validated when the records were made: treat
    transitions and records as read-only. The builder sits past the store's validation boundary: it takes records
    as a store returns them, or as validated construction (``Span(...)``, ``LLMCall(...)``) makes them; records
    made with ``model_construct`` are not checked here (give them to a store, or validate them, first).

    Example:
        ```python
        result = TransitionBuilder(TransitionConfig(mode="trajectory", agent_filter=["writer"])).build(
            spans, llm_calls, group_id="task-7"
        )
        result.transitions, result.diagnostics.trajectory_breaks, result.problems
        ```
    """

    def __init__(self, config: TransitionConfig | None = None) -> None:
        """Create a builder.

        Args:
            config: Conversion settings (defaults: per-call transitions, all agents, raise on missing ids).
        """
        self.config = config or TransitionConfig()

    def build(
        self, spans: Sequence[Span], llm_calls: Sequence[LLMCall] = (), *, group_id: str | None = None
    ) -> TransitionResult:
        """Convert one attempt.

        Args:
            spans: The attempt's spans, in any order.
            llm_calls: The attempt's proxy records (records of other attempts are ignored and reported).
            group_id: Group of the rollout, copied onto every transition.

        Returns:
            Transitions in step order with diagnostics and problems.

        Raises:
            ValueError: ``spans`` belong to more than one attempt.
            MissingTokenIdsError: A trained call has no token ids and ``on_missing`` is ``raise``.
        """
        if group_id is not None and not isinstance(group_id, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"group_id must be a string or None, got {type(group_id).__name__}")
        diag = TransitionDiagnostics(attempts=1, spans=len(spans))
        problems: list[str] = []
        if not spans and not llm_calls:
            diag.attempts_without_reward = 1
            return TransitionResult(None, None, [], None, diag, problems)
        first = spans[0] if spans else llm_calls[0]
        rollout_id = first.rollout_id
        attempt_id = first.attempt_id

        # Checks every input span (a foreign one could share a span id with one of ours) before using any.
        tree = build_attempt_tree(spans, rollout_id, attempt_id)
        diag.orphan_spans = len(tree.orphans)
        diag.duplicate_spans = len(tree.duplicates)
        diag.cycle_spans = len(tree.cycles)
        if diag.orphan_spans or diag.duplicate_spans or diag.cycle_spans:
            problems.extend(tree.problems)

        # One pass in (start_time, sequence_id) order: LLM spans and reward spans are the only events.
        # An event is (span, response id, None) for a call or (span, reward value, is final) for a reward.
        events: list[tuple[Span | None, Any, bool | None]] = []  # None: a proxy record without an LLM span
        referenced: set[Any] = set()
        final_index: int | None = None
        last_final: int | None = None
        finals = 0
        sourced = False  # an LLM span read from another instrumentation (it may duplicate one of ours)
        for span in tree.ordered:
            attrs = span.attributes
            kind = attrs.get(SPAN_KIND)
            if kind == KIND_LLM:
                response_id = attrs.get(GEN_AI_RESPONSE_ID)
                if response_id is not None:
                    referenced.add(response_id)
                diag.llm_spans += 1
                events.append((span, response_id, None))
                if SPAN_SOURCE in attrs:
                    sourced = True
            elif kind == KIND_REWARD:
                value = _reward_value(span)
                if value is None:
                    diag.invalid_rewards += 1
                    problems.append(
                        f"reward span {span.span_id} has no finite numeric {REWARD_VALUE} "
                        f"({attrs.get(REWARD_VALUE)!r}); ignored"
                    )
                    continue
                diag.rewards += 1
                final_index = len(events)
                is_final = attrs.get(REWARD_FINAL) is True
                if is_final:
                    finals += 1
                    last_final = final_index
                events.append((span, value, is_final))
        if last_final is not None:  # else the last reward is the final one
            final_index = last_final
        if sourced:
            final_event = events[final_index] if final_index is not None else None
            events, dropped = drop_source_duplicates(events, tree.parent_ids, tree.by_id)
            if dropped:
                diag.duplicate_spans += dropped
                diag.llm_spans -= dropped
                problems.append(
                    f"{dropped} LLM span(s) of another instrumentation recorded a call that an adapter's span also "
                    "recorded; the adapter's span was kept"
                )
                final_index = next((i for i, e in enumerate(events) if e is final_event), None)
        if finals > 1:
            diag.multiple_final_rewards = 1
            problems.append(f"{finals} rewards are marked final; the last one is used")

        by_response: dict[Any, LLMCall] = {}
        unreferenced: list[LLMCall] = []
        foreign = 0
        for call in llm_calls:
            values = call.__dict__  # faster than attribute reads on a pydantic model (it defines __getattr__)
            if values["attempt_id"] != attempt_id or values["rollout_id"] != rollout_id:
                foreign += 1
                continue
            response_id = values["response_id"]
            if response_id is not None and response_id in referenced:
                if response_id not in by_response:
                    by_response[response_id] = call
            else:
                unreferenced.append(call)
        if foreign:
            problems.append(f"ignored {foreign} proxy record(s) of another attempt than {rollout_id}/{attempt_id}")
        if len(unreferenced) > 1:
            unreferenced.sort(key=_call_start)
        next_unreferenced = 0
        proxy_only = 0
        if not diag.llm_spans and unreferenced:
            # Calls but no LLM span: the agent ran without its adapter. The proxy's records alone still make one
            # transition per call (in time order, no agent name), so a plain OpenAI-compatible agent trains as is.
            proxy_only = len(unreferenced)
            _warn_proxy_only(rollout_id, proxy_only, self.config.agent_filter is not None)
            problems.append(
                f"{proxy_only} proxy record(s) and no LLM span: one transition per record, without agent names"
            )
            rewards = [(event[0].start_time if event[0] else 0.0, i, event) for i, event in enumerate(events)]
            calls = [(call.start_time, len(events) + i, (None, call, None)) for i, call in enumerate(unreferenced)]
            merged = sorted(rewards + calls, key=lambda item: (item[0], item[1]))
            final_event = events[final_index] if final_index is not None else None
            events = [item[2] for item in merged]
            final_index = next((i for i, e in enumerate(events) if e is final_event), None)
            unreferenced = []

        config = self.config
        order_fallback = config.order_fallback
        no_filter = config.agent_filter is None
        trains = config.trains
        per_call = config.mode != "trajectory"
        # The final reward is known up front, so per-call transitions are made as soon as their call is read.
        final_reward: float | None = events[final_index][1] if final_index is not None else None
        # Each trained call becomes a dict that is the future Transition's __dict__ (see _fast.py); in per-call
        # mode the Transition is made at once around the same dict, so later intermediate rewards still land.
        samples: list[dict[str, Any]] = []
        transitions: list[Transition] = []
        new_transition = _new_transition
        missing: list[MissingTokenIds] = []
        by_id = tree.by_id
        parent_ids = tree.parent_ids
        agent_cache: dict[str | None, str | None] = {}
        joined: set[int] = set()
        joined_by_order = 0
        for index, (span, key, is_final) in enumerate(events):
            if is_final is not None:  # a reward
                if index == final_index:
                    pass
                elif samples:
                    last = samples[-1]
                    total = key if last["reward"] is None else last["reward"] + key
                    if math.isfinite(total):
                        last["reward"] = total
                    else:
                        reward_overflow(f"reward span {span.span_id if span is not None else '?'}", diag, problems)
                else:
                    diag.unattached_rewards += 1
                    where = span.span_id if span is not None else "?"
                    problems.append(f"reward span {where} comes before any trained LLM call: not credited")
                continue

            if span is None:  # a proxy record without an LLM span (see proxy_only above)
                call = key
                if not (no_filter or trains(None)):
                    diag.calls_filtered += 1
                    continue
                joined.add(id(call))
                prompt, response = call.prompt_token_ids, call.response_token_ids
                if not prompt or not response:
                    missing.append(MissingTokenIds("-", "(no LLM span)", rollout_id, attempt_id, no_ids_reason(call)))
                    continue
                step = len(samples)
                samples.append(proxy_sample(rollout_id, attempt_id, group_id, None, step, call, None, final_reward))
                if per_call:
                    transitions.append(new_transition(samples[-1]))
                continue
            values = span.__dict__  # faster than attribute reads on a pydantic model (it defines __getattr__)
            attrs = values["attributes"]
            span_id = values["span_id"]
            agent = attrs.get(GEN_AI_AGENT_NAME)
            if not isinstance(agent, str) or not agent:
                parent_id = parent_ids[span_id]
                if parent_id in agent_cache:
                    agent = agent_cache[parent_id]
                else:
                    agent = agent_cache[parent_id] = _agent_name(parent_id, by_id, parent_ids)
            # Join first (even for filtered agents) so the order fallback stays aligned with the proxy records.
            call = by_response.get(key) if key is not None else None
            if call is not None:
                joined.add(id(call))
                if not (no_filter or trains(agent)):
                    diag.calls_filtered += 1
                    continue
                values = call.__dict__
                prompt = values["prompt_token_ids"]
                response = values["response_token_ids"]
                if not prompt or not response:
                    reason = no_ids_reason(call)
                    missing.append(MissingTokenIds(span.span_id, span.name, rollout_id, attempt_id, reason))
                    continue
                logprobs = values["response_logprobs"]
                call_id = values["call_id"]
                model_version = values["model_version"]
                policy = values["policy"]
            else:
                call_id = None
                model_version = None
                policy = None
                prompt = _int_list(attrs.get(PROMPT_TOKEN_IDS))
                response = _int_list(attrs.get(RESPONSE_TOKEN_IDS))
                if prompt is None or response is None:
                    prompt = response = None
                    if order_fallback and next_unreferenced < len(unreferenced):
                        call = unreferenced[next_unreferenced]
                        next_unreferenced += 1
                        joined_by_order += 1
                        problems.append(
                            f"LLM span {span.span_id} ({span.name!r}) was joined to proxy record {call.call_id} by "
                            "order: the span has no matching gen_ai.response.id"
                        )
                if call is not None:
                    joined.add(id(call))
                if not (no_filter or trains(agent)):
                    diag.calls_filtered += 1
                    continue

                if call is not None:
                    prompt = call.prompt_token_ids
                    response = call.response_token_ids
                    logprobs = call.response_logprobs
                    call_id, model_version, policy = call.call_id, call.model_version, call.policy
                    if not prompt or not response:
                        reason = no_ids_reason(call)
                        missing.append(MissingTokenIds(span.span_id, span.name, rollout_id, attempt_id, reason))
                        continue
                elif prompt is not None and response is not None:
                    logprobs = span_logprobs(span, response, problems)
                    diag.joined_by_span_attributes += 1
                else:
                    reason = (
                        f"no proxy record has response id {key!r}"
                        if key is not None
                        else "the span has no gen_ai.response.id"
                    )
                    reason += " and the span carries no token ids"
                    if order_fallback:
                        reason += " (no unreferenced proxy record was left to match by order)"
                    elif unreferenced:
                        reason += (
                            f" ({len(unreferenced)} proxy record(s) are referenced by no span; "
                            "TransitionConfig(order_fallback=True) would join them by order, a guess)"
                        )
                    missing.append(MissingTokenIds(span.span_id, span.name, rollout_id, attempt_id, reason))
                    continue
            sample: dict[str, Any] = {
                "rollout_id": rollout_id,
                "attempt_id": attempt_id,
                "group_id": group_id,
                "agent_name": agent,
                "step_index": len(samples),
                "prompt_ids": prompt,
                "response_ids": response,
                "response_mask": [1] * len(response),
                "logprobs": logprobs,
                "reward": None,
                "final_reward": final_reward,
                "call_ids": [] if call_id is None else [call_id],
                "model_version": model_version,
                "policy": policy,
                "metadata": {"span_ids": [span_id]},
            }
            samples.append(sample)
            if per_call:
                transitions.append(new_transition(sample))

        diag.joined_by_order = joined_by_order
        diag.proxy_only_calls = proxy_only
        diag.joined_by_response_id = len(joined) - joined_by_order - proxy_only
        if joined_by_order:
            _warn_order(rollout_id, joined_by_order)
        diag.unused_llm_calls = len(llm_calls) - foreign - len(joined)
        if final_reward is None:
            diag.attempts_without_reward = 1
        if missing:
            diag.missing_token_ids = len(missing)
            problems.extend(str(item) for item in missing)
            if config.on_missing == "raise":
                raise MissingTokenIdsError(missing)
            if config.on_missing == "warn":
                for item in missing:
                    logger.warning("skipping LLM call without token ids: %s", item)
        diag.calls_trained = len(samples)

        if not per_call:
            transitions = [new_transition(sample) for sample in merge_trajectories(samples, diag, problems)]
        diag.transitions = len(transitions)
        return TransitionResult(rollout_id, attempt_id, transitions, final_reward, diag, problems)
