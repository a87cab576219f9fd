"""Imported first by the serving modules (proxy, store server, dashboard): without the ``serve`` extra, importing
them fails with one line naming the install command instead of a traceback about a missing ASGI package."""

from agentlightning._serve_extra import require_serve

require_serve("agentlightning's LLM proxy, store server and dashboard")
