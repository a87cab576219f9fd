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

from agentlightning._fast import new_transition
from agentlightning._models import AttributeValue, LLMCall, Span
from agentlightning._training_models import Transition, TransitionFields
from agentlightning.semconv import GEN_AI_AGENT_NAME, KIND_AGENT, PROMPT_TOKEN_IDS, RESPONSE_TOKEN_IDS, SPAN_KIND
from agentlightning.transitions._config import (
    MissingTokenIds,
    MissingTokenIdsError,
    TransitionConfig,
    TransitionDiagnostics,
    TransitionResult,
)
from agentlightning.transitions._events import CallIndex, Events, index_calls, interleave_proxy_only, scan_events
from agentlightning.transitions._samples import merge_trajectories, no_ids_reason, reward_overflow, span_logprobs
from agentlightning.transitions._tree import TraceTree, build_attempt_tree

__all__ = ["TransitionBuilder"]

logger = logging.getLogger(__name__)

_new_transition = new_transition  # a module global: benchmarks/conversion_bench.py swaps in validation


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


def _ids_on_span(attrs: dict[str, AttributeValue]) -> tuple[list[int], list[int]] | None:
    """The prompt and response token ids an LLM span carries itself, if it carries both."""
    prompt = _int_list(attrs.get(PROMPT_TOKEN_IDS))
    response = _int_list(attrs.get(RESPONSE_TOKEN_IDS))
    return None if prompt is None or response is None else (prompt, response)


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
        "agentlightning_langchain.instrument() or agl.instrument_all()), or, for an agent in another process "
        "(--agent-command), its OpenTelemetry spans with gen_ai.response.id, sent to a served store over OTLP. "
        "Shown once.",
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


class _Join:
    """The join phase: walk an attempt's events once, giving each trained LLM call its token ids and rewards.

    Each trained call becomes a `TransitionFields` dict in ``samples``; in per-call mode the `Transition` is made at
    once around the same dict (the final reward is known up front), so later intermediate rewards still land.
    """

    def __init__(
        self,
        config: TransitionConfig,
        tree: TraceTree,
        calls: CallIndex,
        ids: tuple[str, str, str | None],
        final_reward: float | None,
        diag: TransitionDiagnostics,
        problems: list[str],
    ) -> None:
        self.rollout_id, self.attempt_id, self.group_id = ids
        self.final_reward = final_reward
        self.diag = diag
        self.problems = problems
        self.samples: list[TransitionFields] = []
        self.transitions: list[Transition] = []
        self.missing: list[MissingTokenIds] = []
        self.joined: set[int] = set()  # id() of every proxy record joined to a call
        self.joined_by_order = 0
        self._per_call = config.mode != "trajectory"
        self._keep = None if config.agent_filter is None else config.trains
        self._order_fallback = config.order_fallback
        self._by_response = calls.by_response
        self._unreferenced = calls.unreferenced
        self._next_unreferenced = 0
        self._tree = tree
        self._agents: dict[str | None, str | None] = {}  # enclosing agent by parent span id

    def run(self, events: Events) -> None:
        """Join every event: a reward goes to the latest trained call, a call becomes a sample."""
        final_index = events.final_index
        llm_span = self._llm_span  # bound once: this loop runs for every LLM call of every attempt
        for index, (span, key, is_final) in enumerate(events.items):
            if is_final is not None:
                if index != final_index:
                    self._add_reward(span, key)
            elif span is None:
                self._proxy_record(key)
            else:
                llm_span(span, key)

    def _add_reward(self, span: Span | None, value: float) -> None:
        where = span.span_id if span is not None else "?"
        if not self.samples:
            self.diag.unattached_rewards += 1
            self.problems.append(f"reward span {where} comes before any trained LLM call: not credited")
            return
        last = self.samples[-1]
        previous = last["intermediate_reward"]
        total = value if previous is None else previous + value
        if math.isfinite(total):
            last["intermediate_reward"] = total
        else:
            reward_overflow(f"reward span {where}", self.diag, self.problems)

    def _proxy_record(self, call: LLMCall) -> None:
        """A proxy record of an attempt without LLM spans (`interleave_proxy_only`)."""
        if self._keep is not None and not self._keep(None):
            self.diag.calls_filtered += 1
            return
        self.joined.add(id(call))
        self._add_call(call, None, None, "-", "(no LLM span)")

    def _llm_span(self, span: Span, response_id: Any) -> None:
        values = span.__dict__  # faster than attribute reads on a pydantic model (it defines __getattr__)
        attrs = values["attributes"]
        span_id = values["span_id"]
        agent = attrs.get(GEN_AI_AGENT_NAME)
        if not isinstance(agent, str) or not agent:
            agent = self._enclosing_agent(span_id)
        # Join first (even for filtered agents) so the order fallback stays aligned with the proxy records.
        call = self._by_response.get(response_id) if response_id is not None else None
        on_span = None
        if call is None:
            on_span = _ids_on_span(attrs)
            if on_span is None:
                call = self._by_order(span)
        if call is not None:
            self.joined.add(id(call))
        if self._keep is not None and not self._keep(agent):
            self.diag.calls_filtered += 1
        elif call is not None:
            record = call.__dict__
            prompt = record["prompt_token_ids"]
            response = record["response_token_ids"]
            if prompt and response:  # the common case, without a further call (see _add_call)
                logprobs, version, policy = record["response_logprobs"], record["model_version"], record["policy"]
                self._add(agent, prompt, response, logprobs, [record["call_id"]], version, policy, [span_id])
            else:
                self._add_call(call, agent, span_id, span_id, values["name"])
        elif on_span is not None:
            prompt, response = on_span
            self.diag.joined_by_span_attributes += 1
            logprobs = span_logprobs(span, response, self.problems)
            self._add(agent, prompt, response, logprobs, None, None, None, [span_id])
        else:
            self._missing_ids(span, response_id)

    def _enclosing_agent(self, span_id: str) -> str | None:
        parent_id = self._tree.parent_ids[span_id]
        agents = self._agents
        if parent_id in agents:
            return agents[parent_id]
        agent = agents[parent_id] = _agent_name(parent_id, self._tree.by_id, self._tree.parent_ids)
        return agent

    def _by_order(self, span: Span) -> LLMCall | None:
        """With ``order_fallback``: the next proxy record no span references (a guess, reported)."""
        if not self._order_fallback or self._next_unreferenced >= len(self._unreferenced):
            return None
        call = self._unreferenced[self._next_unreferenced]
        self._next_unreferenced += 1
        self.joined_by_order += 1
        self.problems.append(
            f"LLM span {span.span_id} ({span.name!r}) was joined to proxy record {call.call_id} by order: the span "
            "has no matching gen_ai.response.id"
        )
        return call

    def _missing_ids(self, span: Span, response_id: Any) -> None:
        """A trained LLM span that no proxy record or attribute gives token ids."""
        reason = (
            f"no proxy record has response id {response_id!r}"
            if response_id is not None
            else "the span has no gen_ai.response.id"
        )
        reason += " and the span carries no token ids"
        if self._order_fallback:
            reason += " (no unreferenced proxy record was left to match by order)"
        elif self._unreferenced:
            reason += (
                f" ({len(self._unreferenced)} proxy record(s) are referenced by no span; "
                "TransitionConfig(order_fallback=True) would join them by order, a guess)"
            )
        self.missing.append(MissingTokenIds(span.span_id, span.name, self.rollout_id, self.attempt_id, reason))

    def _add_call(self, call: LLMCall, agent: str | None, span_id: str | None, where: str, name: str) -> None:
        values = call.__dict__
        prompt = values["prompt_token_ids"]
        response = values["response_token_ids"]
        if not prompt or not response:
            reason = no_ids_reason(call)
            self.missing.append(MissingTokenIds(where, name, self.rollout_id, self.attempt_id, reason))
            return
        span_ids = [] if span_id is None else [span_id]
        call_ids = [values["call_id"]]
        version, policy = values["model_version"], values["policy"]
        self._add(agent, prompt, response, values["response_logprobs"], call_ids, version, policy, span_ids)

    def _add(
        self,
        agent: str | None,
        prompt: list[int],
        response: list[int],
        logprobs: list[float] | None,
        call_ids: list[str] | None,
        model_version: int | None,
        policy: str | None,
        span_ids: list[str],
    ) -> None:
        """The one place a trained call becomes a `Transition`'s fields (token-id lists shared with the record)."""
        fields: TransitionFields = {
            "rollout_id": self.rollout_id,
            "attempt_id": self.attempt_id,
            "group_id": self.group_id,
            "agent_name": agent,
            "step_index": len(self.samples),
            "prompt_token_ids": prompt,
            "response_token_ids": response,
            "response_mask": [1] * len(response),
            "response_logprobs": logprobs,
            "intermediate_reward": None,
            "final_reward": self.final_reward,
            "call_ids": call_ids or [],
            "model_version": model_version,
            "policy": policy,
            "metadata": {"span_ids": span_ids},
        }
        self.samples.append(fields)
        if self._per_call:
            self.transitions.append(_new_transition(fields))


