"""Loop test kit: an engine served by a `ScriptedModelServer`, and one traced chat call through the loop's proxy."""

from __future__ import annotations

from typing import Any

import aiohttp

import agentlightning as agl
from agentlightning import semconv
from agentlightning.loop import Engine
from agentlightning.testing._model_server import ScriptedModelServer

__all__ = ["ScriptedServerEngine", "chat_through_proxy"]


class ScriptedServerEngine(Engine):
    """An `Engine` whose one server is a `ScriptedModelServer` reporting the loop's model version on every answer.

    Subclasses write `update` (and anything else they record); ``stopped`` turns true once the loop stops the servers.
    """

    def __init__(self, server: ScriptedModelServer | None = None) -> None:
        self.server = server if server is not None else ScriptedModelServer()
        self.stopped = False

    async def start_servers(self, model_version: int) -> list[str]:
        """Start the scripted server at ``model_version``; its one URL."""
        self.server.model_version = model_version
        self.server.start()
        return [self.server.url]

    async def stop_servers(self) -> None:
        """Stop the scripted server."""
        self.server.stop()
        self.stopped = True


async def chat_through_proxy(
    api_key: str, request: dict[str, Any], *, span_name: str = "chat", attributes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """POST ``request`` to the rollout's proxy (``/chat/completions``) inside an LLM span; returns the answer's body.

    The span records the answer's id (what ties the span to the served call). A status other than 200 raises
    `RuntimeError` with the status and body.

    Args:
        api_key: The key the loop publishes with its LLM resource (``resources.llm.api_key``).
        request: The OpenAI chat request.
        span_name: The span's name.
        attributes: Extra span attributes (the span kind is always ``llm``).
    """
    span_attributes = {**(attributes or {}), semconv.SPAN_KIND: semconv.KIND_LLM}
    with agl.get_tracer().start_as_current_span(span_name, attributes=span_attributes) as span:
        headers = {"Authorization": f"Bearer {api_key}"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{agl.llm_base_url()}/chat/completions", json=request, headers=headers) as resp,
        ):
            body: dict[str, Any] = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"the proxy answered {resp.status}: {body}")
        span.set_attribute(semconv.GEN_AI_RESPONSE_ID, body["id"])
    return body
