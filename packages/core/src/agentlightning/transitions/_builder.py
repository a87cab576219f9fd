"""Spans + proxy records of one attempt -> `Transition`s.

The join rules (see `agentlightning.semconv`):

1. An LLM call is a span whose ``agentlightning.span.kind`` is ``llm``. Its token ids come from the proxy's
   `LLMCall` whose ``response_id`` equals the span's ``gen_ai.response.id``; failing that, from the token-id
   attributes on the span itself; failing that (``order_fallback``), from the next proxy record that no span
   references, in time order. Text is never re-tokenised: a trained call without ids is reported.
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

from agentlightning._models import AttributeValue, LLMCall, Span, Transition
from agentlightning.semconv import (
    GEN_AI_AGENT_NAME,
    GEN_AI_RESPONSE_ID,
    KIND_AGENT,
    KIND_LLM,
    KIND_REWARD,
    PROMPT_TOKEN_IDS,
    RESPONSE_LOGPROBS,
    RESPONSE_TOKEN_IDS,
    REWARD_FINAL,
    REWARD_VALUE,
    SPAN_KIND,
)
from agentlightning.transitions._config import (
    MissingTokenIds,
    MissingTokenIdsError,
    TransitionConfig,
    TransitionDiagnostics,
    TransitionResult,
)
from agentlightning.transitions._fast import fast_model
from agentlightning.transitions._tree import TraceNode, build_trace_tree

__all__ = ["TransitionBuilder"]

logger = logging.getLogger(__name__)


class _Call:
    """A trained LLM call on its way to becoming (part of) a transition."""

    __slots__ = ("agent", "call_id", "logprobs", "model_version", "prompt", "response", "reward", "span_id")

    def __init__(
        self,
        span_id: str,
        call_id: str | None,
        agent: str | None,
        prompt: list[int],
        response: list[int],
        logprobs: list[float] | None,
        model_version: int | None,
    ) -> None:
        self.span_id = span_id
        self.call_id = call_id
        self.agent = agent
        self.prompt = prompt
        self.response = response
        self.logprobs = logprobs
        self.model_version = model_version
        self.reward: float | None = None


def _agent_name(node: TraceNode) -> str | None:
    span = node.span
    assert span is not None
    own = span.attributes.get(GEN_AI_AGENT_NAME)
    if isinstance(own, str) and own:
        return own
    parent = node.parent
    while parent is not None:
        pspan = parent.span
        if pspan is None:
            return None
        attrs = pspan.attributes
        if attrs.get(SPAN_KIND) == KIND_AGENT:
            name = attrs.get(GEN_AI_AGENT_NAME)
            return name if isinstance(name, str) and name else pspan.name
        parent = parent.parent
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


class TransitionBuilder:
    """Turns one attempt's spans and proxy records into transitions (see the module docstring for the rules).

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
        diag = TransitionDiagnostics(attempts=1, spans=len(spans))
        problems: list[str] = []
        if not spans:
            if llm_calls:
                diag.unused_llm_calls = len(llm_calls)
                problems.append(f"{len(llm_calls)} proxy record(s) but no spans: nothing to join them to")
            diag.attempts_without_reward = 1
            return TransitionResult(None, None, [], None, diag, problems)
        rollout_id = spans[0].rollout_id
        attempt_id = spans[0].attempt_id
        for span in spans:
            if span.attempt_id != attempt_id or span.rollout_id != rollout_id:
                raise ValueError(
                    "TransitionBuilder.build converts one attempt at a time, but got spans of "
                    f"{rollout_id}/{attempt_id} and {span.rollout_id}/{span.attempt_id}"
                )

        tree = build_trace_tree(spans)
        diag.orphan_spans = len(tree.orphans)
        diag.duplicate_spans = len(tree.duplicates)
        diag.cycle_spans = len(tree.cycles)
        if diag.orphan_spans or diag.duplicate_spans or diag.cycle_spans:
            problems.extend(tree.problems)

        # One pass in (start_time, sequence_id) order: LLM spans and reward spans are the only events.
        events: list[tuple[bool, Span]] = []  # (is_llm, span)
        referenced: set[Any] = set()
        for span in tree.ordered:
            kind = span.attributes.get(SPAN_KIND)
            if kind == KIND_LLM:
                events.append((True, span))
                response_id = span.attributes.get(GEN_AI_RESPONSE_ID)
                if response_id is not None:
                    referenced.add(response_id)
            elif kind == KIND_REWARD:
                events.append((False, span))

        by_response: dict[Any, LLMCall] = {}
        unreferenced: list[LLMCall] = []
        foreign = 0
        for call in llm_calls:
            if call.attempt_id != attempt_id or call.rollout_id != rollout_id:
                foreign += 1
                continue
            if call.response_id is not None and call.response_id in referenced:
                by_response.setdefault(call.response_id, call)
            else:
                unreferenced.append(call)
        if foreign:
            problems.append(f"ignored {foreign} proxy record(s) of another attempt than {rollout_id}/{attempt_id}")
        unreferenced.sort(key=lambda c: c.start_time)
        next_unreferenced = 0

        final_index = self._final_reward_index(events, problems, diag)
        config = self.config
        calls: list[_Call] = []
        missing: list[MissingTokenIds] = []
        nodes = tree.nodes
        final_reward: float | None = None
        joined: set[int] = set()
        for index, (is_llm, span) in enumerate(events):
            if not is_llm:
                value = _reward_value(span)
                if value is None:
                    continue  # reported by _final_reward_index
                if index == final_index:
                    final_reward = value
                elif calls:
                    last = calls[-1]
                    last.reward = value if last.reward is None else last.reward + value
                else:
                    diag.unattached_rewards += 1
                    problems.append(f"reward span {span.span_id} comes before any trained LLM call: not credited")
                continue

            diag.llm_spans += 1
            attrs = span.attributes
            agent = _agent_name(nodes[span.span_id])
            # Join first (even for filtered agents) so the order fallback stays aligned with the proxy records.
            call = by_response.get(attrs.get(GEN_AI_RESPONSE_ID))
            how = "response_id"
            prompt: list[int] | None = None
            response: list[int] | None = None
            if call is None:
                prompt = _int_list(attrs.get(PROMPT_TOKEN_IDS))
                response = _int_list(attrs.get(RESPONSE_TOKEN_IDS))
                if prompt is not None and response is not None:
                    how = "span"
                elif config.order_fallback and next_unreferenced < len(unreferenced):
                    call = unreferenced[next_unreferenced]
                    next_unreferenced += 1
                    how = "order"
            if call is not None:
                joined.add(id(call))
            if not config.trains(agent):
                diag.calls_filtered += 1
                continue

            if call is not None:
                prompt, response, logprobs = call.prompt_token_ids, call.response_token_ids, call.response_logprobs
                if not prompt or not response:
                    reason = (
                        f"proxy record {call.call_id} has no token ids "
                        f"({len(prompt)} prompt, {len(response)} response ids)"
                    )
                    if call.error:
                        reason += f"; the call failed: {call.error}"
                    missing.append(MissingTokenIds(span.span_id, span.name, rollout_id, attempt_id, reason))
                    continue
                calls.append(_Call(span.span_id, call.call_id, agent, prompt, response, logprobs, call.model_version))
                if how == "order":
                    diag.joined_by_order += 1
                    problems.append(
                        f"LLM span {span.span_id} ({span.name!r}) was joined to proxy record {call.call_id} by "
                        "order: the span has no matching gen_ai.response.id"
                    )
                else:
                    diag.joined_by_response_id += 1
            elif how == "span":
                assert prompt is not None and response is not None
                logprobs = self._span_logprobs(span, response, problems)
                calls.append(_Call(span.span_id, None, agent, prompt, response, logprobs, None))
                diag.joined_by_span_attributes += 1
            else:
                response_id = attrs.get(GEN_AI_RESPONSE_ID)
                reason = (
                    f"no proxy record has response id {response_id!r}"
                    if response_id is not None
                    else "the span has no gen_ai.response.id"
                )
                reason += " and the span carries no token ids"
                if config.order_fallback:
                    reason += " (no unreferenced proxy record was left to match by order)"
                missing.append(MissingTokenIds(span.span_id, span.name, rollout_id, attempt_id, reason))

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
        diag.calls_trained = len(calls)

        if config.mode == "per_call":
            transitions = self._per_call(calls, rollout_id, attempt_id, group_id, final_reward)
        else:
            transitions = self._trajectory(calls, rollout_id, attempt_id, group_id, final_reward, diag, problems)
        diag.transitions = len(transitions)
        return TransitionResult(rollout_id, attempt_id, transitions, final_reward, diag, problems)

    @staticmethod
    def _final_reward_index(
        events: list[tuple[bool, Span]], problems: list[str], diag: TransitionDiagnostics
    ) -> int | None:
        """Index in ``events`` of the final reward: the last marked final, else the last valid reward."""
        last_valid: int | None = None
        last_final: int | None = None
        finals = 0
        for index, (is_llm, span) in enumerate(events):
            if is_llm:
                continue
            if _reward_value(span) is None:
                diag.invalid_rewards += 1
                problems.append(
                    f"reward span {span.span_id} has no finite numeric {REWARD_VALUE} "
                    f"({span.attributes.get(REWARD_VALUE)!r}); ignored"
                )
                continue
            diag.rewards += 1
            last_valid = index
            if span.attributes.get(REWARD_FINAL) is True:
                finals += 1
                last_final = index
        if finals > 1:
            diag.multiple_final_rewards = 1
            problems.append(f"{finals} rewards are marked final; the last one is used")
        return last_final if last_final is not None else last_valid

    @staticmethod
    def _span_logprobs(span: Span, response: list[int], problems: list[str]) -> list[float] | None:
        value = span.attributes.get(RESPONSE_LOGPROBS)
        if value is None:
            return None
        if (
            isinstance(value, list)
            and len(value) == len(response)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
        ):
            return [float(x) for x in value]  # type: ignore[arg-type]  # checked just above
        problems.append(f"LLM span {span.span_id} has logprobs that do not match its response tokens; dropped")
        return None

    @staticmethod
    def _per_call(
        calls: list[_Call], rollout_id: str, attempt_id: str, group_id: str | None, final_reward: float | None
    ) -> list[Transition]:
        out: list[Transition] = []
        for step, call in enumerate(calls):
            metadata: dict[str, Any] = {"span_ids": [call.span_id]}
            if call.model_version is not None:
                metadata["model_version"] = call.model_version
            out.append(
                fast_model(
                    Transition,
                    {
                        "rollout_id": rollout_id,
                        "attempt_id": attempt_id,
                        "group_id": group_id,
                        "agent_name": call.agent,
                        "step_index": step,
                        "prompt_ids": call.prompt,
                        "response_ids": call.response,
                        "response_mask": [1] * len(call.response),
                        "logprobs": call.logprobs,
                        "reward": call.reward,
                        "final_reward": final_reward,
                        "call_ids": [] if call.call_id is None else [call.call_id],
                        "metadata": metadata,
                    },
                )
            )
        return out

    @staticmethod
    def _trajectory(
        calls: list[_Call],
        rollout_id: str,
        attempt_id: str,
        group_id: str | None,
        final_reward: float | None,
        diag: TransitionDiagnostics,
        problems: list[str],
    ) -> list[Transition]:
        samples: list[dict[str, Any]] = []
        open_by_agent: dict[str | None, dict[str, Any]] = {}
        for call in calls:
            current = open_by_agent.get(call.agent)
            if current is not None:
                history: list[int] = current["prompt_ids"] + current["response_ids"]
                n = len(history)
                if len(call.prompt) >= n and call.prompt[:n] == history:
                    observation = call.prompt[n:]
                    current["response_ids"] += observation
                    current["response_ids"] += call.response
                    current["response_mask"] += [0] * len(observation)
                    current["response_mask"] += [1] * len(call.response)
                    logprobs = current["logprobs"]
                    if logprobs is not None and call.logprobs is not None:
                        logprobs += [0.0] * len(observation)
                        logprobs += call.logprobs
                    else:
                        current["logprobs"] = None
                    if call.reward is not None:
                        current["reward"] = call.reward + (current["reward"] or 0.0)
                    if call.call_id is not None:
                        current["call_ids"].append(call.call_id)
                    current["metadata"]["span_ids"].append(call.span_id)
                    diag.merged_calls += 1
                    continue
                diag.trajectory_breaks += 1
                problems.append(
                    f"LLM span {call.span_id} (agent {call.agent!r}): its prompt does not extend the agent's "
                    "previous prompt + response (non-append history); started a new sample"
                )
            metadata: dict[str, Any] = {"span_ids": [call.span_id]}
            if call.model_version is not None:
                metadata["model_version"] = call.model_version
            sample: dict[str, Any] = {
                "rollout_id": rollout_id,
                "attempt_id": attempt_id,
                "group_id": group_id,
                "agent_name": call.agent,
                "step_index": len(samples),
                "prompt_ids": call.prompt,
                "response_ids": list(call.response),
                "response_mask": [1] * len(call.response),
                "logprobs": None if call.logprobs is None else list(call.logprobs),
                "reward": call.reward,
                "final_reward": final_reward,
                "call_ids": [] if call.call_id is None else [call.call_id],
                "metadata": metadata,
            }
            samples.append(sample)
            open_by_agent[call.agent] = sample
        return [fast_model(Transition, sample) for sample in samples]
