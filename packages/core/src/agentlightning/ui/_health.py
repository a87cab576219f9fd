"""The dashboard's health panel: `agl doctor`'s checks over a live run's latest finished rollouts.

The panel asks ``POST /v1/ui/health`` every few seconds, so a problem that appears mid-run (rewards stop arriving,
answers start being cut, a client starts bypassing the proxy) shows while the run goes on. There is no model here:
the prompts are not compared with a chat template (``agl doctor --store ... --model M`` does it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentlightning.doctor import diagnose
from agentlightning.store import LightningStore, RolloutQuery

__all__ = ["RunHealthRequest", "RunHealthResponse", "run_health"]


class RunHealthRequest(BaseModel):
    """Which rollouts the health panel checks.

    Attributes:
        last: The newest finished rollouts to check (1-1000).
        agent_filter: Regular expression of the agents training selects (``None``: every agent).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    last: int = Field(default=64, ge=1, le=1000)
    agent_filter: str | None = Field(default=None, min_length=1, max_length=256)


class RunHealthResponse(BaseModel):
    """`agentlightning.doctor.DoctorReport` as JSON (`DoctorReport.to_json`), and how many rollouts it checked."""

    trainable: bool
    checked: int
    figures: dict[str, Any]
    sites: list[dict[str, Any]]
    findings: list[dict[str, Any]]


async def run_health(store: LightningStore, request: RunHealthRequest) -> RunHealthResponse:
    """Check the ``request.last`` newest finished rollouts of ``store`` (`agentlightning.doctor.diagnose`)."""
    page = await store.list_rollouts(RolloutQuery(status=["succeeded", "failed"], limit=request.last))
    ids = [row.rollout_id for row in page.rollouts]
    report = await diagnose(store, ids, agent_filter=request.agent_filter)
    return RunHealthResponse(checked=len(ids), **report.to_json())
