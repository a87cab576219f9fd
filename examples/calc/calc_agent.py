"""The calculator agent: an ordinary LangGraph tool-calling graph, unaware of training.

The only Agent Lightning lines are the ``@agl.rollout`` decorator (so the runner can call it with a task and
the current resources) and ``agl.llm_base_url()`` (the LLM proxy's URL for the runner slot the agent runs in; in a
deployed app it would be configuration). Tracing comes from ``agentlightning_langchain.instrument()``, called once
by the trainer script — the graph itself carries no callback. The slot's URL stays the same from one rollout to the
next, so ``ChatOpenAI``, built per rollout as here, reuses the HTTP clients it caches per URL: no shared client of
our own is needed (``benchmarks/slot_url_bench.py`` measures it). The graph is compiled once, at import; each run
hands it that rollout's chat model in its config.
"""

from __future__ import annotations

from typing import Any

from calc_rules import MAX_LLM_CALLS, evaluate, prompt_messages, score_text
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, convert_to_messages
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agentlightning as agl

__all__ = [
    "GRAPH",
    "MAX_LLM_CALLS",
    "TWO_AGENTS",
    "build_graph",
    "calc_agent",
    "calc_two_agents",
    "calculator",
    "evaluate",
    "next_step",
    "score",
    "score_text",
    "this_episode_calls",
]


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression made of integers, + - * and parentheses."""
    return evaluate(expression)


def build_graph(answerer: str | None = None) -> Any:
    """Solver node (the LLM, with the calculator bound) <-> tool node, at most ``MAX_LLM_CALLS`` LLM calls.

    Compiled once: the chat model comes in each run's config (``configurable["llm"]``), the ordinary LangGraph way
    to vary a node's model without rebuilding the graph. ``answerer``: the same episode split between two agents, the
    ``caller`` (the first call: a calculator call or a direct answer) and a node of that name (the call after the
    tool's result): the same prompts, tools and call budget, only the nodes' names differ, so an
    `agentlightning.PolicyMap` can give each agent its own policy (``calc_two_agents``).
    """

    async def solver(state: MessagesState, config: RunnableConfig) -> dict[str, list[Any]]:
        llm: ChatOpenAI = config.get("configurable", {})["llm"]
        return {"messages": [await llm.bind_tools([calculator]).ainvoke(state["messages"], config)]}

    def route(state: MessagesState) -> str:
        return next_step(state["messages"])

    first = "solver" if answerer is None else "caller"
    graph = StateGraph(MessagesState)
    graph.add_node(first, solver)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, first)
    graph.add_conditional_edges(first, route, {"tools": "tools", END: END})
    if answerer is None:
        graph.add_edge("tools", first)
    else:
        graph.add_node(answerer, solver)
        graph.add_edge("tools", answerer)
        graph.add_conditional_edges(answerer, route, {"tools": "tools", END: END})
    return graph.compile()


def this_episode_calls(messages: list[BaseMessage]) -> list[AIMessage]:
    """The assistant messages after the question (the last user message): this episode's LLM calls."""
    last_question = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
    return [m for m in messages[last_question + 1 :] if isinstance(m, AIMessage)]


def next_step(messages: list[BaseMessage]) -> str:
    """After the solver: ``"tools"`` when its last message calls the calculator within the call budget, else END.

    Only this episode's calls count: a prompt's worked examples (`prompt_messages`) hold assistant messages too.
    """
    if len(this_episode_calls(messages)) >= MAX_LLM_CALLS:
        return END
    return tools_condition(messages)


GRAPH = build_graph()
TWO_AGENTS = build_graph(answerer="answerer")
"""The two-agent graph: ``caller`` writes the calculator call (or answers at once), ``answerer`` reads the tool's
result and answers."""
PROMPT: list[BaseMessage] = convert_to_messages(prompt_messages())
"""Messages before the question (a system prompt, a worked example) for a model that needs them (`prompt_messages`)."""


def score(final: AIMessage | Any, expected: int) -> float:
    """The reward of the graph's last message (-0.1 when it still asks for the tool after the call budget)."""
    if isinstance(final, AIMessage) and final.tool_calls:
        return -0.1  # still wanted the tool when the call budget ran out
    text = final.content if isinstance(final, AIMessage) and isinstance(final.content, str) else ""
    return score_text(text, expected)


@agl.rollout
async def calc_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """Answer ``task["question"]`` (e.g. ``Q:37*48+12=``); reward by ``task["answer"]``."""
    return await _solve(GRAPH, task, resources)


@agl.rollout
async def calc_two_agents(task: dict[str, Any], resources: agl.Resources) -> float:
    """`calc_agent` with the episode split between two agents, ``caller`` and ``answerer`` (`TWO_AGENTS`)."""
    return await _solve(TWO_AGENTS, task, resources)


async def _solve(graph: Any, task: dict[str, Any], resources: agl.Resources) -> float:
    llm_resource = resources.llm
    assert llm_resource is not None, "the trainer publishes an LLM resource"
    llm = ChatOpenAI(
        model=llm_resource.model,
        base_url=agl.llm_base_url(),
        api_key="none",  # any key works: the slot URL from agl.llm_base_url() is all the proxy needs
        max_retries=2,
        **llm_resource.sampling_parameters,
    )
    messages = [*PROMPT, HumanMessage(task["question"])]
    result = await graph.ainvoke({"messages": messages}, {"configurable": {"llm": llm}})
    return score(result["messages"][-1], int(task["answer"]))
