"""The runner: workers claim rollouts, run the agent under a root span, and report spans and outcomes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning import semconv
from agentlightning.runner import ROOT_SPAN_NAME
from agentlightning.store import MemoryStore, SqliteStore


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        s = MemoryStore(retry_policy=agl.RetryPolicy(max_attempts=1))
    else:
        s = SqliteStore(tmp_path / "store.db", retry_policy=agl.RetryPolicy(max_attempts=1))
    yield s
    asyncio.run(s.close())


# Agents are module-level so worker processes can import them.
@agl.rollout
async def async_echo(task):
    with agl.get_tracer().start_as_current_span("work", attributes={"task": task["id"]}):
        await asyncio.sleep(0)  # let the other rollouts interleave
        with agl.get_tracer().start_as_current_span("inner", attributes={"task": task["id"]}):
            await asyncio.sleep(0)
    return task["value"]


@agl.rollout
def sync_echo(task, resources):
    for step in range(3):
        with agl.get_tracer().start_as_current_span(f"step{step}", attributes={"task": task["id"]}):
            pass
    agl.emit_reward(0.5, name="partial")
    return {"reward": task["value"]}


@agl.rollout
def failing(task):
    with agl.get_tracer().start_as_current_span("before-crash"):
        pass
    raise ValueError(f"bad task {task['id']}")


async def _enqueue(store, n: int) -> list[str]:
    rollouts = [await store.enqueue_rollout({"id": f"t{i}", "value": float(i)}) for i in range(n)]
    return [r.rollout_id for r in rollouts]


async def _check_clean_rollouts(store, rollout_ids: list[str], inner_names: set[str]) -> None:
    for rid in rollout_ids:
        rollout = await store.get_rollout(rid)
        assert rollout.status == "succeeded", rollout
        [attempt] = await store.query_attempts(rid)
        assert attempt.status == "succeeded"
        spans = await store.query_spans(rid)
        assert {s.attempt_id for s in spans} == {attempt.attempt_id}
        by_name: dict[str, list[agl.Span]] = {}
        for s in spans:
            by_name.setdefault(s.name, []).append(s)
        [root] = by_name.pop(ROOT_SPAN_NAME)
        assert root.attributes[semconv.SPAN_KIND] == semconv.KIND_ROLLOUT
        assert root.parent_id is None
        finals = [s for s in by_name.pop("agentlightning.reward") if s.attributes[semconv.REWARD_FINAL]]
        assert [f.attributes[semconv.REWARD_VALUE] for f in finals] == [rollout.input["value"]]
        assert finals[0].parent_id == root.span_id
        assert set(by_name) == inner_names
        # every span the agent made carries its own task: concurrent rollouts never mixed
        assert {s.attributes["task"] for group in by_name.values() for s in group} == {rollout.input["id"]}


async def test_async_agent_64_concurrent_rollouts(store) -> None:
    ids = await _enqueue(store, 64)
    runner = agl.Runner(async_echo, store, n_workers=64, stop_when_idle=True, poll_interval=0.01)
    assert runner.worker_mode == "async"
    await runner.arun()
    await _check_clean_rollouts(store, ids, {"work", "inner"})


def test_sync_agent_16_threads(store) -> None:
    ids = asyncio.run(_enqueue(store, 48))
    runner = agl.Runner(sync_echo, store, n_workers=16, worker_mode="thread", stop_when_idle=True)
    runner.run()
    asyncio.run(_check_clean_rollouts(store, ids, {"step0", "step1", "step2"}))


def test_sync_agent_in_worker_processes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    ids = asyncio.run(_enqueue(store, 12))
    runner = agl.Runner(sync_echo, store, n_workers=2, stop_when_idle=True, poll_interval=0.05)
    assert runner.worker_mode == "process"
    runner.run()
    asyncio.run(_check_clean_rollouts(store, ids, {"step0", "step1", "step2"}))
    workers = {asyncio.run(store.query_attempts(rid))[0].worker_id for rid in ids}
    assert all(w is not None and w.split(":")[1] != str(__import__("os").getpid()) for w in workers)
    asyncio.run(store.close())


async def test_sync_agent_from_arun_uses_the_callers_loop(store) -> None:
    ids = await _enqueue(store, 6)
    await agl.Runner(sync_echo, store, n_workers=3, worker_mode="thread", stop_when_idle=True).arun()
    await _check_clean_rollouts(store, ids, {"step0", "step1", "step2"})


@pytest.mark.parametrize("mode", ["async", "thread"])
async def test_exception_fails_the_attempt_with_a_traceback_event(store, mode: str) -> None:
    agent = failing
    if mode == "async":

        @agl.rollout
        async def agent(task):
            return failing(task)

    [rid] = await _enqueue(store, 1)
    await agl.Runner(agent, store, worker_mode=mode, stop_when_idle=True).arun()  # type: ignore[arg-type]
    rollout = await store.get_rollout(rid)
    assert rollout.status == "failed"
    [attempt] = await store.query_attempts(rid)
    assert attempt.status == "failed"
    assert attempt.error == "ValueError: bad task t0"
    spans = {s.name: s for s in await store.query_spans(rid)}
    root = spans[ROOT_SPAN_NAME]
    assert root.status.code == "error"
    [event] = root.events
    assert event.name == semconv.EVENT_EXCEPTION
    assert event.attributes["exception.type"] == "ValueError"
    assert "in failing" in str(event.attributes["exception.stacktrace"])
    assert "before-crash" in spans  # what the agent did before failing is kept


async def test_bad_return_value_fails_the_attempt(store) -> None:
    @agl.rollout
    async def agent(task):
        return "great"

    [rid] = await _enqueue(store, 1)
    await agl.Runner(agent, store, stop_when_idle=True).arun()
    [attempt] = await store.query_attempts(rid)
    assert attempt.status == "failed" and "must return a number" in (attempt.error or "")


async def test_failed_attempts_are_retried_per_the_store_policy(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "retry.db", retry_policy=agl.RetryPolicy(max_attempts=3))
    seen: dict[str, int] = {}

    @agl.rollout
    async def flaky(task):
        ctx = agl.current_rollout()
        assert ctx is not None
        seen[ctx.rollout_id] = seen.get(ctx.rollout_id, 0) + 1
        if seen[ctx.rollout_id] < 3:
            raise RuntimeError("try again")
        return 1.0

    [rid] = await _enqueue(store, 1)
    await agl.Runner(flaky, store, stop_when_idle=True, poll_interval=0.01).arun()
    assert (await store.get_rollout(rid)).status == "succeeded"
    attempts = await store.query_attempts(rid)
    assert [a.status for a in attempts] == ["failed", "failed", "succeeded"]
    # each attempt's spans are kept under that attempt
    for attempt in attempts:
        spans = await store.query_spans(rid, attempt.attempt_id)
        assert [s.name for s in spans if s.name == ROOT_SPAN_NAME] == [ROOT_SPAN_NAME]
    await store.close()


async def test_async_timeout_ends_the_attempt_as_timeout(store) -> None:
    @agl.rollout
    async def slow(task):
        with agl.get_tracer().start_as_current_span("waiting"):
            await asyncio.sleep(60)
        return 1.0

    [rid] = await _enqueue(store, 1)
    await agl.Runner(slow, store, rollout_timeout=0.2, stop_when_idle=True).arun()
    [attempt] = await store.query_attempts(rid)
    assert attempt.status == "timeout"
    assert "rollout timeout" in (attempt.error or "")
    assert (await store.get_rollout(rid)).status == "failed"
    names = {s.name for s in await store.query_spans(rid)}
    assert names == {ROOT_SPAN_NAME, "waiting"}  # the cancelled span was ended and stored


def test_sync_timeout_abandons_the_agent(store) -> None:
    release = threading.Event()

    @agl.rollout
    def stuck(task):
        release.wait(60)
        return 1.0

    [rid] = asyncio.run(_enqueue(store, 1))
    try:
        agl.Runner(stuck, store, worker_mode="thread", rollout_timeout=0.2, stop_when_idle=True).run()
        [attempt] = asyncio.run(store.query_attempts(rid))
        assert attempt.status == "timeout"
    finally:
        release.set()


async def test_resources_reach_the_agent(store) -> None:
    await store.add_resources(
        agl.Resources(resources_id="v1", items={"llm": agl.LLMResource(endpoint="http://127.0.0.1:1", model="m")})
    )
    urls: dict[str, str] = {}

    @agl.rollout
    async def agent(task, resources):
        assert resources.resources_id == "v1"
        ctx = agl.current_rollout()
        assert ctx is not None and ctx.input == task
        urls[ctx.rollout_id] = agl.llm_base_url()
        return None  # no final reward

    [rid] = await _enqueue(store, 1)
    await agl.Runner(agent, store, stop_when_idle=True).arun()
    [attempt] = await store.query_attempts(rid)
    assert attempt.status == "succeeded"
    assert urls[rid] == f"http://127.0.0.1:1/rollout/{rid}/attempt/{attempt.attempt_id}/v1"
    assert [s.name for s in await store.query_spans(rid)] == [ROOT_SPAN_NAME]


async def test_max_rollouts_limits_claims(store) -> None:
    await _enqueue(store, 5)
    await agl.Runner(async_echo, store, n_workers=3, max_rollouts=2, stop_when_idle=True).arun()
    counts = (await store.stats()).rollouts
    assert counts.get("succeeded", 0) == 2
    assert counts.get("queuing", 0) == 3


def test_stop_ends_a_runner_waiting_for_work(store) -> None:
    runner = agl.Runner(sync_echo, store, n_workers=2, worker_mode="thread", poll_interval=0.05)
    t = threading.Thread(target=runner.run)
    t.start()
    runner.stop()
    t.join(30)
    assert not t.is_alive()


async def test_heartbeats_keep_a_long_attempt_alive(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "hb.db", retry_policy=agl.RetryPolicy(max_attempts=1, heartbeat_timeout=0.3))
    gate = asyncio.Event()

    @agl.rollout
    async def long(task):
        await asyncio.wait_for(gate.wait(), 30)
        return 1.0

    async def watch() -> None:
        # While the attempt runs, the store's own timeout check must find it alive again and again.
        while not (await store.query_rollouts(status=["running"])):
            await asyncio.sleep(0.01)
        for _ in range(10):
            await asyncio.sleep(0.1)
            assert await store.check_timeouts() == []
        gate.set()

    [rid] = await _enqueue(store, 1)
    runner = agl.Runner(long, store, heartbeat_interval=0.05, stop_when_idle=True)
    await asyncio.gather(runner.arun(), watch())
    [attempt] = await store.query_attempts(rid)
    assert attempt.status == "succeeded"
    await store.close()


def test_auto_mode_choice(tmp_path: Path) -> None:
    memory = MemoryStore()
    sqlite = SqliteStore(tmp_path / "auto.db")

    def local_agent(task):
        return 1.0

    assert agl.Runner(async_echo, sqlite, n_workers=4).worker_mode == "async"
    assert agl.Runner(sync_echo, sqlite, n_workers=4).worker_mode == "process"
    assert agl.Runner(sync_echo, sqlite, n_workers=1).worker_mode == "thread"
    assert agl.Runner(sync_echo, memory, n_workers=4).worker_mode == "thread"  # cannot be reopened elsewhere
    assert agl.Runner(local_agent, sqlite, n_workers=4).worker_mode == "thread"  # cannot be imported by a child
    with pytest.raises(ValueError, match="reopen_spec"):
        agl.Runner(sync_echo, memory, worker_mode="process")
    with pytest.raises(ValueError, match="async agent"):
        agl.Runner(sync_echo, memory, worker_mode="async")
    with pytest.raises(ValueError, match="n_workers"):
        agl.Runner(sync_echo, memory, n_workers=0)
    asyncio.run(sqlite.close())


@pytest.mark.slow
async def test_served_store_async_workers_and_worker_processes(tmp_path: Path) -> None:
    """A real `agl store serve` process over HTTP: an async runner in this loop, then sync worker processes."""
    from agentlightning.store import StoreClient
    from agentlightning.testing import StoreServerProcessForTests

    with StoreServerProcessForTests(tmp_path / "served.db", token="tok") as server:
        client = StoreClient(server.url, token="tok")
        try:
            ids = await _enqueue(client, 16)
            await agl.Runner(async_echo, client, n_workers=8, stop_when_idle=True, poll_interval=0.02).arun()
            await _check_clean_rollouts(client, ids, {"work", "inner"})

            ids = await _enqueue(client, 6)
            runner = agl.Runner(sync_echo, client, n_workers=2, stop_when_idle=True, poll_interval=0.05)
            assert runner.worker_mode == "process"
            await runner.arun()
            await _check_clean_rollouts(client, ids, {"step0", "step1", "step2"})
        finally:
            await client.close()


class _CountingStore(MemoryStore):
    """A memory store that counts the claim requests it answers."""

    def __init__(self) -> None:
        super().__init__(retry_policy=agl.RetryPolicy(max_attempts=1))
        self.claim_requests = 0

    async def dequeue_rollout(self, worker_id=None, *, request_id=None):
        self.claim_requests += 1
        return await super().dequeue_rollout(worker_id, request_id=request_id)

    async def dequeue_many(self, worker_ids, *, request_id=None):
        self.claim_requests += 1
        return await super().dequeue_many(worker_ids, request_id=request_id)


async def test_idle_async_workers_claim_in_one_request() -> None:
    store = _CountingStore()
    ids = await _enqueue(store, 4)
    started: list[str] = []
    all_started = asyncio.Event()
    requests_when_all_started: list[int] = []

    @agl.rollout
    async def gather(task):
        started.append(task["id"])
        if len(started) == 4:
            requests_when_all_started.append(store.claim_requests)
            all_started.set()
        await all_started.wait()  # the four run at once: one per worker slot
        return task["value"]

    await agl.Runner(gather, store, n_workers=4, stop_when_idle=True, poll_interval=0.01).arun()
    assert requests_when_all_started == [1]  # four idle workers, one claim request
    claims = [(await store.query_attempts(rid))[0] for rid in ids]
    assert len({a.worker_id for a in claims}) == 4  # each rollout ran in its own slot
    assert [r.status for r in await store.query_rollouts(rollout_ids=ids)] == ["succeeded"] * 4
    await store.close()


class _BeatCountingStore(MemoryStore):
    """A memory store that sets an event once one heartbeat request covered every one of ``n`` attempts."""

    def __init__(self, n: int) -> None:
        super().__init__(retry_policy=agl.RetryPolicy(max_attempts=1))
        self.n = n
        self.all_beaten_at_once = asyncio.Event()

    async def heartbeat_many(self, attempts):
        if len(attempts) == self.n:
            self.all_beaten_at_once.set()
        return await super().heartbeat_many(attempts)


async def test_running_attempts_of_a_runner_beat_in_one_request() -> None:
    store = _BeatCountingStore(3)
    ids = await _enqueue(store, 3)

    @agl.rollout
    async def wait_for_one_beat(task):
        await store.all_beaten_at_once.wait()  # ends only once one request beat all three attempts
        return task["value"]

    runner = agl.Runner(wait_for_one_beat, store, n_workers=3, stop_when_idle=True, heartbeat_interval=0.05)
    await asyncio.wait_for(runner.arun(), timeout=120)  # a guard against a hang, not a timing assertion
    assert [r.status for r in await store.query_rollouts(rollout_ids=ids)] == ["succeeded"] * 3
    await store.close()


def test_idle_runner_claims_less_often_up_to_a_tenth_of_a_second() -> None:
    from agentlightning.runner._workers import idle_wait

    # the quickstart's local runners poll every 20 ms while rollouts come; an empty queue is asked less often
    assert [round(idle_wait(0.02, n), 3) for n in range(5)] == [0.02, 0.04, 0.08, 0.1, 0.1]
    assert idle_wait(0.02, 10_000) == 0.1
    assert [idle_wait(0.2, n) for n in range(3)] == [0.2, 0.2, 0.2]  # the default interval is never lengthened
