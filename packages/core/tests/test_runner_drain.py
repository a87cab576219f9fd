"""Runners that go away cleanly and come back: drain releases claims at once, `agl runner` survives store restarts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning.runner import ROOT_SPAN_NAME
from agentlightning.store import RELEASED, MemoryStore, SqliteStore
from agentlightning.testing import StoreServerProcessForTests, free_port, wait_until

AGL = [sys.executable, "-m", "agentlightning.cli"]
# A heartbeat timeout far longer than any test: a rollout that comes back did so because it was released.
NEVER = agl.RetryPolicy(max_attempts=3, heartbeat_timeout=3600)

_started = threading.Semaphore(0)
_release_sync = threading.Event()


@agl.rollout
async def stall_async(task):
    _started.release()
    await asyncio.Event().wait()


@agl.rollout
def stall_sync(task):
    _started.release()
    _release_sync.wait(120)
    return 0.0


@agl.rollout
async def done(task):
    return 1.0


AGENTS = """
import asyncio, pathlib, time
import agentlightning as agl

@agl.rollout
async def stall_async(task):
    with open(pathlib.Path(__file__).with_name("started.log"), "a") as log:  # the agent runs (its root span too)
        log.write("started\\n")
    await asyncio.Event().wait()

@agl.rollout
def stall_sync(task):
    time.sleep(3600)

@agl.rollout
async def done(task):
    return 1.0
"""


async def _assert_released(store: agl.LightningStore, rollout_ids: list[str], released: int) -> None:
    rollouts = await store.query_rollouts(rollout_ids=rollout_ids)
    assert [r.status for r in rollouts] == ["queuing"] * len(rollout_ids)
    attempts = [a for rid in rollout_ids for a in await store.query_attempts(rid)]
    assert len(attempts) == released
    assert all(a.status == "cancelled" and a.error == RELEASED for a in attempts)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_drain_releases_running_async_rollouts_at_once(tmp_path: Path, backend: str) -> None:
    store = MemoryStore(NEVER) if backend == "memory" else SqliteStore(tmp_path / "s.db", NEVER)
    ids = [(await store.enqueue_rollout({"i": i})).rollout_id for i in range(3)]
    runner = agl.Runner(stall_async, store, n_workers=2, poll_interval=0.02)
    task = asyncio.create_task(runner.arun())
    for _ in range(2):
        await asyncio.to_thread(_started.acquire)
    runner.drain()
    await asyncio.wait_for(task, 60)
    await _assert_released(store, ids, released=2)
    # another runner takes them at once: no heartbeat timeout to wait for
    await agl.Runner(done, store, n_workers=3, stop_when_idle=True, poll_interval=0.02).arun()
    assert [r.status for r in await store.query_rollouts(rollout_ids=ids)] == ["succeeded"] * 3
    await store.close()


class _SlowResources(MemoryStore):
    """Resources that take until ``gate`` opens: a drain lands between the claim and the agent's start."""

    def __init__(self) -> None:
        super().__init__(NEVER)
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()

    async def get_resources(self, resources_id: str | None = None) -> agl.Resources | None:
        self.asked.set()
        await self.gate.wait()
        return await super().get_resources(resources_id)


async def test_drain_releases_a_claim_whose_agent_has_not_started() -> None:
    store = _SlowResources()
    ids = await _enqueue(store, 1)
    runner = agl.Runner(stall_async, store, n_workers=1, poll_interval=0.02)
    task = asyncio.create_task(runner.arun())
    await store.asked.wait()
    runner.drain()
    await asyncio.wait_for(task, 60)
    await _assert_released(store, ids, released=1)


