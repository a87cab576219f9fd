"""The text-to-SQL agents: an ordinary LangGraph graph of three LLM agents, unaware of training.

    writer ──> checker ──OK──> end
                 │ BAD (at most MAX_REWRITES times)
                 v
              rewriter ──> checker

The writer drafts a query from the schema and the question; the checker runs it against the real SQLite database
and asks the LLM whether the result answers the question (``OK`` / ``BAD``); on ``BAD`` the rewriter writes a
corrected query from the question, the query and its result. The reward is execution match of the final query
against the gold query. LangGraph node names are the agent names the trainer filters on: only ``writer`` and
``rewriter`` are trained, the ``checker`` runs on the same model untrained.

The only Agent Lightning lines are ``@agl.rollout`` and ``agl.llm_base_url()``; tracing comes from
``agentlightning_langchain.instrument()`` (``agl runner --instrument langchain``), called by the runner.
"""

from __future__ import annotations

import json
import os
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import openai
from langchain_core.messages import BaseMessage, HumanMessage, convert_to_messages
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import agentlightning as agl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sql_data import execute, execution_match, result_feedback, task_database

__all__ = [
    "AGENTS",
    "MAX_REWRITES",
    "PROMPT_ENV",
    "TRAINED_AGENTS",
    "SQLState",
    "build_graph",
    "checker_prompt",
    "extract_sql",
    "parse_verdict",
    "prompt_messages",
    "rewriter_prompt",
    "run_sql_agent",
    "score",
    "sql_agent",
    "writer_prompt",
]

MAX_REWRITES = 2
"""Most rewriter turns per question (the checker judges after each)."""

TRAINED_AGENTS = ("writer", "rewriter")
"""The agents whose LLM calls are trained (the trainer's ``agent_filter``); the checker is not."""

AGENTS = ("writer", "checker", "rewriter")
"""Every agent of the graph (LangGraph node names, which the LangChain adapter records as agent names)."""

PROMPT_ENV = "SQL_PROMPT_FILE"
"""The environment variable naming a JSON file of the messages that open each agent's call (`prompt_messages`)."""


def prompt_messages(path: str | Path | None = None) -> dict[str, list[BaseMessage]]:
    """The messages that open each agent's call before its own message: none by default (the toy model needs none).

    A model that was not made for this task gets them from a JSON file (``path``, else ``$SQL_PROMPT_FILE``): an
    object with a list of OpenAI chat messages per agent, e.g. a system prompt and worked examples for ``writer``,
    ``checker`` and ``rewriter`` (``prompts/smollm2.json``); an agent it leaves out gets none. ``train.py --model
    smollm2`` sets the variable for its runner processes.

    Raises:
        ValueError: The file is not such an object (one line naming the file).
    """
    path = path or os.environ.get(PROMPT_ENV)
    if not path:
        return {}
    data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not set(data) <= set(AGENTS):  # pyright: ignore[reportUnknownArgumentType]
        raise ValueError(f"prompt file {path} must hold a JSON object with keys among {list(AGENTS)}")
    prompts: dict[str, list[BaseMessage]] = {}
    for agent, messages in data.items():  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):  # pyright: ignore[reportUnknownVariableType]
            raise ValueError(f"prompt file {path}: {agent!r} must be a list of chat messages")
        prompts[str(agent)] = convert_to_messages(messages)  # pyright: ignore[reportUnknownArgumentType]
    return prompts


@cache
def _env_prompts() -> dict[str, list[BaseMessage]]:
    """`prompt_messages` of ``$SQL_PROMPT_FILE``, read once per process."""
    return prompt_messages()


def writer_prompt(schema: str, question: str) -> str:
    """The writer's message: the compact schema and the question."""
    return f"Schema: {schema}\nQuestion: {question}\nWrite one SQLite query."


def checker_prompt(question: str, sql: str, feedback: str) -> str:
    """The checker's message: the question, the query and what running it gave."""
    return f"Question: {question}\nSQL: {sql}\nResult: {feedback}\nDoes the result answer the question? OK or BAD?"


def rewriter_prompt(schema: str, question: str, sql: str, feedback: str) -> str:
    """The rewriter's message: schema, question, the rejected query and its result."""
    return f"Schema: {schema}\nQuestion: {question}\nSQL: {sql}\nResult: {feedback}\nWrite a corrected SQLite query."


