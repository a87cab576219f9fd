"""The store conformance kit, run against `StoreClient` talking to a real ``agl store serve`` process (SQLite file)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from agentlightning.store import LightningStore, RetryPolicy, StoreClient
from agentlightning.testing import StoreServerProcessForTests
from agentlightning.testing._store_kit import StoreConformanceTests, StoreFactory

TOKEN = "kit-token"


class TestServedSqliteStore(StoreConformanceTests):
    supports_reopen = True
    supports_processes = True

    @pytest.fixture
    async def store_factory(self, tmp_path: Path) -> AsyncIterator[StoreFactory]:
        servers: list[StoreServerProcessForTests] = []
        clients: list[StoreClient] = []
        counter = itertools.count()

        async def make(retry_policy: RetryPolicy | None = None) -> LightningStore:
            server = StoreServerProcessForTests(
                tmp_path / f"store-{next(counter)}.db", token=TOKEN, retry_policy=retry_policy
            )
            servers.append(server.start())
            client = StoreClient(server.url, token=TOKEN)
            clients.append(client)
            return client

        yield make
        for client in clients:
            await client.close()
        for server in servers:
            server.stop()

    @pytest.fixture
    async def store_reopener(self) -> Callable[[LightningStore], Awaitable[LightningStore]]:
        async def reopen(store: LightningStore) -> LightningStore:
            # A new client (new connections) on the same served file; the server-restart case is in
            # test_store_server_reliability.py.
            cls, kwargs = store.reopen_spec()  # type: ignore[attr-defined]
            return cls(**kwargs)

        return reopen
