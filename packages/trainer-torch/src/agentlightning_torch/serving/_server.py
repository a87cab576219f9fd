"""An OpenAI-compatible HTTP server over `LocalBackend` (the API itself is `OpenAIEndpoint`, ``_endpoint.py``).

The torch trainer's own LLM proxy calls the endpoint in-process; this server is for clients in other processes
(``agl-torch serve``, ``TorchTrainerConfig.backend_http``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentlightning.netauth import bearer_matches, check_bind_token
from agentlightning_torch.serving._backend import LocalBackend
from agentlightning_torch.serving._endpoint import OpenAIEndpoint, bad_request, server_error
from agentlightning_torch.serving._wire import BadRequest, ServerError

__all__ = ["BackendServer", "create_app", "serve_backend"]

logger = logging.getLogger(__name__)


class _BearerOnly:
    """Every request but ``GET /health`` needs ``Authorization: Bearer <token>``; others get a 401."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            headers = dict(scope["headers"])
            if not bearer_matches(headers.get(b"authorization"), self.token):
                refusal = bad_request(401, "this backend needs 'Authorization: Bearer <token>'")
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(backend: LocalBackend, token: str | None = None) -> FastAPI:
    """The FastAPI app serving ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` and ``/tokenize`` for
    ``backend``.

    With ``token``, every request but ``GET /health`` must carry it as a bearer token (401 otherwise).
    """
    app = FastAPI(title="agentlightning local backend")
    if token:
        app.add_middleware(_BearerOnly, token=token)
    endpoint = OpenAIEndpoint(backend)

    @app.exception_handler(BadRequest)
    async def _bad_request(_request: Request, error: BadRequest) -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
        return bad_request(400, str(error), error.param)

    @app.exception_handler(ServerError)
    async def _server_error(_request: Request, error: ServerError) -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
        return server_error(error)

    @app.get("/v1/models")
    async def _models() -> Response:  # pyright: ignore[reportUnusedFunction]
        return endpoint.models()

    @app.get("/health")
    async def _health() -> Response:  # pyright: ignore[reportUnusedFunction]
        return endpoint.health()

    @app.post("/v1/chat/completions")
    async def _chat(request: Request) -> Response:  # pyright: ignore[reportUnusedFunction]
        return await endpoint.chat(await request.body())

    @app.post("/v1/completions")
    async def _complete(request: Request) -> Response:  # pyright: ignore[reportUnusedFunction]
        return await endpoint.complete(await request.body())

    @app.post("/tokenize")
    async def _tokenize(request: Request) -> Response:  # pyright: ignore[reportUnusedFunction]
        return endpoint.tokenize(await request.body())

    return app


class BackendServer:
    """Runs the OpenAI-compatible app for a backend with uvicorn in a background thread on 127.0.0.1.

    Args:
        backend: The backend to serve (started by `start` if it is not running).
        host: Interface to bind.
        port: Port to bind; 0 picks a free one.
        token: Bearer token every request but ``GET /health`` must carry. Off loopback one of at least 16
            characters is required, as for every server of the project (`agentlightning.netauth`).

    Raises:
        ValueError: If ``host`` is off loopback and ``token`` is missing or short.
    """

    def __init__(self, backend: LocalBackend, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        check_bind_token(host, token, "the local backend", "token=...")
        self.backend = backend
        self.host = host
        self.port = port
        self.token = token
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:PORT`` (the OpenAI base URL is `base_url`)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``{url}/v1``."""
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> BackendServer:
        """Start the backend worker and the HTTP server; returns when the server accepts connections.

        Raises:
            RuntimeError: If the server did not come up within ``timeout`` seconds.
        """
        if self._server is not None:
            return self
        self.backend.start()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(create_app(self.backend, self.token), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="agentlightning-backend-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the backend HTTP server did not start on {self.url}")
            time.sleep(0.01)
        logger.info("local backend serving %s at %s", self.backend.model_name, self.base_url)
        return self

    def stop(self) -> None:
        """Stop the HTTP server and the backend worker."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._server, self._thread = None, None
        self.backend.stop()

    def __enter__(self) -> BackendServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_backend(
    backend: LocalBackend, host: str = "127.0.0.1", port: int = 0, token: str | None = None
) -> BackendServer:
    """Start serving ``backend`` over HTTP and return the running `BackendServer` (call ``.stop()`` when done).

    Off loopback ``token`` (16+ characters) is required; see `BackendServer`.
    """
    return BackendServer(backend, host, port, token).start()
