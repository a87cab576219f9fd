"""`StoreServing`: how a trainer's store is reached by runners on other machines, and `OpenedStore` that applies it."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentlightning._netauth import check_bind_token
from agentlightning.store._base import LightningStore, RetryPolicy
from agentlightning.store._client import StoreClient
from agentlightning.store._process import StoreServerProcess
from agentlightning.store._sqlite import SqliteStore

__all__ = ["OpenedStore", "StoreServing", "parse_host_port"]


def parse_host_port(value: str) -> tuple[str, int]:
    """``"10.0.0.5:4747"`` / ``"[::]:4747"`` / ``":4747"`` -> ``(host, port)`` (an empty host means every interface).

    Raises:
        ValueError: Without a port, or with a port outside 0-65535.
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT (e.g. 0.0.0.0:4747), got {value!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port}")
    return host.strip("[]") or "0.0.0.0", port


class StoreServing(BaseModel):
    """Where a trainer's store lives and who can reach it; the defaults keep it a local SQLite file.

    Attributes:
        serve: ``HOST:PORT`` at which to serve the trainer's SQLite file to runners on other machines (an
            ``agl store serve`` child process); ``None``: runners on this machine share the file.
        url: A store already served elsewhere (``agl store serve``) to use instead of a file.
        token: Bearer token of the served store (``serve`` or ``url``); required, 16+ characters, off loopback;
            ``None`` when serving on loopback: a new one (`OpenedStore.token`).
        heartbeat_timeout_s: Seconds without a heartbeat after which a runner's rollout is retried elsewhere.
        access_log: Log every request to the served store with the client's address (``store_server.log``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    serve: str | None = None
    url: str | None = None
    token: str | None = None
    heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    access_log: bool = False

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value.rstrip("/") if value is not None else None

    @field_validator("serve")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            parse_host_port(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> StoreServing:
        if self.serve is not None and self.url is not None:
            raise ValueError("serve and url exclude each other: serve this trainer's store, or use a served one")
        if self.serve is not None:
            check_bind_token(parse_host_port(self.serve)[0], self.token, "the store", "a store token (--store-token)")
        return self

    @property
    def bind(self) -> tuple[str, int] | None:
        """``(host, port)`` of ``serve``, or ``None``."""
        return None if self.serve is None else parse_host_port(self.serve)

    async def open(self, db: str | os.PathLike[str], *, fresh: bool = False) -> OpenedStore:
        """Open the trainer's store: the served ``url``, else the SQLite file ``db`` (served at ``serve`` if set).

        Args:
            db: The SQLite file (ignored with ``url``).
            fresh: Delete ``db`` (and its WAL files) first.
        """
        policy = RetryPolicy(heartbeat_timeout=self.heartbeat_timeout_s)
        if self.url is not None:
            client = cast(LightningStore, StoreClient(self.url, token=self.token))
            return OpenedStore(client, None, ["--store-url", self.url], self.token)
        path = Path(db)
        if fresh:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        store = SqliteStore(path, retry_policy=policy)
        server = None
        if self.bind is not None:
            host, port = self.bind
            log = path.parent / "store_server.log" if self.access_log else None
            server = StoreServerProcess(
                path, host, port, token=self.token, retry_policy=policy, access_log=self.access_log, log_file=log
            )
            try:
                await asyncio.to_thread(server.start)
            except BaseException:
                await store.close()
                raise
        return OpenedStore(store, server, ["--db", str(path)], None if server is None else server.token)


@dataclass
class OpenedStore:
    """A trainer's open store: ``store`` to use, ``server`` serving it (or ``None``), ``runner_args`` for local runners.

    ``runner_args`` is what a runner on this machine passes to reach the same store (``--db FILE`` or
    ``--store-url URL``); ``token`` (the served store's, made by `StoreServerProcess` when none was given) travels in
    ``$AGL_STORE_TOKEN``, never on a command line.
    """

    store: LightningStore
    server: StoreServerProcess | None
    runner_args: list[str]
    token: str | None = None

    async def close(self) -> None:
        """Stop serving and close the store."""
        if self.server is not None:
            self.server.stop()
        await self.store.close()
