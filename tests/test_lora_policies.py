"""One LoRA policy per agent, with no agent code change: two LangGraph agents, two adapters, one base model.

The graph's ``writer`` and ``rewriter`` nodes call the same ``ChatOpenAI`` model; nothing in the agent names a policy.
The trainer maps ``writer`` -> adapter ``writer`` and ``rewriter`` -> adapter ``rewriter``; our openai instrumentation
names the agent of each call and the proxy routes it. Iteration 1 runs tasks where only the writer acts: its
adapter is updated and the rewriter's stays bit-identical (skipped, counted). Iteration 2 runs both: each agent's
calls are served by its own adapter, at the version each adapter then had (writer 1, rewriter 0), and both update.
A greedy evaluation after it is served by both new adapters (version 2), as every `LLMCall` records.

The same through real vLLM's multi-LoRA serving (its CPU build; the session's shared LoRA server): the trainer loads
each policy's adapter into vLLM, one update changes only the writer's adapter, which is loaded in place and verified
by log-probs; the next calls of each agent are served by its own adapter at its own version, the writer's with
log-probs equal to the trainer's; the frozen checker gets the base; a trainer copy vLLM does not serve is caught.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
import torch
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from peft import get_peft_model_state_dict

import agentlightning as agl
import agentlightning_langchain
from agentlightning import AGENT_HEADER, FROZEN, LLMCall, PolicyMap
from agentlightning.testing import start_attempts
from agentlightning_torch import (
    BackendPoliciesServing,
    LoRASettings,
    PPOConfig,
    TorchTrainer,
    TorchTrainerConfig,
    VLLMLoRAServing,
    VLLMSettings,
    WeightSyncMismatch,
    policy_metric,
)
from agentlightning_torch.testing import VLLMServer, make_tiny_chat_model
from agentlightning_torch.vllm._weight_sync import reference_logprobs


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


def _two_agent_config(tmp_path: Path, kl_coef: float = 0.0, **policies: Any) -> TorchTrainerConfig:
    """A tiny model that knows the agents' words, one iteration of 2 tasks x 4 samples; ``policies``: the map and
    settings."""
    model_dir = make_tiny_chat_model(tmp_path / "model", seed=0, corpus=["write rewrite a poem about rivers"])
    lora = LoRASettings(r=4, alpha=16, target_modules=("q_proj", "v_proj"))
    return TorchTrainerConfig(
        model_dir=model_dir,
        output_dir=tmp_path / "run",
        tasks_per_iteration=2,
        samples_per_task=4,
        max_tokens=8,
        drop_equal_groups=False,
        rollout_timeout_s=3600,  # wait for every rollout, however slow the machine
        ppo=PPOConfig(lr=1e-3, kl_coef=kl_coef, lora=lora),  # adapters at 10x: 1e-2
        **policies,
    )


@contextlib.asynccontextmanager
async def _trainer_with_runner(trainer: TorchTrainer) -> AsyncGenerator[agl.MemoryStore, None]:
    """The trainer started on a memory store that a runner of `two_agents` (LangChain instrumented) serves."""
    store = agl.MemoryStore()
    agentlightning_langchain.instrument()
    runner = agl.Runner(two_agents, store=store, n_workers=8, worker_mode="async", poll_interval=0.02)
    runner_task = asyncio.create_task(runner.arun())
    try:
        await trainer.start(store)
        yield store
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await trainer.stop()
        agentlightning_langchain.uninstrument()


def _served(calls: list[LLMCall]) -> set[tuple[str | None, str | None, int | None]]:
    return {(c.agent_name, c.policy, c.model_version) for c in calls}


async def test_each_agent_trains_and_is_served_by_its_own_adapter(tmp_path: Path) -> None:
    config = _two_agent_config(tmp_path, policies=PolicyMap(agents={"writer": "writer", "rewriter": "rewriter"}))
    trainer = TorchTrainer(config)
    async with _trainer_with_runner(trainer) as store:
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
        serving = trainer.engine.serving
        assert isinstance(serving, BackendPoliciesServing)
        backend = serving.backend
        assert backend is not None and backend.lora_versions == {"writer": 2, "rewriter": 2}
        for name in ("writer", "rewriter"):  # what the backend serves is what the trainer holds
            served = get_peft_model_state_dict(backend.model, adapter_name=name)
            assert all(torch.equal(served[k], v) for k, v in _adapter(trainer, name).items())
        status = trainer.proxy.policy_router
        assert status is not None and status.unmapped_calls == 0


@agl.rollout
async def two_agents_full_length(task: dict[str, Any], resources: agl.Resources) -> float:
    """`two_agents` with every answer its full ``max_tokens`` long and reward 1 (so the passthrough credit of every
    sample is 1: the update moves the adapter whatever the tiny model says)."""
    llm_resource = resources.llm
    assert llm_resource is not None
    llm = ChatOpenAI(
        model=llm_resource.model,
        base_url=agl.llm_base_url(),
        api_key=llm_resource.api_key or "none",  # pyright: ignore[reportArgumentType]
        max_retries=0,
        extra_body={"ignore_eos": True},
        **llm_resource.sampling_parameters,
    )
    await GRAPH.ainvoke({"messages": [HumanMessage(task["prompt"])]}, {"configurable": {"llm": llm}})
    return 1.0


def _vllm_config(model_dir: Path, output: Path, url: str) -> TorchTrainerConfig:
    return TorchTrainerConfig(
        model_dir=model_dir,
        output_dir=output,
        model_name="tiny",  # what the shared server serves the base as
        backend="vllm",
        vllm=VLLMSettings(url=url),
        tasks_per_iteration=2,
        samples_per_task=2,
        max_tokens=8,
        estimator="passthrough",
        drop_equal_groups=False,
        rollout_timeout_s=3600,
        ppo=PPOConfig(lr=1e-2, lora=LoRASettings(r=4, alpha=16, target_modules=("q_proj", "v_proj"))),
        # adapter names no other test loads into the shared server
        policies=PolicyMap(agents={"writer": "draft", "rewriter": "edit", "checker": FROZEN}),
        proxy=agl.ProxySettings(pause_timeout_s=600),
    )


def _agrees(trainer: TorchTrainer, call: LLMCall, adapter: str | None) -> float:
    """The largest |difference| between the call's recorded log-probs (vLLM's) and the trainer's, with ``adapter``
    active (``None``: the base, every adapter off)."""
    model: Any = trainer.engine.policy
    prompt, response = list(call.prompt_token_ids), list(call.response_token_ids)
    if adapter is None:
        with model.disable_adapter():
            ours = reference_logprobs(model, prompt, response)[len(prompt) - 1 :]
    else:
        model.set_adapter(adapter)
        ours = reference_logprobs(model, prompt, response)[len(prompt) - 1 :]
    assert call.response_logprobs is not None and len(call.response_logprobs) == len(ours) == 8
    return max(abs(a - b) for a, b in zip(call.response_logprobs, ours, strict=True))


async def _checker_call(trainer: TorchTrainer, store: agl.LightningStore) -> LLMCall:
    """One call naming agent ``checker`` (mapped to the frozen base) through the trainer's proxy."""
    from openai import AsyncOpenAI

    attempts = await start_attempts(store, ["checker-1"])
    client = AsyncOpenAI(
        base_url=trainer.proxy.base_url("checker-1", attempts["checker-1"]), api_key=trainer.proxy.token, max_retries=0
    )
    await client.completions.create(
        model="tiny", prompt=[5, 6, 7, 8], max_tokens=8, temperature=0, extra_body={"ignore_eos": True},
        extra_headers={AGENT_HEADER: "checker"},
    )  # fmt: skip
    await trainer.proxy.flush()
    (call,) = await store.query_llm_calls("checker-1")
    return call


