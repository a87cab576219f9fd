"""`RLLoop` end to end with a trivial engine: a real runner, the real proxy, a scripted model server as "weights".

What must hold for every engine: late rollouts are cancelled and never trained on, the proxy's background records
are flushed before the batch is built, each sample carries the version that generated it, the new version is
synced, published and recorded, and a checkpoint resumes the iteration, the model version and the engine's state.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import agentlightning as agl
from agentlightning.loop import LOOP_STATE_FILE, LoopConfig, ProxySettings, RLLoop
from agentlightning.testing import ScriptedServerEngine, chat_through_proxy

GATE: dict[str, asyncio.Event] = {}


def _auth(api_key: str | None) -> dict[str, str]:
    """What an OpenAI client sends with the published ``api_key`` (the loop's proxy always has a token)."""
    assert api_key, "the loop publishes its proxy's token as the LLM resource's api_key"
    return {"Authorization": f"Bearer {api_key}"}


async def _call(task: dict[str, Any], resources: agl.Resources) -> None:
    """One LLM call through the proxy, its span joined to the proxy's record by response id."""
    llm = resources.llm
    assert llm is not None and llm.api_key, "the loop publishes its proxy's token as the LLM resource's api_key"
    request = {"model": llm.model, "messages": [{"role": "user", "content": task["q"]}], **llm.sampling_parameters}
    await chat_through_proxy(llm.api_key, request)


def _reward() -> float:
    ctx = agl.current_rollout()
    assert ctx is not None
    return 1.0 if ctx.rollout_id.endswith("-s0") else 0.0


@agl.rollout
async def chatty_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """One LLM call through the proxy (span joined by response id); a ``slow`` task then waits for the gate."""
    await _call(task, resources)
    if task.get("slow"):
        await GATE["slow"].wait()
    return _reward()


class FakeEngine(ScriptedServerEngine):
    """Weights are a version number: the scripted server reports it on every answer, `update` only records."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[agl.TrainingBatch] = []
        self.synced: list[int] = []
        self.loaded: dict[str, Any] | None = None

    def update(self, batch: agl.TrainingBatch) -> dict[str, float]:
        self.batches.append(batch)
        return {"fake_loss": float(len(batch.samples))}

    async def sync_weights(self, version: int) -> None:
        self.server.model_version = version
        self.synced.append(version)

    def iteration_metrics(self) -> dict[str, float]:
        return {"served": float(len(self.server.served))}

    def save_state(self, directory: Path) -> None:
        (directory / "fake.json").write_text(json.dumps({"updates": len(self.batches)}))

    def load_state(self, directory: Path) -> None:
        self.loaded = json.loads((directory / "fake.json").read_text())


def _config(tmp_path: Path, **overrides: Any) -> LoopConfig:
    settings: dict[str, Any] = {
        "output_dir": tmp_path,
        "model_name": "toy",
        "iterations": 2,
        "tasks_per_iteration": 3,
        "samples_per_task": 2,
        "task_order": "cycle",
        "max_tokens": 16,
        "checkpoint_every": 1,
        "rollout_timeout_s": 600,
    }
    return LoopConfig(**{**settings, **overrides})


TASKS = [{"q": "slow one", "slow": True}, {"q": "two"}, {"q": "three"}]


async def _slow_ids(store: agl.LightningStore, ids: Sequence[str]) -> set[str]:
    return {r.rollout_id for r in await store.query_rollouts(rollout_ids=list(ids)) if r.input.get("slow")}


async def test_loop_cancels_late_rollouts_trains_on_served_versions_and_resumes(tmp_path: Path) -> None:
    GATE["slow"] = asyncio.Event()
    store = agl.MemoryStore()
    real_wait = store.wait_for_rollouts
    waited: list[set[str]] = []

    async def wait_until_only_slow_ones_run(rollout_ids: Sequence[str], timeout: float | None = None) -> list[Any]:
        # Stands in for the rollout timeout without a clock: "late" = the slow rollouts, blocked on the gate.
        slow = await _slow_ids(store, rollout_ids)
        waited.append(slow)
        await real_wait([i for i in rollout_ids if i not in slow])
        return await real_wait(rollout_ids, timeout=0)

    store.wait_for_rollouts = wait_until_only_slow_ones_run  # type: ignore[method-assign]
    engine = FakeEngine()
    reports: list[agl.IterationReport] = []
    loop = RLLoop(_config(tmp_path), engine, on_iteration=reports.append)
    runner = agl.Runner(chatty_agent, store=store, n_workers=8, worker_mode="async", poll_interval=0.01)
    runner_task = asyncio.create_task(runner.arun())
    try:
        await loop.run(store, TASKS)
        assert not loop.proxy.paused and loop.proxy.model_version == 2
        published = loop.resources("sample")
        assert published.llm is not None and published.llm.endpoint == loop.proxy.url
        assert published.llm.sampling_parameters == {"temperature": 1.0, "max_tokens": 16}
        assert published.llm.runner_token == loop.proxy.runner_token  # runners register their slots with it
    finally:
        GATE["slow"].set()
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await loop.stop()

    # Two updates, each synced as the next version; the slow rollouts were cancelled and never trained on.
    assert engine.synced == [1, 2] and loop.model_version == 2 and loop.iteration == 2
    assert len(engine.batches) == 2 and [r.iteration for r in reports] == [1, 2]
    slow = set().union(*waited)
    assert len(slow) == 4
    assert {r.status for r in await store.query_rollouts(rollout_ids=sorted(slow))} == {"cancelled"}
    for version, batch in enumerate(engine.batches):
        assert len(batch.samples) == 4 and not {s.rollout_id for s in batch.samples} & slow
        # Each sample says which weights generated it: the version served during its iteration.
        assert {s.model_version for s in batch.samples} == {version}
        assert batch.metrics["staleness_mean"] == 0.0 and batch.metrics["staleness_max"] == 0.0
        # Rollouts were pinned to the resources published for that version.
        for sample in batch.samples:
            rollout = await store.get_rollout(sample.rollout_id)
            assert rollout.resources_id is not None and rollout.resources_id.startswith(f"policy-v{version}-sample-")
    # Calls of the cancelled rollouts were recorded too (flushed), with the version that served them.
    for rollout_id in slow:
        [call] = await store.query_llm_calls(rollout_id)
        assert call.model_version in (0, 1)

    for report in reports:
        assert report.finished == 4 and report.rollouts == 6 and report.kind == "train"
        assert report.metrics["fake_loss"] == 4.0 and report.metrics["n_samples"] == 4.0
        assert {"time_rollouts", "time_batch", "time_update", "time_sync", "served"} <= set(report.metrics)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(line["iteration"], line["model_version"], line["kind"]) for line in lines] == [
        (1, 1, "train"),
        (2, 2, "train"),
    ]
    assert json.loads((tmp_path / "checkpoint" / LOOP_STATE_FILE).read_text()) == {"iteration": 2, "model_version": 2}

    # Resume: iteration, model version and engine state come back; the server reports the resumed version.
    resumed_engine = FakeEngine()
    resumed = RLLoop(_config(tmp_path, resume=True, iterations=3), resumed_engine)
    store2 = agl.MemoryStore()
    runner2 = agl.Runner(chatty_agent, store=store2, n_workers=4, worker_mode="async", poll_interval=0.01)
    runner2_task = asyncio.create_task(runner2.arun())
    try:
        await resumed.start(store2)
        assert (resumed.iteration, resumed.model_version) == (2, 2) and resumed_engine.loaded == {"updates": 2}
        report = await resumed.evaluate(store2, [{"q": "a"}, {"q": "b"}])
    finally:
        runner2.stop()
        await asyncio.wait_for(runner2_task, 60)
        await resumed.stop()
    assert report.kind == "eval" and report.finished == 2 and report.model_version == 2
    assert resumed.history == [] and resumed_engine.batches == []
    evaluated = await store2.query_rollouts(status=["succeeded"])
    for rollout in evaluated:
        assert rollout.resources_id is not None and rollout.resources_id.startswith("policy-v2-greedy-")
        [call] = await store2.query_llm_calls(rollout.rollout_id)
        assert call.model_version == 2 and call.request["temperature"] == 0.0
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["kind"] == "eval"


async def test_an_iteration_without_samples_skips_the_update_and_keeps_the_version(tmp_path: Path) -> None:
    store = agl.MemoryStore()
    engine = FakeEngine()
    # One sample per task: every group has a single reward, so every group is dropped as equal.
    config = _config(
        tmp_path,
        samples_per_task=1,
        estimator="reinforce_pp",  # grpo/rloo with one sample per task are refused by LoopConfig
        credit_config=agl.CreditConfig(drop_equal_groups=True),
    )
    loop = RLLoop(config, engine)
    runner = agl.Runner(chatty_agent, store=store, n_workers=4, worker_mode="async", poll_interval=0.01)
    runner_task = asyncio.create_task(runner.arun())
    try:
        report = await loop.train_iteration(store, [{"q": "x"}])
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await loop.stop()
    assert report.metrics["skipped_update"] == 1.0 and engine.batches == [] and engine.synced == []
    assert loop.model_version == 0 and loop.iteration == 1


class StragglerEngine(FakeEngine):
    """Servers that are still generating after the wait (a straggler the proxy gave up on), idle once aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.generating = 1
        self.calls: list[tuple[str, int]] = []  # (verb, version synced so far)

    async def wait_servers_idle(self, timeout_s: float) -> int:
        self.calls.append(("wait_idle", len(self.synced)))
        return self.generating

    async def abort_servers(self, timeout_s: float) -> int:
        self.calls.append(("abort", len(self.synced)))
        self.generating = 0
        return 0


async def test_servers_still_generating_after_the_wait_are_aborted_before_the_weights_change(tmp_path: Path) -> None:
    store = agl.MemoryStore()
    engine = StragglerEngine()
    loop = RLLoop(_config(tmp_path, iterations=1), engine)
    runner = agl.Runner(chatty_agent, store=store, n_workers=4, worker_mode="async", poll_interval=0.01)
    runner_task = asyncio.create_task(runner.arun())
    try:
        await loop.train_iteration(store, [{"q": "x"}])
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await loop.stop()
    # before the update: the wait finds a request still generating, so the loop aborts it; before the sync the
    # servers are idle: nothing more to abort
    assert engine.calls == [("wait_idle", 0), ("abort", 0), ("wait_idle", 0)] and engine.synced == [1]


def test_loop_config_is_frozen_and_checks_the_proxy_exposure(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with pytest.raises(ValueError, match="frozen"):
        config.iterations = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="advertised_url"):
        ProxySettings(advertised_url="proxy:8000")
    with pytest.raises(ValueError, match="without a token"):
        ProxySettings(host="0.0.0.0").check_exposure()
    with pytest.raises(ValueError, match="at least 16 characters"):
        ProxySettings(host="0.0.0.0", token="t", advertised_url="http://trainer:9000/").check_exposure()
    with pytest.raises(ValueError, match="advertised_url"):
        ProxySettings(host="0.0.0.0", token="t" * 16).check_exposure()
    ProxySettings(host="0.0.0.0", token="t" * 16, advertised_url="http://trainer:9000/").check_exposure()
    assert ProxySettings(advertised_url="http://trainer:9000/").advertised_url == "http://trainer:9000"


async def test_an_empty_task_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train_tasks is empty"):
        await RLLoop(_config(tmp_path), FakeEngine()).run(agl.MemoryStore(), [])


# ----- max_staleness=1: the next iteration's rollouts run while the engine updates ----------------------------------

STATE: dict[str, Any] = {}


@agl.rollout
async def overlap_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """One call, announced on ``STATE["answered"]``. In the iteration named by ``after_sync_in`` (``it1``) the task
    calls only once ``STATE["synced"]`` is set; in the one named by ``hold_in`` it then waits for the hold gate."""
    ctx = agl.current_rollout()
    assert ctx is not None
    iteration = ctx.rollout_id.split("-", 1)[0]  # it<N> or eval<N>
    if iteration == task.get("after_sync_in"):
        await STATE["synced"].wait()
    await _call(task, resources)
    STATE["answered"].put_nowait(ctx.rollout_id)
    if iteration == task.get("hold_in"):
        await GATE["hold"].wait()
    return _reward()


class OverlapEngine(FakeEngine):
    """Serves during the update; `update` (a worker thread) says it started, then waits for the test's release."""

    serves_during_update = True

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.updating = asyncio.Event()
        self.release = threading.Event()
        self.fail_at = fail_at
        self._loop = asyncio.get_running_loop()

    def update(self, batch: agl.TrainingBatch) -> dict[str, float]:
        self._loop.call_soon_threadsafe(self.updating.set)
        if not self.release.wait(timeout=300):  # a deadlock guard, not a timing condition
            raise RuntimeError("the test never released the update")
        if self.fail_at == len(self.batches):
            raise RuntimeError("update failed")
        return super().update(batch)


def _runner(store: agl.LightningStore) -> tuple[agl.Runner, asyncio.Task[None]]:
    runner = agl.Runner(overlap_agent, store=store, n_workers=8, worker_mode="async", poll_interval=0.01)
    return runner, asyncio.create_task(runner.arun())


async def _by_prefix(store: agl.LightningStore, prefix: str) -> list[agl.Rollout]:
    return [r for r in await store.query_rollouts() if r.rollout_id.startswith(prefix)]


async def test_one_step_off_policy_serves_the_next_iteration_during_the_update(tmp_path: Path) -> None:
    STATE.update(answered=asyncio.Queue(), synced=asyncio.Event())
    store = agl.MemoryStore()
    engine = OverlapEngine()
    # "late" rollouts of iteration 1 call only after iteration 0's weight sync (its report comes after the resume)
    tasks = [{"q": "early"}, {"q": "late", "after_sync_in": "it1"}]
    config = _config(tmp_path, max_staleness=1, tasks_per_iteration=2, eval_every=1, proxy=ProxySettings(record="sync"))
    loop = RLLoop(config, engine, on_iteration=lambda report: STATE["synced"].set())
    runner, runner_task = _runner(store)
    run = asyncio.create_task(loop.run(store, tasks, [{"q": "v1"}, {"q": "v2"}]))
    try:
        await asyncio.wait_for(engine.updating.wait(), 120)
        # Iteration 0's update is running; iteration 1's "early" rollouts are enqueued and served meanwhile.
        early: set[str] = set()
        while len(early) < 2:
            rollout_id = await asyncio.wait_for(STATE["answered"].get(), 120)
            if rollout_id.startswith("it1-"):
                early.add(rollout_id)
        assert engine.batches == [] and engine.synced == [] and not loop.proxy.paused
        for rollout_id in early:
            [call] = await store.query_llm_calls(rollout_id)
            assert call.model_version == 0
        engine.release.set()
        await asyncio.wait_for(run, 120)
    finally:
        engine.release.set()
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await loop.stop()

    assert engine.synced == [1, 2] and len(engine.batches) == 2
    first, second = engine.batches
    assert {s.model_version for s in first.samples} == {0} and first.metrics["staleness_max"] == 0.0
    # Iteration 1 trains on exactly its rollouts' recorded calls: served by version 0 before the sync, 1 after.
    prefetched = await _by_prefix(store, "it1-")
    assert len(prefetched) == 4 and {s.rollout_id for s in second.samples} == {r.rollout_id for r in prefetched}
    for sample in second.samples:
        [call] = await store.query_llm_calls(sample.rollout_id)
        assert sample.model_version == call.model_version == (0 if sample.rollout_id in early else 1)
        assert sample.response_token_ids == call.response_token_ids
        assert sample.response_logprobs == call.response_logprobs
        rollout = await store.get_rollout(sample.rollout_id)
        assert rollout.resources_id is not None and rollout.resources_id.startswith("policy-v0-sample-")
    assert second.metrics["staleness_max"] == 1.0 and second.metrics["staleness_mean"] == 0.5
    assert loop.history[1].metrics["staleness_max"] == 1.0
    # Greedy evaluations in between count only their own rollouts, served by the version just published.
    evals = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in evals if line["kind"] == "eval"]
    assert [(e["model_version"], e["rollouts"], e["finished"]) for e in evals] == [(1, 2, 2), (2, 2, 2)]
    for version in (1, 2):
        for rollout in await _by_prefix(store, f"eval{version}-"):
            [call] = await store.query_llm_calls(rollout.rollout_id)
            assert call.model_version == version and call.request["temperature"] == 0.0
    # Nothing was enqueued for an iteration past `iterations`, and nothing is left queued or running.
    assert await _by_prefix(store, "it2-") == []
    assert await store.query_rollouts(status=["queuing", "running"]) == []


