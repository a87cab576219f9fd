"""Runner slots on the LLM proxy over real loopback HTTP: a stable URL per slot, routed to the attempt it runs now.

Who may register slots and what happens to calls after an attempt's end: ``test_proxy_slot_security.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from agentlightning import Attempt, Claim, LLMResource, Resources, Rollout
from agentlightning.proxy import LLMProxy, parse_slot_prefix, slot_base_url
from agentlightning.runner import SlotRegistrar
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, start_attempts

TOKEN = "agents-token-0123456789"
RUNNER_TOKEN = "runner-token-0123456789"


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
async def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def proxy(store: MemoryStore, backend: ScriptedModelServer) -> AsyncIterator[LLMProxy]:
    async with LLMProxy(store, [backend.url], token=TOKEN, runner_token=RUNNER_TOKEN) as running:
        yield running


async def _slot(
    proxy: LLMProxy, method: str, key: str, body: object, token: str | None = RUNNER_TOKEN
) -> aiohttp.ClientResponse:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"{proxy.url}/slot/{key}", json=body, headers=headers) as resp,
    ):
        await resp.read()
        return resp


def _claim(rollout_id: str, attempt_id: str) -> Claim:
    return Claim(
        rollout=Rollout(rollout_id=rollout_id, input=None),
        attempt=Attempt(rollout_id=rollout_id, attempt_id=attempt_id, sequence=1),
    )


def test_slot_urls_are_built_and_parsed_in_one_place() -> None:
    assert slot_base_url("http://h:1/", "r.0.0") == "http://h:1/slot/r.0.0/v1"
    assert parse_slot_prefix("/slot/r.0.0") == "r.0.0"
    assert parse_slot_prefix("/slot/r%2F0") is None and parse_slot_prefix("/slot/") is None
    with pytest.raises(ValueError, match="slot key"):
        slot_base_url("http://h:1", "bad/key")


async def test_calls_on_a_slot_go_to_the_attempt_registered_on_it(proxy: LLMProxy, store: MemoryStore) -> None:
    attempts = await start_attempts(store, ["ro-a", "ro-b"])
    client = AsyncOpenAI(base_url=proxy.slot_url("run1.0.0"), api_key=TOKEN, max_retries=0)
    for rollout_id in ("ro-a", "ro-b"):  # the same URL (and client) for two rollouts in turn
        assert (
            await _slot(proxy, "PUT", "run1.0.0", {"rollout_id": rollout_id, "attempt_id": attempts[rollout_id]})
        ).status == 200
        await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": rollout_id}])
    for rollout_id in ("ro-a", "ro-b"):
        [call] = await store.query_llm_calls(rollout_id)
        assert call.attempt_id == attempts[rollout_id] and call.request["messages"][0]["content"] == rollout_id
        assert call.prompt_token_ids and call.response_token_ids


async def test_a_slot_with_no_attempt_is_refused_and_nothing_is_recorded(proxy: LLMProxy, store: MemoryStore) -> None:
    attempts = await start_attempts(store, ["ro-a"])
    client = AsyncOpenAI(base_url=proxy.slot_url("run1.0.0"), api_key=TOKEN, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="slot") as never:
        await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}])
    assert never.value.body["type"] == "slot_not_registered"  # type: ignore[index]
    occupant = {"rollout_id": "ro-a", "attempt_id": attempts["ro-a"]}
    await _slot(proxy, "PUT", "run1.0.0", occupant)
    # clearing with another occupant's ids leaves the slot alone (a late clear never removes a newer registration)
    other = await _slot(proxy, "DELETE", "run1.0.0", {"rollout_id": "ro-z", "attempt_id": "at-z"})
    assert other.status == 200 and len(proxy.slots) == 1
    assert (await _slot(proxy, "DELETE", "run1.0.0", occupant)).status == 200 and len(proxy.slots) == 0
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}])
    assert await store.query_llm_calls("ro-a") == []


async def test_slot_routes_need_the_runner_token_and_valid_ids(proxy: LLMProxy) -> None:
    for token in (None, "wrong-token-0123456", TOKEN):  # the agents' token included
        assert (await _slot(proxy, "PUT", "k.0.0", {"rollout_id": "r", "attempt_id": "a"}, token=token)).status == 401
    assert (await _slot(proxy, "PUT", "k.0.0", {"rollout_id": "r"})).status == 400
    assert (await _slot(proxy, "PUT", "k.0.0", ["r", "a"])).status == 400
    assert len(proxy.slots) == 0


async def test_registrar_falls_back_when_the_endpoint_knows_no_slots(backend: ScriptedModelServer) -> None:
    registrar = SlotRegistrar()
    no_token = Resources(resources_id="n", items={"llm": LLMResource(endpoint=backend.url, model="toy")})
    llm = LLMResource(endpoint=backend.url, model="toy", runner_token=RUNNER_TOKEN)
    resources = Resources(resources_id="r", items={"llm": llm})
    try:
        assert await registrar.acquire(0, _claim("ro-a", "at-a"), no_token) is None  # no runner token: not asked
        assert await registrar.acquire(0, _claim("ro-a", "at-a"), resources) is None  # 404: a plain model server
        assert await registrar.acquire(1, _claim("ro-b", "at-b"), resources) is None
        await registrar.release(1, clean=True)  # no end report either
        assert backend.requests == []  # never sent there
        unreachable = Resources(
            resources_id="u",
            items={"llm": LLMResource(endpoint="http://127.0.0.1:9", model="t", runner_token=RUNNER_TOKEN)},
        )
        assert await registrar.acquire(0, _claim("ro-a", "at-a"), unreachable) is None
        assert await registrar.acquire(0, _claim("ro-a", "at-a"), None) is None
    finally:
        await registrar.close()


async def test_unclean_end_moves_the_slot_on_and_a_restarted_proxy_learns_it_back(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    attempts = await start_attempts(store, ["ro-a", "ro-b"])
    first = await LLMProxy(store, [backend.url], token=TOKEN).start()
    port = first.bound_port
    resources = Resources(resources_id="r", items={"llm": first.llm_resource("t")})
    registrar = SlotRegistrar()
    try:
        url_a = await registrar.acquire(0, _claim("ro-a", attempts["ro-a"]), resources)
        assert url_a is not None and url_a.startswith(f"{first.url}/slot/")
        await registrar.release(0, clean=False)  # e.g. the agent timed out: parts of it may still run
        url_b = await registrar.acquire(0, _claim("ro-b", attempts["ro-b"]), resources)
        assert url_b is not None and url_b != url_a
        stale = AsyncOpenAI(base_url=url_a, api_key=TOKEN, max_retries=0)
        with pytest.raises(openai.ConflictError):  # the old key still names ro-a's attempt, which ended
            await stale.chat.completions.create(model="toy", messages=[{"role": "user", "content": "late"}])
        # a clean end keeps the URL for the next occupant
        await registrar.release(0, clean=True)
        assert await registrar.acquire(0, _claim("ro-b", attempts["ro-b"]), resources) == url_b
        # the proxy restarts and forgets its slots; the runner's next heartbeat registers the slot again
        await first.stop()
        second = await LLMProxy(store, [backend.url], token=TOKEN, runner_token=first.runner_token, port=port).start()
        try:
            agent = AsyncOpenAI(base_url=url_b, api_key=TOKEN, max_retries=0)
            with pytest.raises(openai.NotFoundError):
                await agent.chat.completions.create(model="toy", messages=[{"role": "user", "content": "b"}])
            await registrar.refresh(0)
            await agent.chat.completions.create(model="toy", messages=[{"role": "user", "content": "b"}])
            [call] = await store.query_llm_calls("ro-b")
            assert call.attempt_id == attempts["ro-b"]
            assert await store.query_llm_calls("ro-a") == []
        finally:
            await registrar.close()
            slot_b = second.slots.occupant(registrar.key(0))
            assert slot_b is not None and slot_b.ended  # closing reports the end of what the runner held
            await second.stop()
    finally:
        await first.stop()


async def test_a_proxy_without_agents_token_still_needs_the_runner_token_for_slots(
    store: MemoryStore, backend: ScriptedModelServer
) -> None:
    attempts = await start_attempts(store, ["ro-a"])
    async with LLMProxy(store, [backend.url]) as proxy, aiohttp.ClientSession() as session:
        body = json.dumps({"rollout_id": "ro-a", "attempt_id": attempts["ro-a"]})
        headers = {"Content-Type": "application/json"}
        async with session.put(f"{proxy.url}/slot/k.0.0", data=body, headers=headers) as resp:
            assert resp.status == 401  # the runner token is drawn at random when none is given
        headers["Authorization"] = f"Bearer {proxy.runner_token}"
        async with session.put(f"{proxy.url}/slot/k.0.0", data=body, headers=headers) as resp:
            assert resp.status == 200
        assert proxy.slots.resolve("k.0.0") == ("ro-a", attempts["ro-a"])
        assert proxy.llm_resource("toy").runner_token == proxy.runner_token and proxy.llm_resource("t").api_key is None


def _record_paths(registrar: SlotRegistrar) -> list[str]:
    """The paths of the registrar's slot requests, in order (the requests still go out)."""
    paths: list[str] = []
    send = registrar._send  # pyright: ignore[reportPrivateUsage]

    async def recording(method: str, held: Any, path: str, body: dict[str, Any]) -> tuple[int, str] | None:
        paths.append(f"{method} {path}")
        return await send(method, held, path, body)

    registrar._send = recording  # pyright: ignore[reportPrivateUsage]
    return paths


