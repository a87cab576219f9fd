"""`RLLoop` with a staleness bound of k versions: admission control, samples too old dropped and counted, a stop
during an overlapped update.

A real runner, the real proxy and a scripted model server whose reported version is the engine's "weights".
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

import agentlightning as agl
from agentlightning.loop import Engine, LoopConfig, ProxySettings, RLLoop
from agentlightning.loop._staleness import admit_samples, version_lag_histogram
from agentlightning.testing import ScriptedServerEngine, chat_through_proxy

HOLD: dict[str, asyncio.Event] = {}


@agl.rollout
async def one_call_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """One LLM call through the proxy (joined to its record by response id); a task whose ``hold_in`` lists this
    rollout's iteration (``it<N>``) then waits for ``HOLD["gate"]``."""
    llm = resources.llm
    assert llm is not None and llm.api_key
    ctx = agl.current_rollout()
    assert ctx is not None
    request = {"model": llm.model, "messages": [{"role": "user", "content": task["q"]}], **llm.sampling_parameters}
    await chat_through_proxy(llm.api_key, request)
    if ctx.rollout_id.split("-", 1)[0] in task.get("hold_in", ()):
        await HOLD["gate"].wait()
    return 1.0 if ctx.rollout_id.endswith("-s0") else 0.0


class StaleEngine(ScriptedServerEngine):
    """Serves during its update. The scripted server reports ``server.model_version`` on every answer; with
    ``lagging`` a sync leaves it where it was (a backend that never loaded the new weights). `update` records the
    batch with the loop's version; while ``gate`` is clear it waits for it (after setting ``updating``)."""

    serves_during_update = True

    def __init__(self, lagging: bool = False) -> None:
        super().__init__()
        self.lagging = lagging
        self.version = 0
        self.updates: list[tuple[int, agl.TrainingBatch]] = []
        self.updating = asyncio.Event()
        self.gate = threading.Event()
        self._loop = asyncio.get_running_loop()

    async def start_servers(self, model_version: int) -> list[str]:
        self.version = model_version
        return await super().start_servers(model_version)

    def update(self, batch: agl.TrainingBatch) -> dict[str, float]:
        self._loop.call_soon_threadsafe(self.updating.set)
        if not self.gate.wait(timeout=300):  # a deadlock guard, not a timing condition
            raise RuntimeError("the test never opened the update's gate")
        self.updates.append((self.version, batch))
        return {}

    async def sync_weights(self, version: int) -> None:
        self.version = version
        if not self.lagging:
            self.server.model_version = version


def _config(tmp_path: Path, **overrides: Any) -> LoopConfig:
    settings: dict[str, Any] = {
        "output_dir": tmp_path,
        "model_name": "toy",
        "tasks_per_iteration": 1,
        "samples_per_task": 2,
        "task_order": "cycle",
        "max_tokens": 16,
        "checkpoint_every": 0,
        "rollout_timeout_s": 600,
        "proxy": ProxySettings(record="sync"),
    }
    return LoopConfig(**{**settings, **overrides})


def _runner(store: agl.LightningStore) -> tuple[agl.Runner, asyncio.Task[None]]:
    runner = agl.Runner(one_call_agent, store=store, n_workers=8, worker_mode="async", poll_interval=0.01)
    return runner, asyncio.create_task(runner.arun())


async def _iteration_rollouts(store: agl.LightningStore, iteration: int) -> list[agl.Rollout]:
    return [r for r in await store.query_rollouts() if r.rollout_id.startswith(f"it{iteration}-")]


def _lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


