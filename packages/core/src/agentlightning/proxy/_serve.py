"""Serving an ASGI app with uvicorn inside the running event loop or from a background thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import uvicorn

from agentlightning._quiet_server import QuietServer

__all__ = ["ServerHandle"]


def _config(app: Any, host: str, port: int) -> uvicorn.Config:
    # Agents reach the proxy directly: no X-Forwarded-* rewriting (one ASGI layer less per request).
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on", proxy_headers=False
    )


def _bound_port(server: uvicorn.Server) -> int:
    for srv in server.servers:
        for sock in srv.sockets:
            return int(sock.getsockname()[1])
    raise RuntimeError("uvicorn started without a listening socket")


class ServerHandle:
    """A running uvicorn server: its port and how to stop it."""

    def __init__(self, server: uvicorn.Server, port: int) -> None:
        self.server = server
        self.port = port
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    async def start_in_loop(cls, app: Any, host: str, port: int) -> ServerHandle:
        """Serve ``app`` as a task of the running loop; returns once it listens."""
        server = QuietServer(_config(app, host, port))
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                exc = task.exception() if not task.cancelled() else None
                raise RuntimeError(f"LLM proxy failed to start on {host}:{port}: {exc!r}")
            await asyncio.sleep(0.01)
        handle = cls(server, _bound_port(server))
        handle._task = task
        return handle

    @classmethod
    def start_in_thread(cls, app: Any, host: str, port: int) -> ServerHandle:
        """Serve ``app`` from a daemon thread with its own event loop; returns once it listens."""
        server = QuietServer(_config(app, host, port))
        failure: list[BaseException] = []

        def run() -> None:
            try:
                server.run()
            except BaseException as exc:  # reported to the caller below (uvicorn exits on bind errors)
                failure.append(exc)

        thread = threading.Thread(target=run, name="agl-llm-proxy", daemon=True)
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"LLM proxy failed to start on {host}:{port}: {failure[0] if failure else '?'!r}")
            thread.join(0.01)
        handle = cls(server, _bound_port(server))
        handle._thread = thread
        return handle

    async def stop(self) -> None:
        """Stop serving (the app's shutdown flushes pending records) and wait until done."""
        self.server.should_exit = True
        if self._task is not None:
            await self._task
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