async def test_slots_that_start_together_register_in_one_request(proxy: LLMProxy, store: MemoryStore) -> None:
    rollout_ids = [f"ro-{i}" for i in range(8)]
    attempts = await start_attempts(store, rollout_ids)
    resources = Resources(resources_id="r", items={"llm": proxy.llm_resource("t")})
    registrar = SlotRegistrar()
    paths = _record_paths(registrar)
    try:
        urls = await asyncio.gather(
            *(registrar.acquire(i, _claim(r, attempts[r]), resources) for i, r in enumerate(rollout_ids))
        )
        assert paths == ["PUT /slots"]  # one request for the eight slots that started together
        assert len(set(urls)) == 8
        for url, rollout_id in zip(urls, rollout_ids, strict=True):
            assert url is not None
            agent = AsyncOpenAI(base_url=url, api_key=TOKEN, max_retries=0)
            await agent.chat.completions.create(model="toy", messages=[{"role": "user", "content": rollout_id}])
            [call] = await store.query_llm_calls(rollout_id)
            assert call.attempt_id == attempts[rollout_id] and call.request["messages"][0]["content"] == rollout_id
        # an end report goes on the batch route; a registration made alone goes alone, on the single-slot route
        await registrar.release(0, clean=True)
        assert await registrar.acquire(0, _claim("ro-0", attempts["ro-0"]), resources) == urls[0]
        assert paths[1:] == ["PUT /slots", f"PUT /slot/{registrar.key(0)}"]
    finally:
        await registrar.close()
    assert paths[3:] == ["PUT /slots"]  # the eight ends at close went in one request
    assert all(slot is not None and slot.ended for slot in map(proxy.slots.occupant, proxy.slots))