@pytest.mark.parametrize("ending", ["error", "stop"])
async def test_rollouts_prefetched_for_an_iteration_that_will_not_run_are_cancelled(
    tmp_path: Path, ending: str
) -> None:
    GATE["hold"] = asyncio.Event()
    STATE.update(answered=asyncio.Queue(), synced=asyncio.Event())
    store = agl.MemoryStore()
    # error: iteration 1's update fails after iteration 2's rollouts were enqueued; stop: the loop stops after one
    # `train_iteration`, which enqueued iteration 1's.
    unrun = "it2" if ending == "error" else "it1"
    engine = OverlapEngine(fail_at=1 if ending == "error" else None)
    engine.release.set()
    tasks = [{"q": "a", "hold_in": unrun}, {"q": "b", "hold_in": unrun}]
    loop = RLLoop(_config(tmp_path, max_staleness=1, iterations=3, tasks_per_iteration=2), engine)
    runner, runner_task = _runner(store)
    try:
        if ending == "error":
            with pytest.raises(RuntimeError, match="update failed"):
                await loop.run(store, tasks)
        else:
            await loop.train_iteration(store, tasks)
            assert len(await _by_prefix(store, f"{unrun}-")) == 4
            await loop.stop()
    finally:
        GATE["hold"].set()
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await loop.stop()
    cancelled = await _by_prefix(store, f"{unrun}-")
    assert len(cancelled) == 4 and {r.status for r in cancelled} == {"cancelled"}
    assert await store.query_rollouts(status=["queuing", "running"]) == []


