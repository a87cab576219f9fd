"""Who may change runner slots, and calls after an attempt's end: over real loopback HTTP, with a real Runner.

Agents hold the agents' token (`LLMResource.api_key`); slot registration needs the runner token, which the runner
reads from `LLMResource.runner_token` and never hands to the agent. Slot keys are random (one slot's URL tells
nothing about another's), and a registered slot's key is its agent's credential: the slot's URL alone admits the
agent's LLM calls, whatever ``api_key`` it passes; the per-rollout URLs still need the agents' token. A call for an
attempt whose runner reported its end is refused (409) and counted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

import agentlightning as agl
from agentlightning import Attempt, Claim, Resources, Rollout
from agentlightning.proxy import LLMProxy
from agentlightning.proxy._slots import SlotTable
from agentlightning.runner import SlotRegistrar
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, start_attempts

TOKEN = "agents-token-0123456789"
ADMIN = "admin-token-0123456789ab"
MESSAGES: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
async def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def proxy(store: MemoryStore, backend: ScriptedModelServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(store, [backend.url], token=TOKEN, admin_token=ADMIN) as running:
        yield running


async def _request(proxy: LLMProxy, method: str, path: str, body: object, token: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    data = None if body is None else json.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"{proxy.url}{path}", data=data, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def _claim(rollout_id: str, attempt_id: str) -> Claim:
    return Claim(
        rollout=Rollout(rollout_id=rollout_id, input=None),
        attempt=Attempt(rollout_id=rollout_id, attempt_id=attempt_id, sequence=1),
    )


def _resources(proxy: LLMProxy) -> Resources:
    return Resources(resources_id="r", items={"llm": proxy.llm_resource("toy")})


async def test_the_agents_token_cannot_take_over_or_clear_another_runners_slot(
    proxy: LLMProxy, store: MemoryStore
) -> None:
    attempts = await start_attempts(store, ["victim", "thief"])
    registrar = SlotRegistrar()
    try:
        url = await registrar.acquire(0, _claim("victim", attempts["victim"]), _resources(proxy))
        key = registrar.key(0)
        assert url == proxy.slot_url(key)
        thief = {"rollout_id": "thief", "attempt_id": attempts["thief"]}
        # what every agent holds (the published api_key) opens no slot route, even with the victim's key in hand
        for method, path, body in (
            ("PUT", f"/slot/{key}", thief),
            ("DELETE", f"/slot/{key}", None),
            ("PUT", "/slots", {"slots": {key: thief}}),
            ("PUT", "/slots", {"ended": [{"rollout_id": "victim", "attempt_id": attempts["victim"], "slot": key}]}),
        ):
            status, answer = await _request(proxy, method, path, body, TOKEN)
            assert status == 401 and "runner token" in answer["error"]["message"], (method, path)
        assert proxy.slots.resolve(key) == ("victim", attempts["victim"])
        agent = AsyncOpenAI(base_url=url, api_key=TOKEN, max_retries=0)
        await agent.chat.completions.create(model="toy", messages=MESSAGES)
        [call] = await store.query_llm_calls("victim")
        assert call.attempt_id == attempts["victim"]
        assert await store.query_llm_calls("thief") == []
        # nor does the admin token: it is the operator's, not the runners'
        assert (await _request(proxy, "PUT", f"/slot/{key}", thief, ADMIN))[0] == 401
    finally:
        await registrar.close()


async def _call(proxy: LLMProxy, path: str, authorization: str | None) -> tuple[int, Any]:
    """A chat completion on ``path`` with this ``Authorization`` header (``None``: none at all)."""
    headers = {"Content-Type": "application/json", **({"Authorization": authorization} if authorization else {})}
    body = json.dumps({"model": "toy", "messages": MESSAGES})
    async with aiohttp.ClientSession() as session, session.post(f"{proxy.url}{path}", data=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def test_a_registered_slots_url_alone_admits_its_agents_calls_and_opens_nothing_else(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    attempts = await start_attempts(store, ["ro-a", "ro-b", "ro-c", "thief"])
    registrar = SlotRegistrar()
    try:
        url = await registrar.acquire(0, _claim("ro-a", attempts["ro-a"]), _resources(proxy))
        assert url is not None
        key = registrar.key(0)
        # an agent written as its framework's docs write it: a literal key (or none at all), the slot's URL
        agent = AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
        await agent.chat.completions.create(model="toy", messages=MESSAGES)
        await agent.completions.create(model="toy", prompt="p")
        assert [m.id for m in (await agent.models.list()).data]
        assert (await _call(proxy, f"/slot/{key}/v1/chat/completions", None))[0] == 200
        calls = await store.query_llm_calls("ro-a")
        assert len(calls) == 3 and {c.attempt_id for c in calls} == {attempts["ro-a"]}
        assert "none" not in str(backend.authorizations)  # the agent's literal key is not handed on either
        served = len(backend.requests)
        # the per-rollout URLs and the plain routes still need the agents' token: their ids are no secret
        for base_url in (proxy.base_url("ro-a", attempts["ro-a"]), proxy.base_url("ro-b", attempts["ro-b"])):
            with pytest.raises(openai.AuthenticationError, match="Bearer <token>"):
                await AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0).chat.completions.create(
                    model="toy", messages=MESSAGES
                )
        assert (await _request(proxy, "GET", "/v1/models", None, "none"))[0] == 401
        # a slot's key does not open the slot routes: moving or clearing a slot still needs the runner token
        thief = {"rollout_id": "thief", "attempt_id": attempts["thief"]}
        for method, path, body in (("PUT", f"/slot/{key}", thief), ("DELETE", f"/slot/{key}", None),
                                   ("PUT", "/slots", {"slots": {key: thief}})):  # fmt: skip
            assert (await _request(proxy, method, path, body, key))[0] == 401, (method, path)
        # a key the proxy does not hold admits nothing, and says why
        status, answer = await _call(proxy, f"/slot/{'x' * 24}/v1/chat/completions", "Bearer none")
        assert status == 401 and "not registered" in answer["error"]["message"]
        # a short key (one a runner would never draw) is no credential, even registered
        ids = {"rollout_id": "ro-c", "attempt_id": attempts["ro-c"]}
        assert (await _request(proxy, "PUT", "/slot/k.0.0", ids, proxy.runner_token))[0] == 200
        assert (await _call(proxy, "/slot/k.0.0/v1/chat/completions", "Bearer none"))[0] == 401
        assert (await _call(proxy, "/slot/k.0.0/v1/chat/completions", f"Bearer {TOKEN}"))[0] == 200
        assert len(backend.requests) == served + 1  # only the call with the agents' token was forwarded
        # the attempt ended: its slot's URL gets its late calls refused as such (409), never recorded
        await store.finish_attempt("ro-a", attempts["ro-a"], "succeeded")
        await registrar.release(0, clean=False)  # an unclean end: the slot moves to a new key
        with pytest.raises(openai.ConflictError, match="already ended"):
            await agent.chat.completions.create(model="toy", messages=MESSAGES)
        assert len(await store.query_llm_calls("ro-a")) == 3
        assert await registrar.acquire(0, _claim("ro-b", attempts["ro-b"]), _resources(proxy)) != url
        with pytest.raises(openai.ConflictError):  # the old URL never reaches the slot's next rollout
            await agent.chat.completions.create(model="toy", messages=MESSAGES)
        assert await store.query_llm_calls("ro-b") == []
        assert (await _request(proxy, "DELETE", f"/slot/{key}", None, proxy.runner_token))[0] == 200
        status, answer = await _call(proxy, f"/slot/{key}/v1/chat/completions", "Bearer none")
        assert status == 401 and "not registered" in answer["error"]["message"]  # a cleared key admits nothing
    finally:
        await registrar.close()


def test_slot_keys_are_random_so_one_slot_url_tells_nothing_about_another() -> None:
    registrar = SlotRegistrar()
    keys = [registrar.key(i) for i in range(200)] + [SlotRegistrar().key(0) for _ in range(50)]
    assert all(len(key) >= 22 for key in keys)  # 128 random bits or more
    # no shared prefix of 8 characters between any two keys: nothing derivable (a chance collision is ~1e-10)
    assert len({key[:8] for key in keys}) == len(keys)
    assert registrar.key(3) == registrar.key(3)  # stable while the slot keeps it


async def test_a_flood_of_registrations_never_evicts_live_slots(proxy: LLMProxy, store: MemoryStore) -> None:
    attempts = await start_attempts(store, ["live"])
    runner = proxy.runner_token
    live = {"rollout_id": "live", "attempt_id": attempts["live"]}
    assert (await _request(proxy, "PUT", "/slot/live-slot-key-0123456789", live, runner))[0] == 200
    # the flood of the report: 100,001 entries in one request (4.8 MB) is refused whole, with a one-line reason
    flood = {"slots": {f"k{i:06d}": {"rollout_id": "x", "attempt_id": "y"} for i in range(100_001)}}
    status, answer = await _request(proxy, "PUT", "/slots", flood, runner)
    assert status == 413 and "at most" in answer["error"]["message"]
    assert len(proxy.slots) == 1 and proxy.slots.resolve("live-slot-key-0123456789") == ("live", attempts["live"])


async def test_a_full_slot_table_refuses_new_keys_and_drops_only_stale_ones(
    proxy: LLMProxy, store: MemoryStore
) -> None:
    clock = [1000.0]
    proxy.slots = SlotTable(max_slots=4, stale_after_s=60.0, clock=lambda: clock[0])
    runner = proxy.runner_token
    ids = {"rollout_id": "r", "attempt_id": "a"}
    for i in range(4):
        assert (await _request(proxy, "PUT", f"/slot/live-{i}", ids, runner))[0] == 200
    status, answer = await _request(proxy, "PUT", "/slots", {"slots": {"new-0": ids, "new-1": ids}}, runner)
    assert status == 503 and answer["error"]["type"] == "slot_table_full"
    assert (await _request(proxy, "PUT", "/slot/new-0", ids, runner))[0] == 503
    assert sorted(proxy.slots) == [f"live-{i}" for i in range(4)]  # nothing live was evicted
    # a re-registration (the runner's heartbeat) keeps a slot live; two are not renewed for over a minute
    clock[0] += 45.0
    for i in (2, 3):
        assert (await _request(proxy, "PUT", f"/slot/live-{i}", ids, runner))[0] == 200
    clock[0] += 30.0
    assert (await _request(proxy, "PUT", "/slots", {"slots": {"new-0": ids, "new-1": ids}}, runner))[0] == 200
    assert sorted(proxy.slots) == ["live-2", "live-3", "new-0", "new-1"]


async def test_calls_after_the_attempt_ended_are_refused_and_counted(
    proxy: LLMProxy, store: MemoryStore, backend: ScriptedModelServer
) -> None:
    attempts = await start_attempts(store, ["ro-a", "ro-b", "ro-c"])
    registrar = SlotRegistrar()
    try:
        url = await registrar.acquire(0, _claim("ro-a", attempts["ro-a"]), _resources(proxy))
        assert url is not None
        on_slot = AsyncOpenAI(base_url=url, api_key=TOKEN, max_retries=0)
        per_rollout = AsyncOpenAI(base_url=proxy.base_url("ro-a", attempts["ro-a"]), api_key=TOKEN, max_retries=0)
        await on_slot.chat.completions.create(model="toy", messages=MESSAGES)
        await per_rollout.completions.create(model="toy", prompt="p")
        await store.finish_attempt("ro-a", attempts["ro-a"], "succeeded")
        await registrar.release(0, clean=True)  # the agent returned: the runner tells the proxy the attempt ended
        served = len(backend.requests)
        for late in (
            on_slot.chat.completions.create(model="toy", messages=MESSAGES),
            on_slot.chat.completions.create(model="toy", messages=MESSAGES, stream=True),
            per_rollout.chat.completions.create(model="toy", messages=MESSAGES),
            per_rollout.completions.create(model="toy", prompt="p"),
        ):
            with pytest.raises(openai.ConflictError, match="already ended") as refused:
                await late
            assert refused.value.body["type"] == "attempt_finished"  # type: ignore[index]
        assert len(backend.requests) == served  # never forwarded
        assert len(await store.query_llm_calls("ro-a")) == 2  # the two calls made while it ran, nothing after
        assert proxy.late_calls == 4
        status, answer = await _request(proxy, "GET", "/admin/status", None, ADMIN)
        assert status == 200 and answer["late_calls"] == 4
        # the slot's next attempt is served on the same URL; an attempt ended without a slot is refused too
        assert await registrar.acquire(0, _claim("ro-b", attempts["ro-b"]), _resources(proxy)) == url
        await on_slot.chat.completions.create(model="toy", messages=MESSAGES)
        [call] = await store.query_llm_calls("ro-b")
        assert call.attempt_id == attempts["ro-b"]
        ended = {"ended": [{"rollout_id": "ro-c", "attempt_id": attempts["ro-c"]}]}
        assert (await _request(proxy, "PUT", "/slots", ended, proxy.runner_token))[0] == 200
        other = AsyncOpenAI(base_url=proxy.base_url("ro-c", attempts["ro-c"]), api_key=TOKEN, max_retries=0)
        with pytest.raises(openai.ConflictError):
            await other.chat.completions.create(model="toy", messages=MESSAGES)
        assert proxy.late_calls == 5
    finally:
        await registrar.close()


LEAKED: list[tuple[str, str]] = []


@agl.rollout
async def leaky_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """Answers once, then leaves its URLs behind (as a background task of a framework might keep them)."""
    assert resources.llm is not None
    assert resources.llm.runner_token is None  # the runner's credential is never handed to the agent
    context = agl.current_rollout()
    assert context is not None
    base_url = agl.llm_base_url()
    client = AsyncOpenAI(base_url=base_url, api_key=resources.llm.api_key, max_retries=0)
    await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": task["id"]}])
    LEAKED.append((base_url, resources.llm.base_url(context.rollout_id, context.attempt_id)))
    return 1.0


@pytest.mark.parametrize("worker_mode", ["async", "thread"])
async def test_under_a_runner_agents_get_no_runner_token_and_their_late_calls_are_refused(
    proxy: LLMProxy, store: MemoryStore, worker_mode: str
) -> None:
    LEAKED.clear()
    await store.add_resources(Resources(resources_id="r1", items={"llm": proxy.llm_resource("toy")}))
    rollouts = [await store.enqueue_rollout({"id": f"task-{i}"}) for i in range(4)]
    runner = agl.Runner(leaky_agent, store, n_workers=2, worker_mode=worker_mode, stop_when_idle=True)  # type: ignore[arg-type]
    await runner.arun()
    for rollout in rollouts:
        assert (await store.get_rollout(rollout.rollout_id)).status == "succeeded"
        assert len(await store.query_llm_calls(rollout.rollout_id)) == 1
    assert len(LEAKED) == 4 and all("/slot/" in slot_url for slot_url, _ in LEAKED)
    for slot_url, rollout_url in LEAKED:
        for base_url in (slot_url, rollout_url):
            late = AsyncOpenAI(base_url=base_url, api_key=TOKEN, max_retries=0)
            with pytest.raises(openai.ConflictError):
                await late.chat.completions.create(model="toy", messages=MESSAGES)
    assert proxy.late_calls == 8
    for rollout in rollouts:
        assert len(await store.query_llm_calls(rollout.rollout_id)) == 1  # nothing added after the end


class _WatchedTable(SlotTable):
    """The proxy's slot table, with an event set whenever an attempt's end is reported."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = asyncio.Event()

    def end(self, rollout_id: str, attempt_id: str, key: str | None = None) -> None:
        super().end(rollout_id, attempt_id, key)
        self.ended.set()