async def test_a_renewal_sent_with_the_attempts_end_never_revives_it(proxy: LLMProxy, store: MemoryStore) -> None:
    attempts = await start_attempts(store, ["ro-a", "ro-b", "ro-c"])
    resources = Resources(resources_id="r", items={"llm": proxy.llm_resource("t")})
    registrar = SlotRegistrar()
    paths = _record_paths(registrar)
    try:
        url_a = await registrar.acquire(0, _claim("ro-a", attempts["ro-a"]), resources)
        assert url_a is not None
        # slot 0's heartbeat re-registers ro-a just as ro-a ends, while slot 1 starts ro-c: the renewal, the end
        # report and the registration share one request, and ro-a stays ended
        _, _, url_c = await asyncio.gather(
            registrar.refresh(0),
            registrar.release(0, clean=True),
            registrar.acquire(1, _claim("ro-c", attempts["ro-c"]), resources),
        )
        assert url_c is not None
        assert paths == [f"PUT /slot/{registrar.key(0)}", "PUT /slots"]
        agent = AsyncOpenAI(base_url=url_a, api_key=TOKEN, max_retries=0)
        with pytest.raises(openai.ConflictError):
            await agent.chat.completions.create(model="toy", messages=[{"role": "user", "content": "late"}])
        assert proxy.slots.resolve(registrar.key(1)) == ("ro-c", attempts["ro-c"])
        # the slot's next rollout takes it over
        assert await registrar.acquire(0, _claim("ro-b", attempts["ro-b"]), resources) == url_a
        await agent.chat.completions.create(model="toy", messages=[{"role": "user", "content": "b"}])
        assert [c.attempt_id for c in await store.query_llm_calls("ro-b")] == [attempts["ro-b"]]
        assert await store.query_llm_calls("ro-a") == []
    finally:
        await registrar.close()


