"""An ordinary LangGraph + ChatOpenAI agent under the runner reaches the LLM proxy through its worker slot's URL.

The agent builds its ``ChatOpenAI`` per rollout with ``base_url=agl.llm_base_url()`` and nothing else (no shared
HTTP client of its own), with the resource's ``api_key`` or a literal one as LangChain's docs write it
(``api_key="none"``): the slot's URL alone admits its calls. The slot URL stays the same from one rollout to the
next, so langchain-openai's client cache (one httpx client per base URL) keeps its connections; the proxy still
records every call under the attempt the slot runs at that moment, and a timed-out agent that keeps calling is
refused, not recorded under the next rollout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("langgraph")

import openai
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph

import agentlightning as agl
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer

TOKEN = "agents-token-0123456789"
SEEN: dict[str, str] = {}  # task id -> the base URL its agent was given
EVENTS: dict[str, asyncio.Event] = {}
STALE: dict[str, BaseException | None] = {}
LITERAL_KEY: dict[str, str | None] = {"api_key": None}  # set: the agent hard-codes this key instead of the resource's
KEYS = pytest.mark.parametrize("literal_key", [None, "none"], ids=["resource-key", "literal-key"])


def _llm(resources: agl.Resources) -> ChatOpenAI:
    llm = resources.llm
    assert llm is not None
    key = LITERAL_KEY["api_key"] or llm.api_key
    return ChatOpenAI(model=llm.model, base_url=agl.llm_base_url(), api_key=key, max_retries=0)  # type: ignore[arg-type]


def _graph(llm: ChatOpenAI) -> Any:
    """Two LLM turns in a row, so calls of concurrent rollouts interleave on the proxy."""

    async def first(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    async def second(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("first", first)
    graph.add_node("second", second)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    graph.add_edge("second", END)
    return graph.compile()


@agl.rollout
async def two_turn_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    SEEN[task["id"]] = agl.llm_base_url()
    result = await _graph(_llm(resources)).ainvoke({"messages": [HumanMessage(task["id"])]})
    return 1.0 if result["messages"][-1].content == task["id"] else 0.0


@agl.rollout
async def stale_then_next_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    SEEN[task["id"]] = agl.llm_base_url()
    llm = _llm(resources)
    if task["id"] == "stale":
        await llm.ainvoke([HumanMessage("stale-on-time")])

        async def keeps_calling() -> None:  # detached: survives the agent's cancellation at its timeout
            await EVENTS["next started"].wait()
            try:
                await llm.ainvoke([HumanMessage("stale-late")])
                STALE["error"] = None
            except BaseException as exc:
                STALE["error"] = exc
            EVENTS["stale called"].set()

        STALE["task"] = asyncio.ensure_future(keeps_calling())  # type: ignore[assignment]
        await asyncio.Event().wait()  # hangs until the rollout timeout cancels it
    EVENTS["next started"].set()
    await EVENTS["stale called"].wait()  # the old occupant calls while this rollout holds the slot
    await llm.ainvoke([HumanMessage("next")])
    return 1.0


class ConnectionCounter:
    """An ASGI wrapper remembering the client address (one per TCP connection) of every completion request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.connections: set[tuple[str, int]] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            self.connections.add(tuple(scope["client"]))
        await self.app(scope, receive, send)


@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
async def setup(
    backend: ScriptedModelServer, literal_key: str | None
) -> AsyncIterator[tuple[MemoryStore, LLMProxy, ConnectionCounter]]:
    SEEN.clear()
    LITERAL_KEY["api_key"] = literal_key
    store = MemoryStore(retry_policy=agl.RetryPolicy(max_attempts=1))
    proxy = LLMProxy(store, [backend.url], token=TOKEN)
    counter = ConnectionCounter(proxy.app)
    proxy.app = counter  # type: ignore[assignment]  # served as is by start()
    await proxy.start()
    llm = proxy.llm_resource("toy")  # with the runner token: runners register their slots
    await store.add_resources(agl.Resources(resources_id="r1", items={"llm": llm}))
    try:
        yield store, proxy, counter
    finally:
        LITERAL_KEY["api_key"] = None
        await proxy.stop()


@KEYS
async def test_32_concurrent_rollouts_over_4_slots_are_attributed_and_reuse_their_clients(
    setup: tuple[MemoryStore, LLMProxy, ConnectionCounter],
) -> None:
    store, proxy, counter = setup
    rollouts = [await store.enqueue_rollout({"id": f"task-{i}"}) for i in range(32)]
    runner = agl.Runner(two_turn_agent, store, n_workers=4, worker_mode="async", stop_when_idle=True)
    await runner.arun()
    for rollout in rollouts:
        assert (await store.get_rollout(rollout.rollout_id)).status == "succeeded"
        [attempt] = await store.query_attempts(rollout.rollout_id)
        calls = await store.query_llm_calls(rollout.rollout_id)
        assert len(calls) == 2 and {c.attempt_id for c in calls} == {attempt.attempt_id}
        # each call's prompt is this rollout's own task: no call was recorded under another rollout
        assert {c.request["messages"][0]["content"] for c in calls} == {rollout.input["id"]}
        assert all(c.prompt_token_ids and c.response_token_ids for c in calls)
    urls = set(SEEN.values())
    assert len(SEEN) == 32 and len(urls) == 4 and all("/slot/" in url for url in urls)
    # one kept-alive connection per slot's cached client, not a new client (and connection) per rollout
    assert 4 <= len(counter.connections) <= 8, counter.connections
    # each rollout's end was reported: the four slots now name ended attempts (a late call would get 409)
    slots = [proxy.slots.occupant(key) for key in proxy.slots]
    assert len(slots) == 4 and all(slot is not None and slot.ended for slot in slots)


@KEYS
async def test_a_timed_out_agent_calling_late_is_refused_not_recorded_under_the_next_rollout(
    setup: tuple[MemoryStore, LLMProxy, ConnectionCounter],
) -> None:
    store, _, _ = setup
    EVENTS.update({"next started": asyncio.Event(), "stale called": asyncio.Event()})
    stale = await store.enqueue_rollout({"id": "stale"})
    following = await store.enqueue_rollout({"id": "next"})
    runner = agl.Runner(
        stale_then_next_agent, store, n_workers=1, worker_mode="async", stop_when_idle=True, rollout_timeout=1.0
    )
    await runner.arun()
    assert (await store.get_rollout(stale.rollout_id)).status != "succeeded"
    assert (await store.get_rollout(following.rollout_id)).status == "succeeded"
    # refused as a call of the timed-out attempt (its end was reported), not sent to the slot's next rollout
    assert isinstance(STALE["error"], openai.ConflictError), STALE["error"]
    assert SEEN["stale"] != SEEN["next"]  # same worker slot, new key
    stale_calls = await store.query_llm_calls(stale.rollout_id)
    next_calls = await store.query_llm_calls(following.rollout_id)
    assert [c.request["messages"][0]["content"] for c in stale_calls] == ["stale-on-time"]
    assert [c.request["messages"][0]["content"] for c in next_calls] == ["next"]
