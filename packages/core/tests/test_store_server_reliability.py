"""A served SQLite store under stress: restarts, kills, concurrent writers, retried requests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentlightning.store import RolloutRequest, StoreClient
from agentlightning.store._client import StoreUnavailableError, UnauthorizedError
from agentlightning.testing import StoreServerProcessForTests
from agentlightning.testing._store_kit import make_call, make_span

TOKEN = "reliability-token"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[StoreServerProcessForTests]:
    server = StoreServerProcessForTests(tmp_path / "served.db", token=TOKEN)
    with server:
        yield server


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
async def test_restart_keeps_every_acknowledged_write(served: StoreServerProcessForTests, hard: bool) -> None:
    client = StoreClient(served.url, token=TOKEN)
    try:
        queued = await client.enqueue_rollouts([RolloutRequest(rollout_id=f"q-{i}", input=i) for i in range(20)])
        claims = [await client.dequeue_rollout(worker_id="w") for _ in range(5)]
        acked_spans = 0
        for n, claim in enumerate(claims):
            assert claim is not None
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            acked_spans += await client.add_spans([make_span(rid, aid, i) for i in range(50)])
            await client.add_llm_calls([make_call(rid, aid, 0, 1.0)])
            if n < 3:
                await client.finish_attempt(rid, aid, "succeeded")
        assert acked_spans == 250
        before = await client.stats()
        rollouts_before = await client.query_rollouts()

        served.restart(hard=hard)

        assert await client.stats() == before
        assert await client.query_rollouts() == rollouts_before
        for claim in claims:
            assert claim is not None
            spans = await client.query_spans(claim.rollout.rollout_id)
            assert [s.sequence_id for s in spans] == list(range(50))
        statuses = [r.status for r in await client.query_rollouts()]
        assert statuses.count("succeeded") == 3 and statuses.count("running") == 2 and statuses.count("queuing") == 15
        nxt = await client.dequeue_rollout()
        assert nxt is not None and nxt.rollout.rollout_id == queued[5].rollout_id
    finally:
        await client.close()


@pytest.mark.slow
async def test_concurrent_clients_write_every_span_exactly_once(served: StoreServerProcessForTests) -> None:
    n_clients, per_client, batch = 32, 1_000, 100
    setup = StoreClient(served.url, token=TOKEN)
    await setup.enqueue_rollouts([RolloutRequest(rollout_id=f"c-{i}") for i in range(n_clients)])
    targets: list[tuple[str, str]] = []
    for _ in range(n_clients):
        claim = await setup.dequeue_rollout()
        assert claim is not None
        targets.append((claim.rollout.rollout_id, claim.attempt.attempt_id))
    clients = [StoreClient(served.url, token=TOKEN) for _ in range(n_clients)]

    async def write(client: StoreClient, rid: str, aid: str) -> tuple[int, int]:
        new = again = 0
        for start in range(0, per_client, batch):
            spans = [make_span(rid, aid, i) for i in range(start, start + batch)]
            new += await client.add_spans(spans)
            if start % 300 == 0:  # re-send some batches, as a retry after a lost answer would
                again += await client.add_spans(spans)
        return new, again

    try:
        results = await asyncio.gather(*[write(c, rid, aid) for c, (rid, aid) in zip(clients, targets, strict=True)])
        assert [r[0] for r in results] == [per_client] * n_clients
        assert [r[1] for r in results] == [0] * n_clients
        stats = await setup.stats()
        assert stats.spans == n_clients * per_client
        for rid, aid in targets[:4]:
            spans = await setup.query_spans(rid, aid)
            assert [s.sequence_id for s in spans] == list(range(per_client))
            assert len({s.span_id for s in spans}) == per_client
    finally:
        for client in [setup, *clients]:
            await client.close()


async def test_process_rejects_missing_and_wrong_tokens(served: StoreServerProcessForTests) -> None:
    for token in (None, "wrong-token"):
        client = StoreClient(served.url, token=token, retries=0)
        try:
            with pytest.raises(UnauthorizedError, match="bearer token"):
                await client.stats()
            with pytest.raises(UnauthorizedError):
                await client.enqueue_rollout("x")
        finally:
            await client.close()
    good = StoreClient(served.url, token=TOKEN)
    try:
        assert sum((await good.stats()).rollouts.values()) == 0
    finally:
        await good.close()


async def test_client_retries_until_a_restarted_server_answers(served: StoreServerProcessForTests) -> None:
    client = StoreClient(served.url, token=TOKEN, retries=12, backoff=0.05, backoff_max=1.0)
    try:
        await client.enqueue_rollout("before", rollout_id="before")
        served.kill()
        call = asyncio.create_task(client.enqueue_rollout("during", rollout_id="during"))
        dequeue = asyncio.create_task(client.dequeue_rollout(worker_id="w"))
        await asyncio.sleep(0.3)
        assert not call.done() and not dequeue.done()  # still retrying against a dead port
        await asyncio.get_running_loop().run_in_executor(None, served.start)
        rollout = await call
        claim = await dequeue
        assert rollout.rollout_id == "during"
        assert claim is not None and claim.rollout.rollout_id == "before"
        assert [r.rollout_id for r in await client.query_rollouts()] == ["before", "during"]
    finally:
        await client.close()


async def test_client_gives_up_with_a_clear_error(served: StoreServerProcessForTests) -> None:
    client = StoreClient(served.url, token=TOKEN, retries=2, backoff=0.01)
    try:
        served.kill()
        with pytest.raises(StoreUnavailableError, match="after 3 tries"):
            await client.stats()
    finally:
        await client.close()
        served.start()


async def test_client_works_from_several_event_loops(served: StoreServerProcessForTests) -> None:
    """The tracing exporter calls ``add_spans`` from its own thread's loop while the runner uses another."""
    client = StoreClient(served.url, token=TOKEN)
    try:
        await client.enqueue_rollout("x", rollout_id="loops")
        claim = await client.dequeue_rollout()
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id

        def in_thread(start: int) -> int:
            async def run() -> int:
                try:
                    return await client.add_spans([make_span(rid, aid, i) for i in range(start, start + 10)])
                finally:
                    await client.close()

            return asyncio.run(run())

        loop = asyncio.get_running_loop()
        added = await asyncio.gather(*[loop.run_in_executor(None, in_thread, s) for s in (0, 10, 20)])
        assert added == [10, 10, 10]
        assert len(await client.query_spans(rid)) == 30
    finally:
        await client.close()


def test_the_kit_server_is_a_store_server_process_with_a_file_of_its_own() -> None:
    """The test kit's server is a `StoreServerProcess`: the same child; without a ``db``, a fresh SQLite file."""
    from agentlightning import StoreServerProcess

    with StoreServerProcessForTests() as server:
        assert isinstance(server, StoreServerProcess) and server.pid is not None
        assert server.db == server.folder / "store.db" and Path(server.db).exists()
        assert server.url == f"http://127.0.0.1:{server.port}" and "-m agentlightning.cli" in " ".join(server.command())
        port, db = server.port, server.db
        server.restart(hard=True)  # same port, same file
        assert (server.port, server.db) == (port, db) and server.pid is not None
    assert server.pid is None


def test_the_kit_server_quotes_its_output_when_it_cannot_start(tmp_path: Path) -> None:
    server = StoreServerProcessForTests(tmp_path / "s.db", extra_args=["--max-body-mb", "lots"])
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 2.*the server's output:.*--max-body-mb"):
        server.start()
    assert server.pid is None and "invalid float value: 'lots'" in server.output()
