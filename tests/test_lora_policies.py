"""One LoRA policy per agent, with no agent code change: two LangGraph agents, two adapters, one base model.

The graph's ``writer`` and ``rewriter`` nodes call the same ``ChatOpenAI`` model; nothing in the agent names a policy.
The trainer maps ``writer`` -> adapter ``writer`` and ``rewriter`` -> adapter ``rewriter``; our openai instrumentation
names the agent of each call and the proxy routes it. Iteration 1 runs tasks where only the writer acts: its
adapter is updated and the rewriter's stays bit-identical (skipped, counted). Iteration 2 runs both: each agent's
calls are served by its own adapter, at the version each adapter then had (writer 1, rewriter 0), and both update.
A greedy evaluation after it is served by both new adapters (version 2), as every `LLMCall` records.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from peft import get_peft_model_state_dict

import agentlightning as agl
import agentlightning_langchain
from agentlightning import LLMCall, PolicyMap
from agentlightning_torch import LoraSettings, PPOConfig, TorchTrainer, TorchTrainerConfig, policy_metric
from agentlightning_torch.testing import make_tiny_chat_model


def _graph() -> Any:
    async def writer(state: MessagesState, config: RunnableConfig) -> dict[str, list[Any]]:
        llm: ChatOpenAI = config.get("configurable", {})["llm"]
        reply = await llm.ainvoke(state["messages"])
        return {"messages": [AIMessage(content=str(reply.content), name="writer")]}

    async def rewriter(state: MessagesState, config: RunnableConfig) -> dict[str, list[Any]]:
        llm: ChatOpenAI = config.get("configurable", {})["llm"]
        reply = await llm.ainvoke([HumanMessage(f"rewrite: {state['messages'][-1].content}")])
        return {"messages": [AIMessage(content=str(reply.content), name="rewriter")]}

    def after_writer(state: MessagesState) -> str:
        return "rewriter" if "rewrite" in str(state["messages"][0].content) else END

    graph = StateGraph(MessagesState)
    graph.add_node("writer", writer)
    graph.add_node("rewriter", rewriter)
    graph.add_edge(START, "writer")
    graph.add_conditional_edges("writer", after_writer, {"rewriter": "rewriter", END: END})
    graph.add_edge("rewriter", END)
    return graph.compile()


GRAPH = _graph()


@agl.rollout
async def two_agents(task: dict[str, Any], resources: agl.Resources) -> float:
    """The writer answers; on ``rewrite`` tasks the rewriter rewrites it. Reward: the answers' length (varied)."""
    llm_resource = resources.llm
    assert llm_resource is not None
    llm = ChatOpenAI(
        model=llm_resource.model,
        base_url=agl.llm_base_url(),
        api_key=llm_resource.api_key or "none",  # pyright: ignore[reportArgumentType]
        max_retries=0,
        **llm_resource.sampling_parameters,
    )
    result = await GRAPH.ainvoke({"messages": [HumanMessage(task["prompt"])]}, {"configurable": {"llm": llm}})
    return sum(len(str(m.content)) for m in result["messages"][1:]) / 100.0


def _adapter(trainer: TorchTrainer, name: str) -> dict[str, torch.Tensor]:
    state = get_peft_model_state_dict(trainer.engine.policy, adapter_name=name)
    return {k: v.detach().clone() for k, v in state.items()}


async def _calls(store: agl.LightningStore, since: int) -> list[LLMCall]:
    rollouts = (await store.query_rollouts())[since:]
    calls: list[LLMCall] = []
    for rollout in rollouts:
        calls += await store.query_llm_calls(rollout.rollout_id)
    return calls


def _served(calls: list[LLMCall]) -> set[tuple[str | None, str | None, int | None]]:
    return {(c.agent_name, c.policy, c.model_version) for c in calls}


async def test_each_agent_trains_and_is_served_by_its_own_adapter(tmp_path: Path) -> None:
    model_dir = make_tiny_chat_model(tmp_path / "model", seed=0, corpus=["write rewrite a poem about rivers"])
    config = TorchTrainerConfig(
        model_dir=model_dir,
        output_dir=tmp_path / "run",
        tasks_per_iteration=2,
        samples_per_task=4,
        max_tokens=8,
        drop_equal_groups=False,
        rollout_timeout_s=3600,  # wait for every rollout, however slow the machine
        ppo=PPOConfig(lr=1e-2, lora=LoraSettings(r=4, alpha=16, target_modules=("q_proj", "v_proj"))),
        policies=PolicyMap(agents={"writer": "writer", "rewriter": "rewriter"}),
    )
    trainer = TorchTrainer(config)
    store = agl.MemoryStore()
    agentlightning_langchain.instrument()
    runner = agl.Runner(two_agents, store=store, n_workers=8, worker_mode="async", poll_interval=0.02)
    runner_task = asyncio.create_task(runner.arun())
    try:
        await trainer.start(store)
        writer0, rewriter0 = _adapter(trainer, "writer"), _adapter(trainer, "rewriter")
        base0 = {k: v.clone() for k, v in trainer.engine.policy.named_parameters() if "lora_" not in k}

        # 1: only the writer acts -> only its adapter changes; the rewriter's is skipped and counted
        first = await trainer.train_iteration(store, [{"prompt": "write a poem"}, {"prompt": "write rivers"}])
        writer1, rewriter1 = _adapter(trainer, "writer"), _adapter(trainer, "rewriter")
        assert any(not torch.equal(writer0[k], writer1[k]) for k in writer0)
        assert all(torch.equal(rewriter0[k], rewriter1[k]) for k in rewriter0)  # bit-identical
        base1 = {k: v for k, v in trainer.engine.policy.named_parameters() if "lora_" not in k}
        assert all(torch.equal(base0[k], base1[k]) for k in base0)
        assert first.metrics[policy_metric("writer", "samples")] == 8.0
        assert first.metrics[policy_metric("rewriter", "skipped")] == 1.0
        assert _served(await _calls(store, 0)) == {("writer", "writer", 0)}

        # 2: both act; each agent's calls go to its own adapter, at that adapter's version
        second = await trainer.train_iteration(store, [{"prompt": "rewrite a poem"}, {"prompt": "rewrite rivers"}])
        assert _served(await _calls(store, 8)) == {("writer", "writer", 1), ("rewriter", "rewriter", 0)}
        assert second.metrics[policy_metric("rewriter", "samples")] == 8.0
        assert all(second.metrics[policy_metric(p, "skipped")] == 0.0 for p in ("writer", "rewriter"))

        # the next calls of each agent are served by its own new adapter (both at version 2)
        await trainer.evaluate(store, [{"prompt": "rewrite a poem"}])
        assert _served(await _calls(store, 16)) == {("writer", "writer", 2), ("rewriter", "rewriter", 2)}
        backend = trainer.engine._backend  # pyright: ignore[reportPrivateUsage]
        assert backend is not None and backend.adapter_versions == {"writer": 2, "rewriter": 2}
        for name in ("writer", "rewriter"):  # what the backend serves is what the trainer holds
            served = get_peft_model_state_dict(backend.model, adapter_name=name)
            assert all(torch.equal(served[k], v) for k, v in _adapter(trainer, name).items())
        status = trainer.proxy.policy_router
        assert status is not None and status.unmapped_calls == 0
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await trainer.stop()
        agentlightning_langchain.uninstrument()
