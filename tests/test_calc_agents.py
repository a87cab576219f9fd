"""The calculator agent two ways, LangGraph (``calc_agent.py``) and plain OpenAI SDK calls (``calc_openai_agent.py``):
through the real proxy and the shipped checkpoint's backend, sampling with a seed per task, they make the same calls
(token for token) and earn the same rewards. ``e2e_overhead.py --agent openai`` relies on the plain agent being the
same workload without LangGraph."""

from __future__ import annotations

import asyncio
import json
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agentlightning as agl
from agentlightning_torch import TorchTrainer, TorchTrainerConfig

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"


def _agents() -> tuple[Any, Any, Callable[[], Any]]:
    sys.path.insert(0, str(CALC))
    try:
        from calc_agent import calc_agent  # pyright: ignore[reportMissingImports]
        from calc_openai_agent import aclose_clients, calc_openai_agent  # pyright: ignore[reportMissingImports]
    finally:
        sys.path.remove(str(CALC))
    return calc_agent, calc_openai_agent, aclose_clients


def _two_agents() -> Any:
    sys.path.insert(0, str(CALC))
    try:
        from calc_agent import calc_two_agents  # pyright: ignore[reportMissingImports]
    finally:
        sys.path.remove(str(CALC))
    return calc_two_agents


Calls = dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]]


async def _seeded_calls(
    tmp_path: Path,
    agent: Any,
    instrument: Callable[[], Any],
    uninstrument: Callable[[], Any],
    tasks: list[Any],
    agents: dict[str, list[str | None]] | None = None,
) -> tuple[float, Calls]:
    """The reward and, per question, each call's (prompt ids, response ids); ``agents``: filled with each call's
    agent name."""
    config = TorchTrainerConfig(
        model_dir=CALC / "checkpoint", tool_parser="calc", output_dir=tmp_path, rollout_timeout_s=3600
    )
    trainer = TorchTrainer(config)
    store = agl.MemoryStore()

    @agl.rollout
    async def seeded(task: dict[str, Any], resources: agl.Resources) -> float:
        # the same sample for a task under both agents: the backend gives a request with a seed its own generator
        llm = resources.llm
        assert llm is not None
        params = {**llm.sampling_parameters, "temperature": 1.0, "seed": zlib.crc32(task["question"].encode())}
        seeded_llm = type(llm).model_validate({**llm.model_dump(), "sampling_parameters": params})
        return await agent(task, agl.Resources(resources_id=resources.resources_id, items={"llm": seeded_llm}))

    instrument()
    runner = agl.Runner(seeded, store=store, n_workers=8, worker_mode="async", poll_interval=0.02)
    runner_task = asyncio.create_task(runner.arun())
    try:
        report = await trainer.evaluate(store, tasks)
        calls: Calls = {}
        for rollout in await store.query_rollouts(status=["succeeded"]):
            recorded = sorted(await store.query_llm_calls(rollout.rollout_id), key=lambda c: len(c.prompt_token_ids))
            calls[rollout.input["question"]] = [
                (tuple(c.prompt_token_ids), tuple(c.response_token_ids)) for c in recorded
            ]
            if agents is not None:
                agents[rollout.input["question"]] = [c.agent_name for c in recorded]
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await trainer.stop()
        uninstrument()
    assert report.finished == len(tasks)
    return report.reward_mean, calls


async def test_the_plain_openai_agent_makes_the_langgraph_agents_calls_and_earns_its_rewards(tmp_path: Path) -> None:
    import agentlightning_langchain
    from agentlightning.adapters import instrument_openai, uninstrument_openai

    langgraph_agent, openai_agent, aclose_clients = _agents()
    tasks = [json.loads(line) for line in (CALC / "data" / "val.jsonl").read_text().splitlines()[:24]]
    graph_reward, graph_calls = await _seeded_calls(
        tmp_path / "graph",
        langgraph_agent,
        agentlightning_langchain.instrument,
        agentlightning_langchain.uninstrument,
        tasks,
    )
    try:
        plain_reward, plain_calls = await _seeded_calls(
            tmp_path / "plain", openai_agent, instrument_openai, uninstrument_openai, tasks
        )
    finally:
        await aclose_clients()  # its connections, before the test's event loop ends
    assert len(graph_calls) == len(tasks)
    # the warm-started model samples the calculator on a fifth of the tasks: then both agents send the tool's answer
    tool_paths = sum(len(calls) == 2 for calls in graph_calls.values())
    print(f"{tool_paths} of {len(tasks)} tasks took the calculator path")
    assert tool_paths >= 1, "no task took the calculator path"
    assert plain_calls == graph_calls
    assert plain_reward == graph_reward


async def test_the_two_agent_graph_makes_the_same_calls_each_under_its_own_agent(tmp_path: Path) -> None:
    """``calc_two_agents`` (``train.py --agent langgraph-two``) is the same workload as ``calc_agent``, token for token,
    with the call before the tool's result made by ``caller`` and the one after it by ``answerer``: what lets
    ``--policy-per-agent`` give each its own policy."""
    import agentlightning_langchain

    one_agent, _, _ = _agents()
    tasks = [json.loads(line) for line in (CALC / "data" / "val.jsonl").read_text().splitlines()[:24]]
    hooks = (agentlightning_langchain.instrument, agentlightning_langchain.uninstrument)
    one: dict[str, list[str | None]] = {}
    two: dict[str, list[str | None]] = {}
    one_reward, one_calls = await _seeded_calls(tmp_path / "one", one_agent, *hooks, tasks, one)
    two_reward, two_calls = await _seeded_calls(tmp_path / "two", _two_agents(), *hooks, tasks, two)
    assert two_calls == one_calls and two_reward == one_reward
    assert {tuple(names) for names in one.values()} <= {("solver",), ("solver", "solver")}
    assert {tuple(names) for names in two.values()} == {("caller",), ("caller", "answerer")}, two