def test_drain_releases_claims_of_sync_agents_in_threads(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db", NEVER)
    ids = asyncio.run(_enqueue(store, 2))
    runner = agl.Runner(stall_sync, store, n_workers=2, worker_mode="thread", poll_interval=0.02)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        for _ in range(2):
            assert _started.acquire(timeout=120)
        runner.drain(0.0)
        thread.join(60)
        assert not thread.is_alive()
        asyncio.run(_assert_released(store, ids, released=2))
    finally:
        _release_sync.set()
        asyncio.run(store.close())


async def _enqueue(store: agl.LightningStore, n: int) -> list[str]:
    return [(await store.enqueue_rollout({"i": i})).rollout_id for i in range(n)]


@pytest.mark.parametrize(("mode", "agent"), [("async", "stall_async"), ("process", "stall_sync")])
def test_agl_runner_releases_its_claims_on_sigterm(tmp_path: Path, mode: str, agent: str) -> None:
    (tmp_path / "agents.py").write_text(AGENTS)
    db = tmp_path / "s.db"
    store = SqliteStore(db, NEVER)
    ids = asyncio.run(_enqueue(store, 3))
    cmd = [*AGL, "runner", "--db", str(db), "--app-dir", str(tmp_path), "--agent", f"agents:{agent}"]
    cmd += ["--workers", "2", "--worker-mode", mode, "--no-instrument", "--poll-interval", "0.02"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:

        def two_running() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return asyncio.run(store.stats()).rollouts.get("running", 0) == 2

        wait_until(two_running, "two claims")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    asyncio.run(_assert_released(store, ids, released=2))
    asyncio.run(store.close())


def test_agl_runner_reconnects_when_the_store_restarts(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(AGENTS)
    token = "store-token-0123456789"
    port = free_port()
    cmd = [*AGL, "runner", "--store-url", f"http://127.0.0.1:{port}", "--app-dir", str(tmp_path)]
    cmd += ["--agent", "agents:done", "--workers", "2", "--no-instrument", "--poll-interval", "0.02"]
    # started before its store exists, as a worker machine may be
    runner = subprocess.Popen(cmd, env={**os.environ, "AGL_STORE_TOKEN": token}, stderr=subprocess.PIPE, text=True)
    server = StoreServerProcessForTests(tmp_path / "served.db", token=token, port=port)
    try:
        for round_ in range(2):
            server.start()

            async def one_round() -> list[agl.Rollout]:
                client = agl.StoreClient(server.url, token=token)
                try:
                    ids = await _enqueue(client, 3)
                    return await client.wait_for_rollouts(ids, timeout=120)
                finally:
                    await client.close()

            finished = asyncio.run(one_round())
            assert [r.status for r in finished] == ["succeeded"] * 3, round_
            assert runner.poll() is None
            server.kill()  # the trainer's machine goes down hard; the runner keeps waiting for it
    finally:
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(60) == 0
        server.stop()


async def test_runner_backs_off_while_the_store_is_down_and_says_when_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = "store-token-0123456789"
    server = StoreServerProcessForTests(tmp_path / "served.db", token=token)
    client = agl.StoreClient(server.url, token=token, retries=0)  # every failed request reaches the runner
    runner = agl.Runner(done, client, n_workers=2, poll_interval=0.02)
    task = asyncio.create_task(runner.arun())
    try:
        while not any("cannot reach the store" in r.getMessage() for r in caplog.records):
            assert not task.done()
            await asyncio.sleep(0.02)
        await asyncio.to_thread(server.start)
        ids = await _enqueue(client, 3)
        finished = await client.wait_for_rollouts(ids, timeout=120)
        assert [r.status for r in finished] == ["succeeded"] * 3
        assert any("reachable again" in r.getMessage() for r in caplog.records)
        assert sum("cannot reach the store" in r.getMessage() for r in caplog.records) == 1  # one warning, not a flood
    finally:
        runner.stop()
        await asyncio.wait_for(task, 60)
        await client.close()
        await asyncio.to_thread(server.stop)


def test_a_worker_abandoned_by_a_drain_ends_quietly_when_the_store_loop_is_gone() -> None:
    """The drained runner closed its store loop; the abandoned worker's next store call neither leaks a
    never-awaited coroutine nor raises a bare RuntimeError in its thread."""
    import asyncio
    import warnings

    from agentlightning.runner._workers import RunnerStopped, call_on

    loop = asyncio.new_event_loop()
    loop.close()

    async def store_call() -> int:
        return 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be an error here
        with pytest.raises(RunnerStopped, match="store loop has stopped"):
            call_on(loop)(store_call())


@pytest.mark.parametrize("where", ["db", "store-url"])
def test_agl_runner_stops_quietly_on_sigterm(tmp_path: Path, where: str) -> None:
    """A stop someone asked for prints nothing past the runner's first line: its last spans are stored before the
    store is closed (no "could not write N spans ... is closed", no aiohttp "Unclosed connector")."""
    (tmp_path / "agents.py").write_text(AGENTS)
    token = "store-token-0123456789"
    server = None
    if where == "store-url":
        server = StoreServerProcessForTests(tmp_path / "served.db", token=token, retry_policy=NEVER).start()
        store: agl.LightningStore = agl.StoreClient(server.url, token=token)
        location = ["--store-url", server.url]
    else:
        store = SqliteStore(tmp_path / "s.db", NEVER)
        location = ["--db", str(tmp_path / "s.db")]
    try:
        ids = asyncio.run(_enqueue(store, 3))
        cmd = [*AGL, "runner", *location, "--app-dir", str(tmp_path), "--agent", "agents:stall_async"]
        cmd += ["--workers", "2", "--no-instrument", "--poll-interval", "0.02"]
        proc = subprocess.Popen(cmd, env={**os.environ, "AGL_STORE_TOKEN": token}, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: asyncio.run(store.stats()).rollouts.get("running", 0) == 2, "two claims")
            # and both agents started: a claim drained before its agent starts is released without a trace
            started = tmp_path / "started.log"
            wait_until(lambda: started.exists() and len(started.read_text().split()) == 2, "two agents started")
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, stderr
        assert [line for line in stderr.splitlines() if line.strip()][1:] == [], stderr
        asyncio.run(_assert_released(store, ids, released=2))

        async def root_spans() -> list[str]:
            return [span.name for rid in ids for span in await store.query_spans(rid) if span.name == ROOT_SPAN_NAME]

        assert asyncio.run(root_spans()) == [ROOT_SPAN_NAME] * 2  # each released attempt's trace was stored
    finally:
        asyncio.run(store.close())
        if server is not None:
            server.stop()