async def test_many_slot_registrations_are_all_or_nothing(proxy: LLMProxy) -> None:
    async def put(body: object, token: str | None = RUNNER_TOKEN) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as session,
            session.put(f"{proxy.url}/slots", json=body, headers=headers) as resp,
        ):
            return resp.status, await resp.json()

    good = {"rollout_id": "r", "attempt_id": "a"}
    assert (await put({"slots": {"k.0.0": good}}, token=None))[0] == 401
    status, answer = await put({"slots": {"k.0.0": good, "bad/key": good}})
    assert status == 400 and "bad/key" in answer["error"]["message"]
    status, answer = await put({"slots": {"k.0.0": good, "k.1.0": {"rollout_id": "r"}}})
    assert status == 400 and "k.1.0" in answer["error"]["message"]
    assert (await put({"slot": {"k.0.0": good}}))[0] == 400
    assert (await put(["k.0.0"]))[0] == 400
    assert len(proxy.slots) == 0  # nothing registered by a refused request
    assert (await put({"ended": [{"rollout_id": "r", "attempt_id": "a", "slot": "bad/key"}]}))[0] == 400
    assert (await put({"slots": {}, "ended": [{"rollout_id": "r"}]}))[0] == 400
    assert len(proxy.slots) == 0 and not proxy.slots.has_ended("r", "a")
    assert await put({"slots": {"k.0.0": good, "k.1.0": {"rollout_id": "r2", "attempt_id": "a2"}}}) == (
        200,
        {"registered": 2, "ended": 0},
    )
    assert proxy.slots.resolve("k.0.0") == ("r", "a") and proxy.slots.resolve("k.1.0") == ("r2", "a2")


async def test_a_proxy_without_the_many_slots_route_gets_registrations_one_by_one() -> None:
    registered: dict[str, Any] = {}
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        if request.method == "PUT" and request.path.startswith("/slot/"):
            registered[request.match_info["key"]] = await request.json()
            return web.json_response({"slot": request.match_info["key"]})
        return web.json_response({"error": "no route"}, status=404)

    app = web.Application()
    app.router.add_route("PUT", "/slot/{key}", handle)
    app.router.add_route("PUT", "/slots", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    llm = LLMResource(endpoint=f"http://127.0.0.1:{port}", model="t", runner_token=RUNNER_TOKEN)
    resources = Resources(resources_id="r", items={"llm": llm})
    registrar = SlotRegistrar()
    try:
        urls = await asyncio.gather(*(registrar.acquire(i, _claim(f"ro-{i}", f"at-{i}"), resources) for i in range(3)))
        assert all(url is not None for url in urls)
        assert seen[0] == "PUT /slots" and sorted(seen[1:]) == sorted(f"PUT /slot/{registrar.key(i)}" for i in range(3))
        assert registered == {registrar.key(i): {"rollout_id": f"ro-{i}", "attempt_id": f"at-{i}"} for i in range(3)}
        seen.clear()
        await asyncio.gather(*(registrar.acquire(i, _claim(f"ro-{i}", f"at-{i}"), resources) for i in range(3, 5)))
        assert sorted(seen) == sorted(f"PUT /slot/{registrar.key(i)}" for i in range(3, 5))  # not asked again
    finally:
        await registrar.close()
        await runner.cleanup()
