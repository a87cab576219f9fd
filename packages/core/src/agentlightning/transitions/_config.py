"""Configuration, results and errors of the spans -> transitions conversion."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, field_validator

from agentlightning._training_models import Transition

__all__ = [
    "MissingTokenIds",
    "MissingTokenIdsError",
    "TransitionConfig",
    "TransitionDiagnostics",
    "TransitionResult",
]


class TransitionConfig(BaseModel):
    """How an attempt's spans and proxy records become transitions.

    Attributes:
        mode: ``per_call`` (default): one transition per LLM call, every response token trained.
            ``trajectory``: successive calls of the same agent are merged into one sample when the next
            prompt's token ids start exactly with the previous prompt + response; the tokens in between
            (tool results, user turns) become response tokens with mask 0 and logprob 0.0. A call whose
            prompt does not extend the agent's history (summarised or edited context) starts a new sample
            and is counted in ``trajectory_breaks``.
        agent_filter: Which agents are trained: ``None`` (all, including calls outside any agent span), a list
            of exact agent names, or a regular expression that must match the whole agent name
            (``re.fullmatch``). With a filter, calls without an agent name are not trained.
        on_missing: What to do with a trained call that has no token ids: ``raise`` a `MissingTokenIdsError`
            (default: fail early instead of training on nothing), ``warn`` (log a warning, skip the call) or
            ``skip`` (skip it, count it in the diagnostics).
        order_fallback: Opt-in guess: join an LLM span that neither matches a proxy record by response id nor
            carries token ids itself to the next proxy record that no span references, in time order. Counted
            in ``joined_by_order`` and warned about; off by default because a wrong guess trains a response
            on another call's prompt.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["per_call", "trajectory"] = "per_call"
    agent_filter: tuple[str, ...] | str | None = None
    on_missing: Literal["raise", "warn", "skip"] = "raise"
    order_fallback: bool = False

    _pattern: re.Pattern[str] | None = PrivateAttr(default=None)
    _names: frozenset[str] | None = PrivateAttr(default=None)

    @field_validator("agent_filter")
    @classmethod
    def _check_filter(cls, value: tuple[str, ...] | str | None) -> tuple[str, ...] | str | None:
        if isinstance(value, str):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"agent_filter {value!r} is not a valid regular expression: {exc}") from exc
        elif value is not None and not value:
            raise ValueError("agent_filter is an empty list, so no agent would be trained; use None to train all")
        return value

    def model_post_init(self, context: object, /) -> None:
        """Compile the agent filter once."""
        if isinstance(self.agent_filter, str):
            self._pattern = re.compile(self.agent_filter)
        elif self.agent_filter is not None:
            self._names = frozenset(self.agent_filter)

    def trains(self, agent_name: str | None) -> bool:
        """Whether calls made by ``agent_name`` are trained under `agent_filter`."""
        if self.agent_filter is None:
            return True
        if agent_name is None:
            return False
        if self._names is not None:
            return agent_name in self._names
        assert self._pattern is not None
        return self._pattern.fullmatch(agent_name) is not None


@dataclass(frozen=True, slots=True)
class MissingTokenIds:
    """One trained LLM call for which no token ids could be found.

    Attributes:
        span_id: Id of the LLM span.
        span_name: Name of the LLM span.
        rollout_id: Rollout of the span.
        attempt_id: Attempt of the span.
        reason: Why no ids were found (no matching proxy record, or the record has none).
    """

    span_id: str
    span_name: str
    rollout_id: str
    attempt_id: str
    reason: str

    def __str__(self) -> str:
        return (
            f"LLM span {self.span_id} ({self.span_name!r}) in rollout {self.rollout_id} attempt {self.attempt_id}: "
            f"{self.reason}"
        )


class MissingTokenIdsError(ValueError):
    """Trained LLM calls without token ids; training on re-tokenised text is never attempted.

    Attributes:
        missing: Every call that lacked ids, with the reason.
    """

    def __init__(self, missing: list[MissingTokenIds]) -> None:
        self.missing = missing
        lines = "\n  ".join(str(item) for item in missing)
        super().__init__(
            f"{len(missing)} LLM call(s) have no token ids, so they cannot be trained:\n  {lines}\n"
            "Point the agent's base URL at the LLM proxy (it records token ids), or have the adapter put "
            "them on the span; set TransitionConfig(on_missing='warn' or 'skip') to train without these calls."
        )


