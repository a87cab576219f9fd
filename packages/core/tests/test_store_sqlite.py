"""SqliteStore: the conformance kit on a real file, crash safety with SIGKILL, and sharing between processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from agentlightning import SqliteStore
from agentlightning.store import LightningStore, RetryPolicy, StoreError
from agentlightning.testing import StoreConformanceTests
from agentlightning.testing._store_kit import StoreFactory, make_span


class TestSqliteStore(StoreConformanceTests):
    supports_reopen = True
    supports_processes = True

    @pytest.fixture
    async def store_factory(self, tmp_path: Path) -> AsyncIterator[StoreFactory]:
        stores: list[SqliteStore] = []

        async def make(retry_policy: RetryPolicy | None = None) -> LightningStore:
            store = SqliteStore(tmp_path / f"store-{len(stores)}.db", retry_policy=retry_policy)
            stores.append(store)
            return store

        yield make
        for store in stores:
            await store.close()

    @pytest.fixture
    async def store_reopener(self) -> Callable[[LightningStore], Awaitable[LightningStore]]:
        async def reopen(store: LightningStore) -> LightningStore:
            assert isinstance(store, SqliteStore)
            cls, kwargs = store.reopen_spec()
            return cls(**kwargs)

        return reopen


class TestSqliteStoreFullSync(TestSqliteStore):
    """The same semantics with ``synchronous=FULL`` (fsync on every commit)."""

    # sharing between processes does not depend on fsync; TestSqliteStore covers it (saves ~10 s of spawns)
    supports_processes = False

    @pytest.fixture
    async def store_factory(self, tmp_path: Path) -> AsyncIterator[StoreFactory]:
        stores: list[SqliteStore] = []

        async def make(retry_policy: RetryPolicy | None = None) -> LightningStore:
            store = SqliteStore(tmp_path / f"full-{len(stores)}.db", retry_policy=retry_policy, synchronous="FULL")
            stores.append(store)
            return store

        yield make
        for store in stores:
            await store.close()


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from agentlightning import SqliteStore
    from agentlightning.testing._store_kit import make_span

    async def main():
        store = SqliteStore(sys.argv[1])
        i = 0
        while True:
            rollout = await store.enqueue_rollout({"i": i}, rollout_id=f"r{i}")
            print(f"rollout {rollout.rollout_id}", flush=True)
            claim = await store.dequeue_rollout(worker_id="writer")
            print(f"claim {claim.rollout.rollout_id} {claim.attempt.attempt_id}", flush=True)
            for j in range(0, 20, 5):
                spans = [make_span(claim.rollout.rollout_id, claim.attempt.attempt_id, k) for k in range(j, j + 5)]
                await store.add_spans(spans)
                print(f"spans {claim.rollout.rollout_id} {claim.attempt.attempt_id} {j + 5}", flush=True)
            i += 1

    asyncio.run(main())
    """
)


async def test_killed_writer_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    acks: list[list[str]] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            acks.append(line.split())
            if len(acks) >= 150:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(acks) >= 150, proc.stderr.read() if proc.stderr else ""

    store = SqliteStore(path)
    try:
        rollouts = {r.rollout_id: r for r in await store.query_rollouts()}
        for ack in acks:
            if ack[0] == "rollout":
                assert ack[1] in rollouts
            elif ack[0] == "claim":
                assert rollouts[ack[1]].status == "running"
                assert [a.attempt_id for a in await store.query_attempts(ack[1])] == [ack[2]]
            else:
                spans = await store.query_spans(ack[1], ack[2])
                assert len(spans) >= int(ack[3])
                assert [s.sequence_id for s in spans] == list(range(len(spans)))
                assert spans[0] == make_span(ack[1], ack[2], 0)
        # the reopened file is fully usable: new writes and a fresh claim work
        await store.enqueue_rollout("after crash", rollout_id="after")
        claim = await store.dequeue_rollout()
        assert claim is not None
    finally:
        await store.close()


async def test_two_handles_one_file_see_each_other(tmp_path: Path) -> None:
    a = SqliteStore(tmp_path / "shared.db")
    b = SqliteStore(tmp_path / "shared.db")
    try:
        rollout = await a.enqueue_rollout("x")
        waiter = asyncio.create_task(b.wait_for_rollouts([rollout.rollout_id], timeout=30))
        claim = await b.dequeue_rollout()
        assert claim is not None and claim.rollout.rollout_id == rollout.rollout_id
        assert await a.dequeue_rollout() is None
        await a.finish_attempt(rollout.rollout_id, claim.attempt.attempt_id, "succeeded")
        (finished,) = await waiter  # b learns of a's change by polling the file
        assert finished.status == "succeeded"
    finally:
        await a.close()
        await b.close()


async def test_closed_store_says_so(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db")
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await store.get_rollout("x")


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"junk\.db"):
        SqliteStore(path)


def test_bad_synchronous(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteStore(tmp_path / "x.db", synchronous="OFF")  # type: ignore[arg-type]


async def test_non_json_input_rejected(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "j.db")
    try:
        with pytest.raises(ValueError, match="rollout input"):
            await store.enqueue_rollout(object())
        assert await store.query_rollouts() == []
    finally:
        await store.close()
