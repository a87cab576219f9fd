"""The served store's read endpoints for dashboards: rollout pages, run statistics and every resources version.

==========================================  ==========================================
``POST /v1/rollouts/list``                  `RolloutQuery` -> `RolloutPage`
``POST /v1/runs/stats``                     `RunStatsQuery` -> `RunStats`
``GET  /v1/resources/all``                  `ResourcesListResponse`
==========================================  ==========================================

They sit behind the same bearer token as the rest of the API (`create_store_app` adds them).
"""

from __future__ import annotations

from agentlightning._routing import Route
from agentlightning.store._base import LightningStore
from agentlightning.store._query import RolloutPage, RolloutQuery, RunStats, RunStatsQuery
from agentlightning.store._wire import API_PREFIX, ResourcesListResponse

__all__ = ["dashboard_routes"]


def dashboard_routes(store: LightningStore) -> list[Route]:
    """The dashboard endpoints over ``store`` (`create_store_app` serves them beside the store protocol)."""

    async def list_rollouts(body: RolloutQuery) -> bytes:
        page = await store.list_rollouts(body)
        return page.__pydantic_serializer__.to_json(page)

    async def run_stats(body: RunStatsQuery) -> bytes:
        stats = await store.run_stats(body)
        return stats.__pydantic_serializer__.to_json(stats)

    async def all_resources(_: None) -> bytes:
        listed = ResourcesListResponse.model_construct(resources=await store.query_resources())
        return listed.__pydantic_serializer__.to_json(listed)

    p = API_PREFIX
    return [
        Route("POST", f"{p}/rollouts/list", list_rollouts, "list_rollouts",
              "A page of rollout summaries (latest attempt's reward, model version, duration, error), newest first.",
              body=RolloutQuery, response=RolloutPage, tags=("dashboard",)),
        Route("POST", f"{p}/runs/stats", run_stats, "run_stats",
              "Counts per status, reward mean and success rate per (model version, mode), recent throughput.",
              body=RunStatsQuery, response=RunStats, tags=("dashboard",)),
        Route("GET", f"{p}/resources/all", all_resources, "all_resources",
              "Every stored resources version, oldest first (the last one is current).",
              response=ResourcesListResponse, tags=("resources",)),
    ]  # fmt: skip
