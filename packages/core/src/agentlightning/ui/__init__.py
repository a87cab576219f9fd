"""The browser dashboard served by ``agl store serve`` at ``/ui``: runs, rollouts, span timelines, chats, credit.

Plain HTML, CSS and JavaScript shipped in this package (no build step, nothing fetched from a CDN). The page
reads the same store API as every other client, with the same bearer token.
"""

import agentlightning._serve_required  # noqa: F401  # pyright: ignore[reportUnusedImport]  # the install line first
from agentlightning.ui._explain import CallVerdict, ExplainRequest, ExplainResponse, TransitionRow, explain_attempt
from agentlightning.ui._routes import UI_PATH, load_assets, ui_routes
from agentlightning.ui._serve import DashboardServer

__all__ = [
    "UI_PATH",
    "CallVerdict",
    "DashboardServer",
    "ExplainRequest",
    "ExplainResponse",
    "TransitionRow",
    "explain_attempt",
    "load_assets",
    "ui_routes",
]
