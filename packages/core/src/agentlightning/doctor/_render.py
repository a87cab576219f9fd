"""`agl doctor`'s short table: one row per agent and call site, then the run's figures and one line per finding."""

from __future__ import annotations

import json
import sys
from typing import Any

from agentlightning.doctor._report import DoctorReport, SiteReport, exit_code

__all__ = ["print_report", "show_report"]


def _ratio(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{part}/{whole}"


def _row(site: SiteReport) -> list[str]:
    return [
        site.where,
        _ratio(site.recorded, site.calls),
        _ratio(site.with_token_ids, site.recorded),
        _ratio(site.template_equal, site.template_checked),
        _ratio(site.prefix_extends, site.multi_turn),
        _ratio(site.tool_calls_parsed, site.tool_calls_attempted),
        str(site.truncated),
        _ratio(site.trained, site.calls),
    ]


def _agents(found: list[str], selected: list[str]) -> str:
    if not found:
        return "no agent names on the calls"
    return f"agents {', '.join(found)} (agent_filter selects: {', '.join(selected) or 'none'})"


def print_report(report: DoctorReport, console: Any) -> None:
    """Print ``report`` on a ``rich`` console: the table, the figures, the findings and the verdict."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="agl doctor: LLM calls per agent / call site", title_justify="left")
    for header in ("agent / site", "recorded", "token ids", "template", "prefix", "tools parsed", "cut", "trained"):
        table.add_column(header, justify="left" if header == "agent / site" else "right")
    for site in report.sites:
        table.add_row(*_row(site))
    console.print(table)
    f = report.figures
    rewards = "none" if f.reward_min is None else f"{f.reward_min:g}..{f.reward_max:g}"
    console.print(
        f"rollouts {f.succeeded}/{f.rollouts} succeeded; reward on {f.with_reward} ({rewards}); groups flat "
        f"{f.flat_groups}/{f.groups}; transitions {f.transitions} (longest {f.transition_tokens_max} tokens"
        f"{'' if f.context is None else f' of {f.context}'}); per rollout {f.seconds_per_rollout:.2f} s, "
        f"{f.tokens_per_rollout:.0f} tokens, {f.calls_per_rollout:.1f} calls; {_agents(f.agents, f.agents_selected)}"
    )
    for finding in report.findings:
        color = "red" if finding.severity == "problem" else "yellow"
        console.print(f"[{color}]{finding.severity}[/] {escape(finding.line()[len(finding.severity) + 1 :])}")
    if report.trainable:
        console.print("[green]trainable[/]" + (" (with warnings)" if report.findings else ""))
    else:
        console.print(f"[red]not trainable[/]: {len(report.problems)} problem(s)")


def show_report(report: DoctorReport, as_json: bool = False) -> int:
    """Print ``report`` on stdout (a table, or with ``as_json`` one JSON object); returns the exit code."""
    if as_json:
        sys.stdout.write(json.dumps(report.to_json()) + "\n")
    else:
        from rich.console import Console

        print_report(report, Console(soft_wrap=True))
    return exit_code(report)
