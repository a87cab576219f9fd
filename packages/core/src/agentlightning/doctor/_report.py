"""What `agl doctor` found: one `Finding` per problem (with its fix), counts per agent and call site, the summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["DoctorReport", "Finding", "RunFigures", "SiteReport", "exit_code"]

Severity = Literal["problem", "warning"]


@dataclass(frozen=True)
class Finding:
    """One thing that stops (``problem``) or weakens (``warning``) training, said in one line with its fix.

    Attributes:
        check: The check's name (the docs page lists every one with its fix).
        severity: ``problem`` (the run would not train, or train on wrong data) or ``warning``.
        message: What was seen, how often, and what to do (one line).
        site: The agent and call site it was seen at (``agent / site``), when it belongs to one.
    """

    check: str
    severity: Severity
    message: str
    site: str | None = None

    def line(self) -> str:
        """The finding as one line: ``problem [check] agent / site: message``."""
        where = f" {self.site}:" if self.site else ""
        return f"{self.severity} [{self.check}]{where} {self.message}"


@dataclass
class SiteReport:
    """Counts of one call site (an agent and the name of its LLM calls), over every rollout checked.

    Attributes:
        agent: The agent that made the calls (``None``: no agent span or name reached the store).
        site: The LLM span's name (the framework's name for the call), or ``(no LLM span)`` for proxy records that
            no span of the adapter references.
        calls: Calls the agent made (LLM spans, plus proxy records that no span references).
        recorded: Calls the LLM proxy recorded.
        bypassed: Calls the adapter saw that the proxy never recorded (and that carry no token ids themselves).
        with_token_ids: Recorded calls with prompt and response token ids.
        template_checked: Prompts re-rendered with the model's chat template (``0``: no template was given).
        template_equal: Of those, the prompts whose recorded ids equal the re-rendered ones.
        multi_turn: Calls that follow an earlier call of the same agent in the same rollout.
        prefix_extends: Of those, the prompts that extend the earlier prompt + response (mergeable).
        tool_calls_attempted: Answers where the model tried to call a tool (parsed or not).
        tool_calls_parsed: Of those, the answers whose tool calls the server parsed.
        truncated: Answers cut by ``max_tokens`` (finish reason ``length``).
        trained: Calls the ``agent_filter`` selects for training.
    """

    agent: str | None
    site: str
    calls: int = 0
    recorded: int = 0
    bypassed: int = 0
    with_token_ids: int = 0
    template_checked: int = 0
    template_equal: int = 0
    multi_turn: int = 0
    prefix_extends: int = 0
    tool_calls_attempted: int = 0
    tool_calls_parsed: int = 0
    truncated: int = 0
    trained: int = 0

    @property
    def where(self) -> str:
        """``agent / site`` as findings name it."""
        return f"{self.agent or '(no agent name)'} / {self.site}"


@dataclass
class RunFigures:
    """Figures over the rollouts checked.

    Attributes:
        rollouts: Rollouts checked.
        succeeded: Of those, the ones whose agent returned.
        failed: The ones whose agent raised (or whose worker died).
        with_reward: Rollouts a final reward reached.
        reward_min: Smallest final reward (``None``: none reached).
        reward_max: Largest final reward.
        groups: Groups (rollouts of one task) with two finished rollouts or more.
        flat_groups: Of those, the groups whose rollouts all got the same reward (no learning signal for GRPO).
        transitions: Transitions built (the trainer's samples before credit).
        transition_tokens_max: Longest transition, prompt + response tokens.
        context: The model's context length (``None``: unknown).
        seconds_per_rollout: Mean wall time of a finished rollout.
        tokens_per_rollout: Mean generated tokens per finished rollout.
        calls_per_rollout: Mean LLM calls per finished rollout.
        agents: Agent names found on the calls.
        agents_selected: The agents ``agent_filter`` trains (all of them without a filter).
        orphan_spans: Spans whose parent is missing (they fall outside the rollout's trace tree).
        first_failure: Why one failed rollout failed (its error), when one did.
    """

    rollouts: int = 0
    succeeded: int = 0
    failed: int = 0
    with_reward: int = 0
    reward_min: float | None = None
    reward_max: float | None = None
    groups: int = 0
    flat_groups: int = 0
    transitions: int = 0
    transition_tokens_max: int = 0
    context: int | None = None
    seconds_per_rollout: float = 0.0
    tokens_per_rollout: float = 0.0
    calls_per_rollout: float = 0.0
    agents: list[str] = field(default_factory=list[str])
    agents_selected: list[str] = field(default_factory=list[str])
    orphan_spans: int = 0
    first_failure: str | None = None


@dataclass
class DoctorReport:
    """Everything `agentlightning.doctor.diagnose` found.

    Attributes:
        figures: The run's figures.
        sites: Counts per agent and call site.
        findings: Problems and warnings, each with its fix, problems first.
    """

    figures: RunFigures
    sites: list[SiteReport]
    findings: list[Finding]

    @property
    def problems(self) -> list[Finding]:
        """The findings that make the agent untrainable as it is."""
        return [f for f in self.findings if f.severity == "problem"]

    @property
    def trainable(self) -> bool:
        """Whether no problem was found (warnings allowed)."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``agl doctor --json``)."""
        sites = [{**asdict(site), "where": site.where} for site in self.sites]
        return {
            "trainable": self.trainable,
            "figures": asdict(self.figures),
            "sites": sites,
            "findings": [asdict(f) for f in self.findings],
        }


def exit_code(report: DoctorReport) -> int:
    """``agl doctor``'s exit code for a report: 0 trainable, 1 with problems (2, could not run, is the CLI's)."""
    return 0 if report.trainable else 1
