"""The LLM judge as the only reward of `RLLoop`: a real runner, the real proxy, a scripted policy and a scripted judge,
both real HTTP servers on 127.0.0.1.

Each rollout makes two LLM calls (agents ``planner`` then ``solver``) through the proxy and reports no reward. The
judge scores every group (the rollout whose messages say ``sample s0`` best) and every step (the planner's call 0.1,
the solver's 0.7). What must hold: the group scores are the transitions' final rewards, the step scores their
intermediate rewards, the ``per_step`` strategy's credits are their return-to-go, every verdict is stored as a span
of the rollout (a step's under its LLM span), ``metrics.jsonl`` counts the judge's calls and tokens, and none of the
judge's calls went through the proxy: the store holds only the agents' calls, and no sample's tokens hold the judge's
prompt.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

import agentlightning as agl
from agentlightning import semconv
from agentlightning.judge import JUDGE_REASON, JUDGE_SCOPE, JUDGE_SCORE, JUDGE_STEP, JudgeConfig
from agentlightning.loop import LoopConfig, RLLoop
from agentlightning.testing import (
    ScriptedModelServer,
    ScriptedReply,
    ScriptedServerEngine,
    ToyTokenizer,
    chat_through_proxy,
)
from agentlightning.ui import ExplainRequest, explain_attempt

STEP_SCORES = {"planner": 0.1, "solver": 0.7}


class FakeEngine(ScriptedServerEngine):
    """Weights are a version number served by a scripted policy server; `update` only keeps the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[agl.TrainingBatch] = []

    def update(self, batch: agl.TrainingBatch) -> dict[str, float]:
        self.batches.append(batch)
        return {}

    async def sync_weights(self, version: int) -> None:
        self.server.model_version = version

    def save_state(self, directory: Path) -> None:
        pass

    def load_state(self, directory: Path) -> None:
        pass


