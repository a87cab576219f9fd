"""``agl doctor``: is this agent trainable? Checks of a run's store, per agent and call site, each with its fix.

`diagnose` reads the finished rollouts of a store (a run ``agl doctor`` just made through ``agl train``'s path, or
any run's store) and returns a `DoctorReport`: counts per agent and call site (`SiteReport`), the run's figures
(`RunFigures`) and one `Finding` per problem or warning, each one line with its fix. Every check is listed with its
fix in the documentation (``docs/doctor.md``).

Example:
    ```python
    report = await diagnose(store, renderer=HFChatTemplate(tokenizer), context=2048)
    for finding in report.findings:
        print(finding.line())
    ```
"""

from __future__ import annotations

from collections.abc import Sequence

from agentlightning.doctor._calls import ChatRenderer, check_calls, site_findings
from agentlightning.doctor._evidence import collect
from agentlightning.doctor._render import print_report, show_report
from agentlightning.doctor._report import DoctorReport, Finding, RunFigures, SiteReport, exit_code
from agentlightning.doctor._rollouts import rollout_findings, run_figures
from agentlightning.store import LightningStore
from agentlightning.transitions import TransitionConfig

__all__ = [
    "ChatRenderer",
    "DoctorReport",
    "Finding",
    "RunFigures",
    "SiteReport",
    "diagnose",
    "exit_code",
    "print_report",
    "show_report",
]


async def diagnose(
    store: LightningStore,
    rollout_ids: Sequence[str] | None = None,
    *,
    renderer: ChatRenderer | None = None,
    context: int | None = None,
    agent_filter: Sequence[str] | str | None = None,
) -> DoctorReport:
    """Check the finished rollouts of ``store`` (``rollout_ids``, or all) for what would stop them training.

    Args:
        store: Any `LightningStore` (a run's SQLite file, a served store...).
        rollout_ids: The rollouts to check (default: every finished one).
        renderer: The model's own chat template; without it the template check is skipped.
        context: The model's context length, for the transitions' size check.
        agent_filter: The trainer's ``agent_filter`` (agent names, or one regex); ``None`` trains every agent.

    Returns:
        The report; ``report.trainable`` is false when a problem was found.
    """
    names = None if agent_filter is None else (agent_filter if isinstance(agent_filter, str) else tuple(agent_filter))
    config = TransitionConfig(agent_filter=names)
    evidence = await collect(store, rollout_ids)
    sites = check_calls(evidence, renderer, config)
    figures, _ = run_figures(evidence, config, context)
    findings = rollout_findings(figures, names is not None)
    for site in sites.values():
        findings.extend(site_findings(site))
    findings.sort(key=lambda f: f.severity != "problem")  # stable: problems first, each group in check order
    ordered = sorted(sites.values(), key=lambda s: (s.agent or "", s.site))
    return DoctorReport(figures, ordered, findings)
