"""Multi-agent LangGraph: only the selected agent's calls are trained, with LightningRL credit (GRPO)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from agentlightning.credit import build_training_batch
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, ScriptedReply
from agentlightning.tracing import aflush, emit_reward, rollout_context
from agentlightning.transitions import TransitionConfig, transitions_from_store
from agentlightning_langchain import LangChainAdapter


@tool
def lookup(city: str) -> str:
    """Look up a fact about a city."""
    return f"{city} has a river."


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(base_url: str) -> Any:
    """researcher (LLM + tool) -> writer (LLM) -> critic (LLM)."""
    llm = ChatOpenAI(base_url=base_url, api_key="t", model="toy")
    researcher_llm = llm.bind_tools([lookup])

    async def researcher(state: State) -> dict[str, Any]:
        return {"messages": [await researcher_llm.ainvoke(state["messages"])]}

    async def writer(state: State) -> dict[str, Any]:
        reply = await llm.ainvoke([SystemMessage("writer"), *state["messages"][-1:]])
        return {"messages": [AIMessage(content=reply.content, name="writer")]}

    async def critic(state: State) -> dict[str, Any]:
        reply = await llm.ainvoke([SystemMessage("critic"), HumanMessage(str(state["messages"][-1].content))])
        return {"messages": [AIMessage(content=reply.content, name="critic")]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "writer"

    g = StateGraph(State)
    for name, fn in (("researcher", researcher), ("writer", writer), ("critic", critic)):
        g.add_node(name, fn)
    g.add_node("tools", ToolNode([lookup]))
    g.add_edge(START, "researcher")
    g.add_conditional_edges("researcher", route, {"tools": "tools", "writer": "writer"})
    g.add_edge("tools", "researcher")
    g.add_edge("writer", "critic")
    g.add_edge("critic", END)
    return g.compile()


def script(body: dict[str, Any]) -> ScriptedReply:
    messages = body.get("messages") or []
    if messages and messages[0].get("role") == "system":
        return ScriptedReply(content=f"{messages[0]['content']} says ok")
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        return ScriptedReply(tool_calls=[{"name": "lookup", "arguments": {"city": "Paris"}}])
    return ScriptedReply(content="Paris has a river.")


async def test_only_selected_agent_is_trained() -> None:
    adapter = LangChainAdapter.default()
    with ScriptedModelServer(script) as server:
        store = MemoryStore()
        async with LLMProxy(store, [server.base_url]) as proxy:
            adapter.instrument()
            try:
                rollouts = [await store.enqueue_rollout(input="Paris?", group_id="g1") for _ in range(4)]
                for i in range(len(rollouts)):
                    claim = await store.dequeue_rollout("w")
                    assert claim is not None
                    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
                    with rollout_context(store, rid, aid):
                        await build_graph(proxy.base_url(rid, aid)).ainvoke({"messages": [HumanMessage("Paris?")]})
                        emit_reward(float(i % 2), final=True)
                    await aflush()  # the attempt's spans before its end: the store refuses them after
                    await store.finish_attempt(rid, aid, "succeeded")
                await proxy.flush()
            finally:
                adapter.uninstrument()
            ids = [r.rollout_id for r in rollouts]
            everything = await transitions_from_store(store, ids)
            writer_only = await transitions_from_store(store, ids, TransitionConfig(agent_filter="writer"))

    # every rollout: researcher x2 (tool call + answer), writer x1, critic x1
    assert sorted({t.agent_name or "" for t in everything}) == ["critic", "researcher", "writer"]
    assert len(everything) == 4 * 4
    assert len(writer_only) == 4 and {t.agent_name for t in writer_only} == {"writer"}
    assert len(server.served) == 4 * 4
    batch = build_training_batch(writer_only, credit="identical", estimator="grpo")
    assert len(batch.samples) == 4
    assert {s.agent_name for s in batch.samples} == {"writer"}
    assert {s.group_id for s in batch.samples} == {"g1"}
    # rewards 0,1,0,1 in one group: GRPO gives opposite advantages to winners and losers
    by_credit = {s.credit: s.advantage for s in batch.samples}
    assert by_credit[1.0] > 0 > by_credit[0.0]
    # the trained prompts are exactly what the writer node sent (its system message is in the prompt ids)
    tok = server.tokenizer
    prompts = [tok.decode(s.prompt_token_ids) for s in batch.samples]
    assert all("writer" in prompt and "critic" not in prompt for prompt in prompts)
