"""MemoryStore against the shared store conformance kit, plus what is specific to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentlightning import MemoryStore
from agentlightning.store import LightningStore, RetryPolicy
from agentlightning.testing import StoreConformanceTests, StoreFactory


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


async def test_a_store_without_a_policy_retries_a_failed_attempt_twice() -> None:
    """The documented default (3 attempts, failures retried) is what a plain ``MemoryStore()`` does."""
    store = MemoryStore()
    rollout = await store.enqueue_rollout("flaky")
    statuses: list[str] = []
    while (claim := await store.dequeue_rollout()) is not None:
        after = await store.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "failed", error="boom")
        statuses.append(after.status)
    assert statuses == ["queuing", "queuing", "failed"]
    assert len(await store.query_attempts(rollout.rollout_id)) == RetryPolicy().max_attempts
