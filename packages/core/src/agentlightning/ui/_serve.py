"""Serve the dashboard (and the store API it reads) from a background thread of a training script."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from types import TracebackType

import uvicorn

from agentlightning._netauth import check_bind_token, new_token
from agentlightning._quiet_server import QuietServer
from agentlightning.store import LightningStore, SqliteStore

__all__ = ["DashboardServer"]

logger = logging.getLogger(__name__)


class DashboardServer:
    """The store API and the ``/ui`` dashboard on a port of this process, served from a daemon thread.

    Give it the SQLite file the run writes to: it opens its own `SqliteStore` on it (WAL lets it read while the
    run writes), so the dashboard shows the run live. The quickstart starts one and prints its `url`, which carries
    the token: a web page in the user's browser could otherwise write to a store on this machine.

    Args:
        store: A SQLite file, or any store object safe to use from another thread's event loop.
        host: Interface to bind (loopback by default; anything else needs a ``token`` of 16+ characters).
        port: Port to bind (0: a free one).
        token: Bearer token the API requires (``None``: a random one, in `url`).

    Raises:
        ValueError: Off loopback without a token or with a short one (the rule of every server,
            `agentlightning._netauth.check_bind_token`).
    """

    def __init__(
        self, store: str | Path | LightningStore, host: str = "127.0.0.1", port: int = 0, token: str | None = None
    ) -> None:
        check_bind_token(host, token, "the store", "token=...")
        self._owns_store = isinstance(store, str | Path)
        self.store: LightningStore = SqliteStore(store) if isinstance(store, str | Path) else store
        self.host = host
        self.port = port
        self.token: str = token or new_token()
        self._server: QuietServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The store API's address, e.g. ``http://127.0.0.1:4747`` (`StoreClient` with `token`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The address to open, token included: ``http://127.0.0.1:4747/ui#token=...``.

        The token is in the fragment: the browser never sends it to the server (nor in a ``Referer``), and the page
        moves it to the tab's ``sessionStorage`` and out of the address bar.
        """
        return f"{self.base_url}/ui#token={self.token}"

    def start(self, timeout: float = 30.0) -> DashboardServer:
        """Start serving; returns once the port listens (raises `RuntimeError` if it cannot bind)."""
        from agentlightning.store._server import create_store_app
        from agentlightning.ui._routes import ui_routes

        app = create_store_app(self.store, token=self.token, extra_routes=ui_routes(self.store))
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", access_log=False,
                                lifespan="off")  # fmt: skip
        server = QuietServer(config)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                server.run()
            except BaseException as exc:  # e.g. the port is taken: reported below
                failure.append(exc)
            finally:
                if self._owns_store:
                    asyncio.run(self.store.close())  # the file stays; this handle on it is released

        thread = threading.Thread(target=run, name="agl-dashboard", daemon=True)
        thread.start()
        waited = 0.0
        while not server.started:
            if not thread.is_alive() or waited > timeout:
                reason = failure[0] if failure else "it did not start in time"
                raise RuntimeError(f"dashboard could not serve on {self.host}:{self.port}: {reason!r}")
            thread.join(0.02)
            waited += 0.02
        self.port = int(server.servers[0].sockets[0].getsockname()[1])
        self._server, self._thread = server, thread
        logger.info("dashboard at %s/ui", self.base_url)  # the URL with its token is the caller's to print
        return self

    def stop(self) -> None:
        """Stop serving and close the store it opened (idempotent)."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(30)
        self._server = self._thread = None

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