async def test_k3_admits_rollouts_three_iterations_ahead_and_trains_nothing_older(tmp_path: Path) -> None:
    store = agl.MemoryStore()
    engine = StaleEngine()
    loop = RLLoop(_config(tmp_path, max_staleness=3, iterations=6), engine)
    runner, runner_task = _runner(store)
    run = asyncio.create_task(loop.run(store, [{"q": "a"}]))
    try:
        await asyncio.wait_for(engine.updating.wait(), 120)
        # Iteration 0's update runs; iterations 1-3 were enqueued at version 0 and are generated meanwhile: wait
        # until iteration 3's finished, so its samples are exactly 3 versions old when trained.
        while [r.status for r in await _iteration_rollouts(store, 3)] != ["succeeded"] * 2:
            await asyncio.sleep(0.05)
        assert await _iteration_rollouts(store, 4) == []  # admission: not four iterations ahead
        engine.gate.set()
        await asyncio.wait_for(run, 120)
    finally:
        engine.gate.set()
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await loop.stop()

    assert [version for version, _ in engine.updates] == [0, 1, 2, 3, 4, 5]
    for version, batch in engine.updates:
        assert len(batch.samples) == 2
        assert all(s.model_version is not None and version - s.model_version <= 3 for s in batch.samples)
    assert {s.model_version for s in engine.updates[3][1].samples} == {0}  # iteration 3: 3 versions old
    # Each iteration's rollouts were pinned to the version current when they were admitted: 3 behind at most.
    for iteration in range(6):
        for rollout in await _iteration_rollouts(store, iteration):
            assert rollout.resources_id is not None
            assert rollout.resources_id.startswith(f"policy-v{max(0, iteration - 3)}-sample-")
    train = [line for line in _lines(tmp_path) if line["kind"] == "train"]
    assert train[3]["metrics"]["version_lag_3"] == 2.0 and train[3]["metrics"]["staleness_max"] == 3.0
    assert all(line["metrics"]["samples_dropped_stale"] == 0.0 for line in train)
    assert await store.query_rollouts(status=["queuing", "running"]) == []