def test_max_staleness_needs_an_engine_that_serves_during_the_update(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="FakeEngine does not"):
        RLLoop(_config(tmp_path, max_staleness=1), FakeEngine())


def test_policies_need_an_engine_that_trains_several(tmp_path: Path) -> None:
    from agentlightning import PolicyMap

    with pytest.raises(ValueError, match="FakeEngine cannot train several policies: it trains one policy"):
        RLLoop(_config(tmp_path, policies=PolicyMap(agents={"writer": "writer"})), FakeEngine())


async def test_the_loops_proxy_always_has_a_token_and_publishes_it(tmp_path: Path) -> None:
    """No ``ProxySettings.token`` on loopback: the loop makes one (a web page in a local browser reaches the port)."""
    engine = FakeEngine()
    loop = RLLoop(_config(tmp_path), engine)
    store = agl.MemoryStore()
    await loop.start(store)
    try:
        token = loop.proxy.token
        assert token is not None and len(token) >= 32
        assert {loop.resources(mode).llm.api_key for mode in ("sample", "greedy")} == {token}  # type: ignore[union-attr]
        request = {"model": "toy", "messages": [{"role": "user", "content": "hi"}]}
        url = f"{loop.proxy.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=request) as resp:
                assert resp.status == 401
            async with http.get(f"{loop.proxy.url}/v1/models", headers=_auth(token)) as resp:
                assert resp.status == 200
    finally:
        await loop.stop()