def _report(join: _Join, diag: TransitionDiagnostics, config: TransitionConfig, unused: int, proxy_only: int) -> None:
    """The join's counts into the diagnostics; calls without token ids raised, warned or skipped (``on_missing``).

    Raises:
        MissingTokenIdsError: A trained call has no token ids and ``on_missing`` is ``raise``.
    """
    diag.joined_by_order = join.joined_by_order
    diag.proxy_only_calls = proxy_only
    diag.joined_by_response_id = len(join.joined) - join.joined_by_order - proxy_only
    if join.joined_by_order:
        _warn_order(join.rollout_id, join.joined_by_order)
    diag.unused_llm_calls = unused - len(join.joined)
    if join.final_reward is None:
        diag.attempts_without_reward = 1
    if join.missing:
        diag.missing_token_ids = len(join.missing)
        join.problems.extend(str(item) for item in join.missing)
        if config.on_missing == "raise":
            raise MissingTokenIdsError(join.missing)
        if config.on_missing == "warn":
            for item in join.missing:
                logger.warning("skipping LLM call without token ids: %s", item)
    diag.calls_trained = len(join.samples)


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

        # Phases: LLM calls and rewards in time order -> joined to token ids, one sample per trained call -> merged.
        events = scan_events(tree, diag, problems)
        calls = index_calls(llm_calls, rollout_id, attempt_id, events.referenced, problems)
        proxy_only = 0
        if not diag.llm_spans and calls.unreferenced:
            _warn_proxy_only(rollout_id, len(calls.unreferenced), self.config.agent_filter is not None)
            proxy_only = interleave_proxy_only(events, calls, problems)
        ids = (rollout_id, attempt_id, group_id)
        join = _Join(self.config, tree, calls, ids, events.final_reward, diag, problems)
        join.run(events)
        _report(join, diag, self.config, len(llm_calls) - calls.foreign, proxy_only)
        if self.config.mode == "trajectory":
            transitions = [_new_transition(fields) for fields in merge_trajectories(join.samples, diag, problems)]
        else:
            transitions = join.transitions
        diag.transitions = len(transitions)
        return TransitionResult(rollout_id, attempt_id, transitions, join.final_reward, diag, problems)
