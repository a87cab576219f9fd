"""The browser dashboard served by ``agl store serve`` at ``/ui``: runs, rollouts, span timelines, chats, credit.

Plain HTML, CSS and JavaScript shipped in this package (no build step, nothing fetched from a CDN). The page
reads the same store API as every other client, with the same bearer token.
"""

from agentlightning.ui._explain import CallVerdict, ExplainRequest, ExplainResponse, TransitionRow, explain_attempt
from agentlightning.ui._routes import UI_PATH, add_ui_routes, load_assets
from agentlightning.ui._serve import DashboardServer

__all__ = [
    "UI_PATH",
    "CallVerdict",
    "DashboardServer",
    "ExplainRequest",
    "ExplainResponse",
    "TransitionRow",
    "add_ui_routes",
    "explain_attempt",
    "load_assets",
]