def test_the_old_algorithm_base_is_gone_and_the_loop_is_the_one_contract() -> None:
    """One training contract: an `Engine` driven by `RLLoop`; the old ``Algorithm`` base class is removed."""
    assert not hasattr(agl, "Algorithm") and "Algorithm" not in agl.__all__
    assert not hasattr(agl.RLLoop, "update")


HELD_OUT_BY_VERSION = {0: 0.25, 1: 0.75, 2: 0.5, 3: 0.75}
"""What the held-out evaluation scores with each model version: best at version 1 (a later tie does not replace it)."""


@agl.rollout
async def versioned_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """Training rollouts: reward 1 for sample 0 of a group; greedy evaluations: a score fixed per model version."""
    await _call(task, resources)
    name = resources.resources_id  # policy-v{version}-{mode}-{ns}
    if "-greedy-" in name:
        return HELD_OUT_BY_VERSION[int(name.split("-")[1].removeprefix("v"))]
    return _reward()


async def test_eval_every_writes_held_out_points_and_keeps_the_best_checkpoint(tmp_path: Path) -> None:
    store = agl.MemoryStore()
    engine = FakeEngine()
    config = _config(tmp_path, iterations=3, eval_every=1, checkpoint_every=0, tasks_per_iteration=2)
    loop = RLLoop(config, engine)
    runner = agl.Runner(versioned_agent, store=store, n_workers=8, worker_mode="async", poll_interval=0.01)
    running = asyncio.create_task(runner.arun())
    try:
        await loop.start(store)
        before = await loop.evaluate(store, [{"q": "held out"}], keep_best=True)
        await loop.run(store, [{"q": "one"}, {"q": "two"}], val_tasks=[{"q": "held out"}])
    finally:
        runner.stop()
        await asyncio.wait_for(running, 60)
        await loop.stop()

    assert before.reward_mean == 0.25 and loop.model_version == 3
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["iteration"], r["reward_mean"], r["metrics"].get("best")) for r in rows if r["kind"] == "eval"]
    # one held-out point before RL and one after each iteration, in metrics.jsonl between the training lines
    assert evals == [(0, 0.25, 1.0), (1, 0.75, 1.0), (2, 0.5, None), (3, 0.75, None)]
    assert [row["kind"] for row in rows] == ["eval", "train", "eval", "train", "eval", "train", "eval"]
    # checkpoint/best holds the best evaluation's weights (version 1, after iteration 1), the last checkpoint the end's
    assert loop.best is not None and loop.best.iteration == 1
    best = loop.best_checkpoint_dir
    assert best == tmp_path / "checkpoint" / "best"
    assert json.loads((best / LOOP_STATE_FILE).read_text()) == {"iteration": 1, "model_version": 1}
    assert json.loads((best / "fake.json").read_text()) == {"updates": 1}
    assert json.loads((tmp_path / "checkpoint" / LOOP_STATE_FILE).read_text()) == {"iteration": 3, "model_version": 3}
    assert [r.iteration for r in loop.evaluations] == [0, 1, 2, 3]


def test_best_metric_must_be_a_figure_of_the_evaluation() -> None:
    from agentlightning.loop import IterationReport, held_out_score

    report = IterationReport(1, 1, 4, 4, 0.5, 1.0, 0.0, 1.0, metrics={"accuracy": 0.25})
    assert held_out_score(report) == 0.5 and held_out_score(report, "accuracy") == 0.25
    with pytest.raises(ValueError, match="best_metric 'f1' is not a figure of the evaluation report"):
        held_out_score(report, "f1")