async def test_samples_older_than_k_are_dropped_and_counted_never_trained(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = agl.MemoryStore()
    engine = StaleEngine(lagging=True)  # answers keep saying version 0 while the loop's version grows
    engine.gate.set()
    loop = RLLoop(_config(tmp_path, max_staleness=1, iterations=3), engine)
    runner, runner_task = _runner(store)
    try:
        with caplog.at_level(logging.WARNING, logger="agentlightning.loop._staleness"):
            await asyncio.wait_for(loop.run(store, [{"q": "a"}]), 120)
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await loop.stop()
    # iterations 0 and 1 train (lag 0, then 1); at version 2 the samples of version 0 are 2 old: dropped, counted
    assert [version for version, _ in engine.updates] == [0, 1]
    third = [line for line in _lines(tmp_path) if line["kind"] == "train"][2]["metrics"]
    assert third["samples_dropped_stale"] == 2.0 and third["version_lag_2"] == 2.0 and third["skipped_update"] == 1.0
    assert "2 of 2 sample(s) not trained at version 2 (max_staleness=1): generated more than max_staleness" in (
        caplog.text
    )


async def test_a_stop_during_an_overlapped_update_leaves_nothing_running(tmp_path: Path) -> None:
    HOLD["gate"] = asyncio.Event()
    store = agl.MemoryStore()
    engine = StaleEngine()
    # iterations 1 and 2 were admitted during iteration 0's update; their agents hang: the stop cancels them
    loop = RLLoop(_config(tmp_path, max_staleness=2, iterations=5), engine)
    runner, runner_task = _runner(store)
    run = asyncio.create_task(loop.run(store, [{"q": "a", "hold_in": ["it1", "it2"]}]))
    try:
        await asyncio.wait_for(engine.updating.wait(), 120)
        while [r.status for i in (1, 2) for r in await _iteration_rollouts(store, i)] != ["running"] * 4:
            await asyncio.sleep(0.05)
        run.cancel()  # what Ctrl-C does to `agl train`'s main task
        with pytest.raises(asyncio.CancelledError):
            await run
        await loop.stop()
    finally:
        engine.gate.set()  # the update's thread ends (its result is not kept)
        HOLD["gate"].set()
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await loop.stop()
    assert await store.query_rollouts(status=["queuing", "running"]) == []
    for iteration in (1, 2):
        assert {r.status for r in await _iteration_rollouts(store, iteration)} == {"cancelled"}
    # the servers stopped, and the interrupted update was never synced nor published
    assert engine.stopped and engine.version == 0 and loop.model_version == 0 and loop.history == []
    assert (tmp_path / "checkpoint").is_dir()  # the last finished state is saved on the way out


def _sample(version: int | None, logprobs: bool = True) -> agl.TrainingSample:
    return agl.TrainingSample(
        prompt_token_ids=[1],
        response_token_ids=[2, 3],
        response_mask=[1, 1],
        response_logprobs=[-0.5, -0.25] if logprobs else None,
        credit=1.0,
        advantage=0.5,
        group_id="g",
        rollout_id=f"r{version}-{logprobs}",
        attempt_id="a",
        step_index=0,
        model_version=version,
    )


def test_admission_at_training_time_counts_each_refusal(caplog: pytest.LogCaptureFixture) -> None:
    samples = [_sample(5), _sample(4), _sample(3), _sample(2), _sample(None), _sample(5, logprobs=False)]
    batch = agl.TrainingBatch(samples=samples, metrics={"n_samples": 6.0})
    with caplog.at_level(logging.WARNING, logger="agentlightning.loop._staleness"):
        admitted = admit_samples(batch, current_version=5, max_staleness=2)
    assert [s.rollout_id for s in admitted.samples] == ["r5-True", "r4-True", "r3-True"]
    assert admitted.metrics == {
        "n_samples": 6.0,
        "version_lag_0": 2.0,
        "version_lag_1": 1.0,
        "version_lag_2": 1.0,
        "version_lag_3": 1.0,
        "samples_dropped_stale": 1.0,
        "samples_refused_no_version": 1.0,
        "samples_refused_no_logprobs": 1.0,
    }
    assert len(batch.samples) == 6  # the batch given is left alone
    assert "without behaviour log-probs (the importance correction needs" in caplog.text
    # synchronous training: nothing is importance-corrected, so neither an unknown version nor missing log-probs
    # is refused; a sample older than the (zero) bound still is
    sync = admit_samples(batch, current_version=5, max_staleness=0)
    assert [s.rollout_id for s in sync.samples] == ["r5-True", "rNone-True", "r5-False"]
    assert version_lag_histogram([_sample(None)], 3) == {}


def test_max_staleness_takes_any_k_and_an_engine_may_cap_it(tmp_path: Path) -> None:
    assert _config(tmp_path, max_staleness=8).max_staleness == 8
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        _config(tmp_path, max_staleness=-1)

    class OneStep(Engine):
        serves_during_update = True
        max_staleness_supported = 1

        async def start_servers(self, model_version: int) -> list[str]:
            return []

        def update(self, batch: agl.TrainingBatch) -> dict[str, float]:
            return {}

        async def sync_weights(self, version: int) -> None:
            return None

    RLLoop(_config(tmp_path, max_staleness=1), OneStep())
    with pytest.raises(ValueError, match=r"max_staleness=2: OneStep supports at most 1"):
        RLLoop(_config(tmp_path, max_staleness=2), OneStep())


def test_agl_train_takes_any_bound_and_refuses_a_negative_one(capsys: pytest.CaptureFixture[str]) -> None:
    from agentlightning.cli import train_parser

    parser = train_parser()
    shared = ["--agent", "calc_agent:calc_agent", "--model", "ckpt", "--tasks", "train.jsonl"]
    assert parser.parse_args([*shared, "--max-staleness", "4"]).max_staleness == 4
    assert parser.parse_args(shared).max_staleness == 0  # one-machine default: synchronous
    for bad, why in (("-1", "-1 is negative (use 0 or more)"), ("two", "'two' is not a whole number")):
        with pytest.raises(SystemExit):
            parser.parse_args([*shared, "--max-staleness", bad])
        assert f"argument --max-staleness: {why}" in capsys.readouterr().err


def test_a_policy_that_did_not_train_keeps_its_version() -> None:
    """With several policies, a policy without samples keeps its weights: its calls at an older loop version are as
    fresh as ever (a synchronous run once dropped the rewriter's samples because the writer alone had trained)."""
    writer = _sample(1).model_copy(update={"policy": "writer", "rollout_id": "w"})
    rewriter = _sample(0).model_copy(update={"policy": "rewriter", "rollout_id": "rw"})
    stale_writer = _sample(0).model_copy(update={"policy": "writer", "rollout_id": "w-old"})
    batch = agl.TrainingBatch(samples=[writer, rewriter, stale_writer], metrics={})
    admitted = admit_samples(batch, current_version=1, max_staleness=0, policy_versions={"writer": 1, "rewriter": 0})
    assert [s.rollout_id for s in admitted.samples] == ["w", "rw"]
    assert admitted.metrics["samples_dropped_stale"] == 1.0 and admitted.metrics["version_lag_0"] == 2.0
    # without the policies' versions every sample is measured against the loop's: the rewriter's would be dropped
    assert [s.rollout_id for s in admit_samples(batch, 1, 0).samples] == ["w"]
