"""PostgresStore: the conformance kit on a real PostgreSQL server, and what is specific to it (DSN and
connection errors, schema versions, storage refusals, sharing one database between stores)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agentlightning import PostgresStore
from agentlightning.store import LightningStore, RetryPolicy
from agentlightning.testing import PostgresServer, StoreConformanceTests
from agentlightning.testing._store_kit import StoreFactory


class TestPostgresStore(StoreConformanceTests):
    supports_reopen = True
    supports_processes = True

    @pytest.fixture
    async def store_factory(self, agl_postgres: PostgresServer) -> AsyncIterator[StoreFactory]:
        stores: list[PostgresStore] = []

        async def make(retry_policy: RetryPolicy | None = None) -> LightningStore:
            store = PostgresStore(agl_postgres.new_schema(), retry_policy=retry_policy, pool_size=4)
            stores.append(store)
            return store

        yield make
        for store in stores:
            await store.close()

    @pytest.fixture
    async def store_reopener(self) -> Callable[[LightningStore], Awaitable[LightningStore]]:
        async def reopen(store: LightningStore) -> LightningStore:
            assert isinstance(store, PostgresStore)
            cls, kwargs = store.reopen_spec()
            return cls(**kwargs)

        return reopen