_FENCE = re.compile(r"```(?:sql|sqlite)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
_SELECT = re.compile(r"\b(SELECT|WITH)\b.*", re.DOTALL | re.IGNORECASE)


def extract_sql(text: str) -> str:
    """The query in a reply: a fenced block if there is one, else from the first SELECT/WITH; first statement only."""
    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced else text
    found = _SELECT.search(body)
    body = found.group(0) if found else body
    return body.split(";")[0].strip()


def parse_verdict(text: str) -> bool:
    """Whether the checker accepted the query (its reply mentions ``OK`` and not ``BAD``)."""
    upper = text.upper()
    return "OK" in upper and "BAD" not in upper


class SQLState(TypedDict):
    """The graph's state: the task, the current query, what running it gave and the checker's verdict."""

    schema: str
    question: str
    db: str
    sql: NotRequired[str]
    feedback: NotRequired[str]
    accepted: NotRequired[bool]
    rewrites: NotRequired[int]


def _text(reply: Any) -> str:
    content = reply.content
    return content if isinstance(content, str) else "".join(str(part) for part in content)


def build_graph(
    llm: ChatOpenAI, max_rewrites: int = MAX_REWRITES, prompts: dict[str, list[BaseMessage]] | None = None
) -> Any:
    """writer → checker → (rewriter → checker)*, at most ``max_rewrites`` rewrites; the nodes are the agents.

    ``prompts``: the messages that open each agent's call (default: `prompt_messages` of ``$SQL_PROMPT_FILE``).
    """
    opening = _env_prompts() if prompts is None else prompts

    async def ask(agent: str, text: str) -> str:
        return _text(await llm.ainvoke([*opening.get(agent, []), HumanMessage(text)]))

    async def writer(state: SQLState) -> dict[str, Any]:
        reply = await ask("writer", writer_prompt(state["schema"], state["question"]))
        return {"sql": extract_sql(reply), "rewrites": 0}

    async def checker(state: SQLState) -> dict[str, Any]:
        sql = state.get("sql", "")
        feedback = result_feedback(execute(Path(state["db"]), sql))
        reply = await ask("checker", checker_prompt(state["question"], sql, feedback))
        return {"feedback": feedback, "accepted": parse_verdict(reply)}

    async def rewriter(state: SQLState) -> dict[str, Any]:
        prompt = rewriter_prompt(state["schema"], state["question"], state.get("sql", ""), state.get("feedback", ""))
        reply = await ask("rewriter", prompt)
        return {"sql": extract_sql(reply), "rewrites": state.get("rewrites", 0) + 1}

    def route(state: SQLState) -> str:
        if state.get("accepted") or state.get("rewrites", 0) >= max_rewrites:
            return END
        return "rewriter"

    graph = StateGraph(SQLState)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_node("rewriter", rewriter)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_conditional_edges("checker", route, {"rewriter": "rewriter", END: END})
    graph.add_edge("rewriter", "checker")
    return graph.compile()


async def run_sql_agent(
    llm: ChatOpenAI,
    task: dict[str, Any],
    max_rewrites: int = MAX_REWRITES,
    prompts: dict[str, list[BaseMessage]] | None = None,
) -> SQLState:
    """Run the graph on one task (``prompts``: see `build_graph`); returns the final state (its ``sql`` is the
    answer)."""
    db = task_database(task)
    state: SQLState = {"schema": task["schema"], "question": task["question"], "db": str(db)}
    return await build_graph(llm, max_rewrites, prompts).ainvoke(state)


def score(task: dict[str, Any], sql: str) -> float:
    """Execution match of ``sql`` against the task's gold query: 1.0 or 0.0."""
    db = task_database(task)
    return 1.0 if execution_match(execute(db, sql), execute(db, task["gold"])) else 0.0


@cache
def _http_clients() -> tuple[Any, Any]:
    """One connection pool per process, shared by every rollout's ChatOpenAI (see examples/calc/calc_agent.py)."""
    return openai.DefaultHttpxClient(), openai.DefaultAsyncHttpxClient()


@agl.rollout
async def sql_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """Answer ``task["question"]`` about database ``task["db_id"]``; reward by execution match with ``task["gold"]``."""
    llm_resource = resources.llm
    assert llm_resource is not None, "the trainer publishes an LLM resource"
    llm = ChatOpenAI(
        model=llm_resource.model,
        base_url=agl.llm_base_url(),
        api_key=llm_resource.api_key or "not-needed",  # pyright: ignore[reportArgumentType]  # the proxy's token
        max_retries=2,
        http_client=_http_clients()[0],
        http_async_client=_http_clients()[1],
        **llm_resource.sampling_parameters,
    )
    state = await run_sql_agent(llm, task)
    return score(task, state.get("sql", ""))