@dataclass(slots=True)
class TransitionDiagnostics:
    """Counts describing one conversion (or, summed with `add`, many).

    Attributes:
        attempts: Attempts converted.
        spans: Spans read (duplicates included).
        llm_spans: Spans of kind ``llm``.
        calls_trained: LLM calls turned into (part of) a transition.
        calls_filtered: LLM calls of agents excluded by the agent filter.
        missing_token_ids: Trained calls without token ids (skipped unless ``on_missing='raise'``).
        joined_by_response_id: Calls joined to a proxy record through ``gen_ai.response.id``.
        joined_by_span_attributes: Calls whose token ids were taken from the span itself.
        joined_by_order: Calls joined to an unreferenced proxy record by order (a guess; check your adapter).
        proxy_only_calls: Calls trained from proxy records alone (the attempt had no LLM span).
        unused_llm_calls: Proxy records no LLM span was joined to.
        transitions: Transitions produced.
        trajectory_breaks: Calls that could not be appended to their agent's sample (non-append history).
        merged_calls: Calls appended to an earlier call's sample (trajectory mode).
        orphan_spans: Spans whose parent is missing.
        duplicate_spans: Repeated span ids.
        cycle_spans: Spans detached from a parent_id cycle.
        rewards: Valid reward spans.
        invalid_rewards: Reward spans without a finite numeric value, or whose value would make its step's sum of
            intermediate rewards non-finite.
        unattached_rewards: Intermediate rewards with no trained call before them (not credited).
        multiple_final_rewards: Attempts with more than one reward marked final (the last one is used).
        attempts_without_reward: Attempts with no reward at all.
    """

    attempts: int = 0
    spans: int = 0
    llm_spans: int = 0
    calls_trained: int = 0
    calls_filtered: int = 0
    missing_token_ids: int = 0
    joined_by_response_id: int = 0
    joined_by_span_attributes: int = 0
    joined_by_order: int = 0
    proxy_only_calls: int = 0
    unused_llm_calls: int = 0
    transitions: int = 0
    trajectory_breaks: int = 0
    merged_calls: int = 0
    orphan_spans: int = 0
    duplicate_spans: int = 0
    cycle_spans: int = 0
    rewards: int = 0
    invalid_rewards: int = 0
    unattached_rewards: int = 0
    multiple_final_rewards: int = 0
    attempts_without_reward: int = 0

    def add(self, other: TransitionDiagnostics) -> None:
        """Add ``other``'s counts to this one."""
        # Called once per attempt on the conversion hot path: most counts of one attempt are 0.
        for name, value in zip(_DIAGNOSTIC_FIELDS, _get_counts(other), strict=True):
            if value:
                setattr(self, name, getattr(self, name) + value)

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """The counts as a flat metrics dict (``prefix`` + field name)."""
        counts = _get_counts(self)
        return {prefix + name: float(value) for name, value in zip(_DIAGNOSTIC_FIELDS, counts, strict=True)}


_DIAGNOSTIC_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TransitionDiagnostics))
_get_counts = attrgetter(*_DIAGNOSTIC_FIELDS)


@dataclass(frozen=True, slots=True)
class TransitionResult:
    """The transitions of one attempt and what the conversion had to say about it.

    Attributes:
        rollout_id: Rollout of the attempt.
        attempt_id: The attempt.
        transitions: Transitions in step order.
        final_reward: The attempt's final reward (``None`` if it gave none).
        diagnostics: Counts (joins, filters, breaks, repairs).
        problems: Human-readable descriptions of everything that was unusual.
    """

    rollout_id: str | None
    attempt_id: str | None
    transitions: list[Transition]
    final_reward: float | None
    diagnostics: TransitionDiagnostics = field(default_factory=TransitionDiagnostics)
    problems: list[str] = field(default_factory=list)
