"""Checks of whole rollouts: failures, rewards and their spread within groups, transitions against the context."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from agentlightning.doctor._evidence import RolloutEvidence
from agentlightning.doctor._report import Finding, RunFigures
from agentlightning.transitions import TransitionBuilder, TransitionConfig

__all__ = ["rollout_findings", "run_figures"]


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 3) if values else 0.0


def run_figures(
    evidence: Sequence[RolloutEvidence], config: TransitionConfig, context: int | None
) -> tuple[RunFigures, dict[str, float | None]]:
    """The run's figures, and each finished rollout's final reward (``None``: none reached it) by rollout id.

    Transitions are built as the trainer builds them (`TransitionBuilder` with the run's ``agent_filter``), calls
    without token ids skipped (the call checks name them).
    """
    builder = TransitionBuilder(config.model_copy(update={"on_missing": "skip"}))
    figures = RunFigures(rollouts=len(evidence), context=context)
    rewards: dict[str, float | None] = {}
    seconds: list[float] = []
    tokens: list[float] = []
    calls: list[float] = []
    agents: set[str] = set()
    for item in evidence:
        for view in item.calls:
            if view.agent is not None:
                agents.add(view.agent)
        if item.rollout.status != "succeeded":
            figures.failed += 1
            if figures.first_failure is None:
                error = item.attempt.error if item.attempt is not None else None
                figures.first_failure = error or "no error was recorded (its worker died?)"
            continue
        figures.succeeded += 1
        result = builder.build(item.spans, item.records, group_id=item.rollout.group_id)
        rewards[item.rollout.rollout_id] = result.final_reward
        figures.transitions += len(result.transitions)
        figures.orphan_spans += result.diagnostics.orphan_spans
        for transition in result.transitions:
            size = len(transition.prompt_token_ids) + len(transition.response_token_ids)
            figures.transition_tokens_max = max(figures.transition_tokens_max, size)
        attempt = item.attempt
        if attempt is not None and attempt.end_time is not None:
            seconds.append(attempt.end_time - attempt.start_time)
        tokens.append(float(sum(len(record.response_token_ids) for record in item.records)))
        calls.append(float(len(item.calls)))
    found = [r for r in rewards.values() if r is not None]
    figures.with_reward = len(found)
    if found:
        figures.reward_min, figures.reward_max = min(found), max(found)
    figures.seconds_per_rollout, figures.tokens_per_rollout = _mean(seconds), _mean(tokens)
    figures.calls_per_rollout = _mean(calls)
    figures.agents = sorted(agents)
    figures.agents_selected = [name for name in figures.agents if config.trains(name)]
    _groups(evidence, rewards, figures)
    return figures, rewards


def _groups(evidence: Sequence[RolloutEvidence], rewards: dict[str, float | None], figures: RunFigures) -> None:
    """Groups (a task's rollouts) with two rewards or more, and those whose rewards are all equal."""
    by_group: dict[str, list[float]] = defaultdict(list)
    for item in evidence:
        reward = rewards.get(item.rollout.rollout_id)
        if reward is not None:
            by_group[item.rollout.group_id or item.rollout.rollout_id].append(reward)
    sized = [values for values in by_group.values() if len(values) > 1]
    figures.groups = len(sized)
    figures.flat_groups = sum(1 for values in sized if max(values) - min(values) <= 1e-9)


def rollout_findings(figures: RunFigures, filtered: bool) -> list[Finding]:  # one rule per check
    """The run-level problems and warnings, each with its fix."""
    out: list[Finding] = []

    def add(check: str, severity: str, message: str) -> None:
        out.append(Finding(check, severity, message))  # type: ignore[arg-type]  # the two literals below

    if figures.rollouts == 0:
        add("no-rollouts", "problem", "no finished rollout to check: did the runners start? (give tasks, or --store)")
        return out
    if figures.failed:
        add(
            "rollouts-failed",
            "problem" if figures.failed * 2 >= figures.rollouts else "warning",
            f"{figures.failed} of {figures.rollouts} rollouts failed (the agent raised): {figures.first_failure}",
        )
    done = figures.succeeded
    if done and figures.calls_per_rollout == 0:
        add(
            "no-llm-calls",
            "problem",
            "the rollouts finished without an LLM call the proxy or an adapter saw: point the agent's client at "
            "agl.llm_base_url() and use the model name in resources.llm.model",
        )
    missing = done - figures.with_reward
    if missing:
        add(
            "no-reward",
            "problem",
            f"no reward reached {missing} of {done} rollouts: the agent returned None; return a float or call "
            "agl.emit_reward(value)",
        )
    if figures.with_reward > 1 and figures.reward_min == figures.reward_max:
        add(
            "constant-reward",
            "problem",
            f"every one of {figures.with_reward} rollouts got reward {figures.reward_min}: no group has a learning "
            "signal; make the reward depend on how well the task was done (a checker of the answer, partial credit)",
        )
    elif figures.groups and figures.flat_groups:
        add(
            "flat-groups",
            "problem" if figures.flat_groups == figures.groups else "warning",
            f"{figures.flat_groups} of {figures.groups} groups have no reward variance (GRPO learns nothing from "
            "them): more rollouts per task (--samples-per-task), a higher temperature, or a graded reward",
        )
    if done and figures.calls_per_rollout and figures.transitions == 0:
        why = "the agent_filter selects none of the agents found" if filtered else "no call had token ids"
        add("no-transitions", "problem", f"no transition was built ({why}): see the lines above")
    if figures.agents and filtered and not figures.agents_selected:
        add(
            "agent-filter-empty",
            "problem",
            f"agent_filter selects none of the agents found ({', '.join(figures.agents)}): use one of these names",
        )
    if figures.context is not None and figures.transition_tokens_max > figures.context:
        add(
            "context-overflow",
            "problem",
            f"the longest transition has {figures.transition_tokens_max} tokens, over the model's context of "
            f"{figures.context}: shorten the prompts or lower --max-tokens",
        )
    if figures.orphan_spans:
        add(
            "spans-outside-rollout",
            "warning",
            f"{figures.orphan_spans} spans have a parent outside the rollout's trace (made outside the rollout's "
            "context, e.g. in a thread or task started before it): start that work inside the rollout",
        )
    return out