@pytest.mark.vllm
@pytest.mark.timeout(1500)
async def test_each_agent_trains_and_is_served_by_its_own_adapter_in_vllm(
    lora_vllm_server: VLLMServer, tool_model_dir: Path, tmp_path: Path
) -> None:
    trainer = TorchTrainer(_vllm_config(tool_model_dir, tmp_path / "run", lora_vllm_server.url))
    store = agl.MemoryStore()
    agentlightning_langchain.instrument()
    runner = agl.Runner(two_agents_full_length, store=store, n_workers=4, worker_mode="async", poll_interval=0.02)
    runner_task = asyncio.create_task(runner.arun())
    try:
        await trainer.start(store)  # vLLM's base verified, both adapters loaded and verified
        vllm = trainer.engine.serving
        assert isinstance(vllm, VLLMLoRAServing) and vllm.lora_sync is not None
        assert vllm.policy_versions() == {FROZEN: 0, "draft": 0, "edit": 0}
        draft0, edit0 = _adapter(trainer, "draft"), _adapter(trainer, "edit")

        # one update: only the writer acts -> only its adapter changes, is loaded into vLLM and verified
        first = await trainer.train_iteration(store, [{"prompt": "write a poem"}, {"prompt": "write rivers"}])
        draft1, edit1 = _adapter(trainer, "draft"), _adapter(trainer, "edit")
        assert any(not torch.equal(draft0[k], draft1[k]) for k in draft0)
        assert all(torch.equal(edit0[k], edit1[k]) for k in edit0)  # bit-identical
        assert first.metrics[policy_metric("draft", "samples")] == 4.0
        assert first.metrics[policy_metric("edit", "skipped")] == 1.0
        assert first.metrics["vllm_sync_adapters"] == 1.0  # only the changed adapter was loaded again
        assert _served(await _calls(store, 0)) == {("writer", "draft", 0)}
        assert vllm.policy_versions() == {FROZEN: 0, "draft": 1, "edit": 0}
        assert vllm.lora_sync.probes["draft"].version == 1
        assert vllm.lora_sync.probes["draft"].max_abs_diff <= trainer.engine.config.vllm.tolerance

        # the next calls of each agent: its own adapter, at its own version; vLLM's log-probs are the trainer's
        await trainer.evaluate(store, [{"prompt": "rewrite a poem"}])
        calls = await _calls(store, 4)
        assert _served(calls) == {("writer", "draft", 1), ("rewriter", "edit", 0)}
        for call in calls:
            assert call.model == call.policy  # vLLM answered as the adapter the proxy asked for
            assert _agrees(trainer, call, call.policy) <= 1e-3
        checker = await _checker_call(trainer, store)  # the frozen checker gets vLLM's base model
        assert (checker.policy, checker.model, checker.model_version) == (FROZEN, "tiny", 0)
        assert _agrees(trainer, checker, None) <= 1e-3
        status = trainer.proxy.policy_router
        assert status is not None and status.unmapped_calls == 0

        # a trainer copy vLLM does not serve (an update whose load vLLM dropped) is caught, naming policy + version
        with torch.no_grad():
            for name, parameter in trainer.engine.policy.named_parameters():
                if ".edit." in name and "lora_" in name:
                    parameter.add_(0.5)
        with pytest.raises(WeightSyncMismatch, match=r"policy 'edit': weight sync to version 1 failed verification"):
            await vllm.lora_sync.verify(trainer.engine.loras, "edit", 1)  # pyright: ignore[reportArgumentType]
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await trainer.stop()
        agentlightning_langchain.uninstrument()