GATES: dict[str, asyncio.Event] = {}
LATE: list[BaseException] = []


@agl.rollout
async def cancelled_while_running(task: Any, resources: agl.Resources) -> float:
    """Calls once, waits while the trainer cancels its rollout, then calls again (late)."""
    assert resources.llm is not None
    client = AsyncOpenAI(base_url=agl.llm_base_url(), api_key=resources.llm.api_key, max_retries=0)
    await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "on time"}])
    GATES["called"].set()
    await GATES["go"].wait()
    try:
        await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "late"}])
    except openai.APIStatusError as exc:
        LATE.append(exc)
        raise
    return 1.0


async def test_a_rollout_the_trainer_cancels_gets_its_agents_further_calls_refused(
    proxy: LLMProxy, store: MemoryStore
) -> None:
    GATES.update({"called": asyncio.Event(), "go": asyncio.Event()})
    LATE.clear()
    watched = proxy.slots = _WatchedTable()
    await store.add_resources(Resources(resources_id="r1", items={"llm": proxy.llm_resource("toy")}))
    rollout = await store.enqueue_rollout({"id": "t"})
    runner = agl.Runner(
        cancelled_while_running, store, n_workers=1, worker_mode="async", stop_when_idle=True, heartbeat_interval=0.05
    )
    running = asyncio.create_task(runner.arun())
    try:
        await asyncio.wait_for(GATES["called"].wait(), 60)
        await store.cancel_rollout(rollout.rollout_id)  # the trainer gives up on it while its agent still runs
        await asyncio.wait_for(watched.ended.wait(), 60)  # the next heartbeat finds it over and tells the proxy
        GATES["go"].set()
        await asyncio.wait_for(running, 60)
    finally:
        GATES["go"].set()
        runner.stop()
    [late] = LATE
    assert isinstance(late, openai.ConflictError) and proxy.late_calls == 1
    calls = await store.query_llm_calls(rollout.rollout_id)
    assert [c.request["messages"][0]["content"] for c in calls] == ["on time"]
