"""The served store's read endpoints for dashboards: rollout pages, run statistics and every resources version.

==========================================  ==========================================
``POST /v1/rollouts/list``                  `RolloutQuery` -> `RolloutPage`
``POST /v1/runs/stats``                     `RunStatsQuery` -> `RunStats`
``GET  /v1/resources/all``                  `ResourcesListResponse`
==========================================  ==========================================

They sit behind the same bearer token as the rest of the API (`create_store_app` adds them).
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.responses import Response

from agentlightning.store._asgi import FastRoute
from agentlightning.store._base import LightningStore
from agentlightning.store._query import RolloutPage, RolloutQuery, RunStats, RunStatsQuery
from agentlightning.store._wire import API_PREFIX, ResourcesListResponse

__all__ = ["add_dashboard_routes"]


class _Json(Response):
    media_type = "application/json"


def add_dashboard_routes(app: FastAPI, store: LightningStore) -> dict[str, FastRoute]:
    """Declare the dashboard endpoints on ``app`` and return their fast-path handlers (POST path -> route)."""

    async def do_list(body: RolloutQuery) -> bytes:
        page = await store.list_rollouts(body)
        return page.__pydantic_serializer__.to_json(page)

    async def do_stats(body: RunStatsQuery) -> bytes:
        stats = await store.run_stats(body)
        return stats.__pydantic_serializer__.to_json(stats)

    p = API_PREFIX

    @app.post(f"{p}/rollouts/list", response_model=RolloutPage, tags=["dashboard"])
    async def list_rollouts(body: RolloutQuery) -> Response:  # pyright: ignore[reportUnusedFunction]
        """A page of rollout summaries (latest attempt's reward, model version, duration, error), newest first."""
        return _Json(await do_list(body))

    @app.post(f"{p}/runs/stats", response_model=RunStats, tags=["dashboard"])
    async def run_stats(body: RunStatsQuery) -> Response:  # pyright: ignore[reportUnusedFunction]
        """Counts per status, reward mean and success rate per (model version, mode), recent throughput."""
        return _Json(await do_stats(body))

    @app.get(f"{p}/resources/all", response_model=ResourcesListResponse, tags=["resources"])
    async def all_resources() -> Response:  # pyright: ignore[reportUnusedFunction]
        """Every stored resources version, oldest first (the last one is current)."""
        body = ResourcesListResponse.model_construct(resources=await store.query_resources())
        return _Json(body.model_dump_json())

    return {f"{p}/rollouts/list": (RolloutQuery, do_list), f"{p}/runs/stats": (RunStatsQuery, do_stats)}