async def _agent_call(trainer: TorchTrainer, store: agl.LightningStore, agent: str, rollout: str) -> LLMCall:
    """One greedy call naming ``agent`` through the trainer's proxy (routed to that agent's policy)."""
    from openai import AsyncOpenAI

    attempts = await start_attempts(store, [rollout])
    client = AsyncOpenAI(
        base_url=trainer.proxy.base_url(rollout, attempts[rollout]), api_key=trainer.proxy.token, max_retries=0
    )
    await client.completions.create(
        model="local", prompt=[5, 6, 7, 8], max_tokens=8, temperature=0, logprobs=1,
        extra_body={"ignore_eos": True}, extra_headers={AGENT_HEADER: agent},
    )  # fmt: skip
    await trainer.proxy.flush()
    (call,) = await store.query_llm_calls(rollout)
    return call


async def test_a_full_weight_policy_and_a_lora_policy_train_and_are_each_served_by_their_own_weights(
    tmp_path: Path,
) -> None:
    from agentlightning_torch import PolicySettings

    config = _two_agent_config(
        tmp_path,
        kl_coef=0.05,
        policies=PolicyMap(agents={"writer": "writer", "rewriter": "rewriter", "checker": FROZEN}),
        policy_settings={"writer": PolicySettings(weights="full", lr=1e-3)},
    )
    trainer = TorchTrainer(config)
    trained = trainer.engine.trained
    assert trained is not None and trained.full is not None
    async with _trainer_with_runner(trainer) as store:
        writer0 = {k: v.clone() for k, v in trained.full.state_dict("writer").items()}
        rewriter0 = _adapter(trainer, "rewriter")
        base0 = {k: v.clone() for k, v in trainer.engine.policy.named_parameters() if "lora_" not in k}

        # one iteration, both agents: each trains its own weights; the frozen base stays as it was
        report = await trainer.train_iteration(store, [{"prompt": "rewrite a poem"}, {"prompt": "rewrite rivers"}])
        assert _served(await _calls(store, 0)) == {("writer", "writer", 0), ("rewriter", "rewriter", 0)}
        assert all(report.metrics[policy_metric(p, "samples")] == 8.0 for p in ("writer", "rewriter"))
        assert report.metrics[policy_metric("writer", "lr")] == 1e-3
        writer1 = trained.full.state_dict("writer")
        assert any(not torch.equal(writer0[k], writer1[k]) for k in writer0)
        assert any(not torch.equal(v, _adapter(trainer, "rewriter")[k]) for k, v in rewriter0.items())
        base1 = dict(trainer.engine.policy.named_parameters())
        assert all(torch.equal(base0[k], base1[k]) for k in base0)

        # the next calls: each policy at its new version; the writer's backend holds the trainer's writer weights
        await trainer.evaluate(store, [{"prompt": "rewrite a poem"}])
        assert _served(await _calls(store, 8)) == {("writer", "writer", 1), ("rewriter", "rewriter", 1)}
        serving = trainer.engine.serving
        assert isinstance(serving, BackendPoliciesServing)
        backends = serving.full_backends
        assert backends is not None and backends.backends["writer"].model_version == 1
        served = backends.backends["writer"].model.state_dict()
        assert all(torch.equal(served[k], v) for k, v in trained.full.state_dict("writer").items())

        # perturb the writer alone and sync it: only the writer's answers change
        before = {a: await _agent_call(trainer, store, a, f"{a}-0") for a in ("writer", "rewriter", "checker")}
        assert {a: c.policy for a, c in before.items()} == {
            "writer": "writer",
            "rewriter": "rewriter",
            "checker": FROZEN,
        }
        with torch.no_grad():
            for parameter in trained.full.models["writer"].parameters():
                parameter.add_(torch.randn_like(parameter) * 0.5)
        trained.updated = ["writer"]
        await trainer.engine.sync_weights(2)
        after = {a: await _agent_call(trainer, store, a, f"{a}-1") for a in ("writer", "rewriter", "checker")}
        assert after["writer"].model_version == 2
        assert after["writer"].response_logprobs != before["writer"].response_logprobs
        for agent in ("rewriter", "checker"):
            assert after[agent].response_token_ids == before[agent].response_token_ids
            assert after[agent].response_logprobs == before[agent].response_logprobs
        # what the writer's backend answered is the trainer's writer copy, token for token
        call = after["writer"]
        prompt, response = list(call.prompt_token_ids), list(call.response_token_ids)
        ours = reference_logprobs(trained.full.models["writer"], prompt, response)[len(prompt) - 1 :]
        assert call.response_logprobs is not None
        assert max(abs(a - b) for a, b in zip(call.response_logprobs, ours, strict=True)) <= 1e-4