def judge_script(body: dict[str, Any]) -> ScriptedReply:
    """A deterministic judge: groups by which sample a rollout is, steps by which agent made the call."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    if '"scores"' in system:
        sections = re.split(r"=== rollout (r\d+) ===", user)[1:]
        scores = [
            {
                "id": short,
                "score": 1.0 if "sample s0" in text else 0.25,
                "reason": f"{short} is {'best' if 'sample s0' in text else 'worse'}",
            }
            for short, text in zip(sections[::2], sections[1::2], strict=True)
        ]
        return ScriptedReply(content=json.dumps({"scores": scores}))
    steps = re.findall(r"\[step (\d+)\] agent=(\w+)", user)
    answer = [{"step": int(n), "score": STEP_SCORES[agent], "reason": f"{agent} step"} for n, agent in steps]
    return ScriptedReply(content="```json\n" + json.dumps({"steps": answer}) + "\n```")


async def _chat(agent: str, text: str, resources: agl.Resources) -> None:
    llm = resources.llm
    assert llm is not None and llm.api_key
    request = {"model": llm.model, "messages": [{"role": "user", "content": text}], "max_tokens": 16}
    await chat_through_proxy(
        llm.api_key, request, span_name=f"chat {agent}", attributes={semconv.GEN_AI_AGENT_NAME: agent}
    )


@agl.rollout
async def two_agents(task: dict[str, Any], resources: agl.Resources) -> None:
    """A planner call and a solver call; no reward: the judge gives it."""
    ctx = agl.current_rollout()
    assert ctx is not None
    sample = ctx.rollout_id.rsplit("-", 1)[1]
    await _chat("planner", f"plan {task['q']} sample {sample}", resources)
    await _chat("solver", f"solve {task['q']} sample {sample}", resources)


async def test_group_and_step_scores_reach_the_transitions_and_per_step_credit(tmp_path: Path) -> None:
    store = agl.MemoryStore()
    engine = FakeEngine()
    with ScriptedModelServer(judge_script, model="judge") as judge_server:
        judge = JudgeConfig(url=judge_server.base_url, model="judge", rubric="Sample s0 is right.", mode="both")
        config = LoopConfig(
            output_dir=tmp_path,
            model_name="toy",
            iterations=1,
            tasks_per_iteration=2,
            samples_per_task=2,
            task_order="cycle",
            checkpoint_every=0,
            credit="per_step",
            estimator="passthrough",
            judge=judge,
        )
        loop = RLLoop(config, engine)
        runner = agl.Runner(two_agents, store=store, n_workers=4, worker_mode="async", poll_interval=0.01)
        runner_task = asyncio.create_task(runner.arun())
        try:
            await loop.run(store, [{"q": "one"}, {"q": "two"}])
        finally:
            runner.stop()
            await asyncio.wait_for(runner_task, 60)
            await loop.stop()
        judge_requests = list(judge_server.requests)

    [batch] = engine.batches
    assert len(batch.samples) == 8  # 4 rollouts x 2 calls
    for sample in batch.samples:
        final = 1.0 if sample.rollout_id.endswith("-s0") else 0.25
        # per_step, gamma 1: a step's credit is its own and later steps' judge scores plus the final reward
        expected = {"planner": 0.1 + 0.7 + final, "solver": 0.7 + final}[sample.agent_name or ""]
        assert sample.credit == pytest.approx(expected), (sample.rollout_id, sample.agent_name)
        assert sample.advantage == pytest.approx(expected)  # passthrough
    # 2 group calls + 4 step calls, none through the proxy: the store holds the agents' 8 calls only
    assert len(judge_requests) == 6
    calls = [c for r in await store.query_rollouts() for c in await store.query_llm_calls(r.rollout_id)]
    assert len(calls) == 8 and all(c.request["messages"][0]["content"].startswith(("plan", "solve")) for c in calls)
    assert len(engine.server.requests) == 8
    tokenizer = ToyTokenizer()
    for sample in batch.samples:
        assert "You judge" not in tokenizer.decode(sample.prompt_token_ids + sample.response_token_ids)

    # every verdict is a span of its rollout; a step's hangs under the LLM span it judges
    for rollout in await store.query_rollouts():
        spans = await store.query_spans(rollout.rollout_id)
        by_id = {s.span_id: s for s in spans}
        verdicts = [s for s in spans if s.attributes.get(semconv.SPAN_KIND) == semconv.KIND_JUDGE]
        [group] = [s for s in verdicts if s.attributes[JUDGE_SCOPE] == "rollout"]
        best = rollout.rollout_id.endswith("-s0")
        assert group.attributes[JUDGE_SCORE] == (1.0 if best else 0.25)
        assert group.attributes[JUDGE_REASON] in ("r1 is best", "r2 is best", "r1 is worse", "r2 is worse")
        steps = sorted(
            (s for s in verdicts if s.attributes[JUDGE_SCOPE] == "step"), key=lambda s: str(s.attributes[JUDGE_STEP])
        )  # type: ignore[arg-type, return-value]
        assert [s.attributes[JUDGE_SCORE] for s in steps] == [0.1, 0.7]
        assert [by_id[s.parent_id].attributes[semconv.GEN_AI_AGENT_NAME] for s in steps if s.parent_id] == [
            "planner",
            "solver",
        ]

    # the dashboard's explanation shows the rewards the trainer applied, read back from the verdict spans
    explained = await explain_attempt(
        store, ExplainRequest(rollout_id=batch.samples[0].rollout_id, credit="per_step", estimator="passthrough")
    )
    final = 1.0 if explained.rollout_id.endswith("-s0") else 0.25
    assert [(r.intermediate_reward, r.final_reward) for r in explained.transitions] == [(0.1, final), (0.7, final)]
    assert [r.credit for r in explained.transitions] == pytest.approx([0.8 + final, 0.7 + final])

    [line] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    metrics = line["metrics"]
    assert metrics["judge_calls"] == 6 and metrics["judge_tokens"] > 0 and metrics["judge_rewards_missing"] == 0
    assert metrics["judge_rollouts_judged"] == 4 and metrics["judge_steps_judged"] == 8
    assert metrics["judge_latency_s"] > 0


def test_step_scores_need_a_credit_strategy_that_reads_them(tmp_path: Path) -> None:
    judge = JudgeConfig(url="http://127.0.0.1:9/v1", model="judge", rubric="good", mode="step")
    with pytest.raises(ValueError, match="use credit='per_step'"):
        LoopConfig(output_dir=tmp_path, judge=judge)
    LoopConfig(output_dir=tmp_path, judge=judge, credit="per_step")
