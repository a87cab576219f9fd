"""`StoreServing`: how a trainer's store is reached by runners on other machines, and `OpenedStore` that applies it."""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentlightning._netauth import check_bind_token, new_token
from agentlightning.store._base import LightningStore, RetryPolicy, StoreError
from agentlightning.store._client import StoreClient
from agentlightning.store._client_transport import split_urls
from agentlightning.store._postgres_schema import describe_dsn, driver, is_postgres_dsn, one_line
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
        serve: ``HOST:PORT`` at which to serve the trainer's store to runners on other machines (``agl store serve``
            child processes; with ``servers`` > 1 on ``PORT``, ``PORT + 1``...); ``None``: runners on this machine
            share the SQLite file, or reach the database through servers on loopback.
        url: A store already served elsewhere (``agl store serve``) to use instead of a file; several servers of one
            store separated by commas (each client fails over to the next, `StoreClient`).
        database: A PostgreSQL database (``postgresql://user:password@host:port/dbname``) to keep the store in
            instead of a file: the trainer uses it directly and serves it to the runners from ``servers`` store
            servers over it. It must hold no rollouts yet (a fresh database, or a fresh schema of one).
        servers: Store servers over ``database`` (``agl store serve --db DSN`` child processes, stateless): the
            runners are spread over them and each fails over to the others when its own dies.
        token: Bearer token of the served store (``serve`` or ``url``); required, 16+ characters, off loopback;
            ``None`` when serving on loopback: a new one (`OpenedStore.token`).
        heartbeat_timeout_s: Seconds without a heartbeat after which a runner's rollout is retried elsewhere.
        access_log: Log every request to the served store with the client's address (``store_server.log``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    serve: str | None = None
    url: str | None = None
    database: str | None = None
    servers: int = Field(default=1, ge=1)
    token: str | None = None
    heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    access_log: bool = False

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return None if value is None else ",".join(split_urls(value))

    @field_validator("database")
    @classmethod
    def _dsn(cls, value: str | None) -> str | None:
        if value is not None and not is_postgres_dsn(value):
            raise ValueError("must be a PostgreSQL database: postgresql://user:password@host:port/dbname")
        return value

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
        if self.url is not None and self.database is not None:
            raise ValueError("url and database exclude each other: use a served store, or serve a database")
        if self.servers > 1 and self.database is None:
            raise ValueError("several store servers need the store in PostgreSQL (a database): one serves a file")
        if self.serve is not None:
            check_bind_token(parse_host_port(self.serve)[0], self.token, "the store", "a store token (--store-token)")
        return self

    @property
    def bind(self) -> tuple[str, int] | None:
        """``(host, port)`` of ``serve``, or ``None``."""
        return None if self.serve is None else parse_host_port(self.serve)

    async def open(self, db: str | os.PathLike[str], *, fresh: bool = False) -> OpenedStore:
        """Open the trainer's store: the ``database`` and its servers, the served ``url``, else the SQLite file ``db``
        (served at ``serve`` if set).

        Args:
            db: The SQLite file (ignored with ``url``; with ``database``, the servers' access logs go beside it).
            fresh: Delete ``db`` (and its WAL files) first; with ``database``: refuse one that holds rollouts.

        Raises:
            StoreError: The database is unreachable, refuses the login, or (``fresh``) holds rollouts (one line).
            ImportError: The PostgreSQL driver is missing (the message is the install command).
        """
        policy = RetryPolicy(heartbeat_timeout=self.heartbeat_timeout_s)
        if self.database is not None:
            return await _open_database(self, self.database, policy, Path(db).parent, fresh=fresh)
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

    def describe(self, db: str | os.PathLike[str]) -> str:
        """Where the store is, for messages: the database without its password, the served URL(s) or the file."""
        if self.database is not None:
            return "postgresql://" + describe_dsn(self.database)
        return self.url if self.url is not None else str(db)

    def check_database(self) -> None:
        """With a ``database``: refuse a missing driver, a malformed DSN or a database that does not answer now, before
        anything starts (one connection, closed at once).

        Raises:
            ImportError: The driver is not installed (the message is the install command).
            StoreError: The DSN cannot be parsed, or the database cannot be reached or logged in to (one line, without
                the DSN's password).
        """
        if self.database is None:
            return
        psycopg, _ = driver()
        where = describe_dsn(self.database)
        try:
            psycopg.connect(self.database, connect_timeout=10).close()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the PostgreSQL store {where}: {one_line(exc)}") from None


async def _open_database(
    serving: StoreServing, dsn: str, policy: RetryPolicy, folder: Path, *, fresh: bool
) -> OpenedStore:
    """The `PostgresStore` at ``dsn`` (refused when ``fresh`` and it holds rollouts already) and its store servers."""
    from agentlightning.store._postgres import PostgresStore

    store = await asyncio.to_thread(PostgresStore, dsn, retry_policy=policy)
    servers: list[StoreServerProcess] = []
    try:
        if fresh:
            held = sum((await store.stats()).rollouts.values())
            if held:
                raise StoreError(
                    f"the PostgreSQL store {store.where} holds {held} rollouts already (another run's): give this run "
                    "an empty database, or a schema of its own (postgresql://...?options=-csearch_path%3Dmy_run)"
                )
        host, port = serving.bind or ("127.0.0.1", 0)
        token = serving.token or new_token()  # one for every server: a runner fails over with the same one
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(serving.servers):
            log = folder / f"store_server_{index}.log" if serving.access_log else None
            servers.append(
                StoreServerProcess(
                    dsn,
                    host,
                    port + index if port else _free_port(host),
                    token=token,
                    retry_policy=policy,
                    access_log=serving.access_log,
                    log_file=log,
                )
            )
        await asyncio.gather(*(asyncio.to_thread(server.start) for server in servers))
    except BaseException:
        for server in servers:
            server.stop()
        await store.close()
        raise
    urls = ",".join(server.url for server in servers)
    return OpenedStore(cast(LightningStore, store), servers[0], ["--store-url", urls], token, servers)


def _free_port(host: str) -> int:
    """A port free on ``host`` a moment ago (the server binds it next)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class OpenedStore:
    """A trainer's open store: ``store`` to use, ``server`` serving it (or ``None``), ``runner_args`` for local runners.

    ``runner_args`` is what a runner on this machine passes to reach the same store (``--db FILE`` or
    ``--store-url URL[,URL...]``); ``token`` (the served store's, made by `StoreServerProcess` when none was given)
    travels in ``$AGL_STORE_TOKEN``, never on a command line.

    Attributes:
        servers: Every server of the store (a database's several; ``server`` is the first).
    """

    store: LightningStore
    server: StoreServerProcess | None
    runner_args: list[str]
    token: str | None = None
    servers: list[StoreServerProcess] = field(default_factory=list[StoreServerProcess])

    async def close(self) -> None:
        """Stop serving and close the store."""
        for server in self.servers or ([] if self.server is None else [self.server]):
            server.stop()
        await self.store.close()
