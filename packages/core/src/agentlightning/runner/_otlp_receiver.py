"""OTLP in for a runner whose store is not served (a SQLite file, memory): the runner receives its commands' spans.

A runner over a served store points its command agents at the store server's ``POST /v1/traces``
(`agentlightning.store._otlp_in`). A runner that opened the store itself (``agl runner --db``, the local runners of
``agl train``, a `Runner` in a script) has no server to point them at, so it serves the same route itself, on
loopback, from the event loop the rollout runs in, for as long as the rollout's command runs (a server start costs
about a millisecond, against the command's own start of tenths of a second). Its credential is made with a random
key of its own and good for that attempt only; the body goes through the same `spans_from_otlp` as on the store
server, and the spans into the runner's store.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from agentlightning._otlp_auth import attempt_credential
from agentlightning._server_base import STORE_MAX_BODY_BYTES
from agentlightning.store import AttemptEndedError, LightningStore, NotFoundError, StoreError
from agentlightning.store._otlp_in import OTLP_PATH, OtlpError, credential_attempt, spans_from_otlp

__all__ = ["OtlpReceiver"]

logger = logging.getLogger(__name__)


class OtlpReceiver:
    """``POST /v1/traces`` on ``127.0.0.1`` for one store, in the running event loop (see the module docstring).

    Use it as ``async with OtlpReceiver(store) as url:``; `credential` makes an attempt's credential.
    """

    def __init__(self, store: LightningStore) -> None:
        self.store = store
        self.key = secrets.token_urlsafe(32)
        self.url: str | None = None
        self._runner: Any = None

    async def start(self) -> str:
        """Listen on a free loopback port; returns the traces URL."""
        from aiohttp import web

        app = web.Application(client_max_size=STORE_MAX_BODY_BYTES)
        app.router.add_post(OTLP_PATH, self._traces)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # pyright: ignore[reportPrivateUsage, reportOptionalMemberAccess, reportUnknownMemberType, reportUnknownVariableType]
        self.url = f"http://127.0.0.1:{port}{OTLP_PATH}"
        return self.url

    async def stop(self) -> None:
        """Stop listening (a request being answered is finished first)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def credential(self, rollout_id: str, attempt_id: str) -> str:
        """The bearer credential for the spans of one attempt."""
        return attempt_credential(self.key, rollout_id, attempt_id)

    async def _traces(self, request: Any) -> Any:
        from aiohttp import web

        allowed = credential_attempt(self.key, request.headers.get("Authorization"))
        if allowed is None:
            return _error(401, "missing or wrong credential: send the one the runner set in OTEL_EXPORTER_OTLP_HEADERS")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body over {STORE_MAX_BODY_BYTES} bytes; send smaller batches")
        try:
            await self.store.add_spans(spans_from_otlp(body, allowed))
        except OtlpError as exc:
            return _error(exc.status, str(exc))
        except NotFoundError as exc:
            return _error(404, str(exc))
        except AttemptEndedError as exc:
            return _error(409, str(exc))
        except StoreError as exc:
            return _error(400, str(exc))
        if body.lstrip()[:1] == b"{":
            return web.Response(body=b"{}", content_type="application/json")
        return web.Response(body=b"", content_type="application/x-protobuf")


def _error(status: int, message: str) -> Any:
    from aiohttp import web

    return web.json_response({"error": "invalid" if status < 403 else "forbidden", "message": message}, status=status)
