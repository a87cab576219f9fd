"""MemoryStore against the shared store conformance kit, plus what is specific to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentlightning import MemoryStore
from agentlightning.store import LightningStore, RetryPolicy
from agentlightning.testing import StoreConformanceTests
from agentlightning.testing._store_kit import StoreFactory


class TestMemoryStore(StoreConformanceTests):
    @pytest.fixture
    async def store_factory(self) -> AsyncIterator[StoreFactory]:
        stores: list[MemoryStore] = []

        async def make(retry_policy: RetryPolicy | None = None) -> LightningStore:
            store = MemoryStore(retry_policy=retry_policy)
            stores.append(store)
            return store

        yield make
        for store in stores:
            await store.close()


def test_memory_store_cannot_cross_processes() -> None:
    with pytest.raises(TypeError, match="cannot be shared across processes"):
        MemoryStore().reopen_spec()


def test_default_retry_policy() -> None:
    assert MemoryStore().retry_policy == RetryPolicy()
