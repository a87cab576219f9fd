"""`TorchTrainer` with a staleness bound of 2: rollouts run during updates, the update is importance-corrected from
the behaviour log-probs `LocalBackend` recorded, and every iteration's metrics say how stale and how corrected."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import agentlightning as agl
from agentlightning.testing import chat_through_proxy
from agentlightning_torch import TorchTrainer, TorchTrainerConfig
from agentlightning_torch.testing import make_tiny_chat_model


@agl.rollout
async def ask_once(task: dict[str, Any], resources: agl.Resources) -> float:
    """One chat call through the trainer's proxy; the first rollout of each group is rewarded."""
    llm = resources.llm
    assert llm is not None and llm.api_key
    ctx = agl.current_rollout()
    assert ctx is not None
    request = {"model": llm.model, "messages": [{"role": "user", "content": task["q"]}], **llm.sampling_parameters}
    await chat_through_proxy(llm.api_key, request)
    return 1.0 if ctx.rollout_id.endswith("-s0") else 0.0


async def test_k2_training_reports_lags_and_importance_ratios(tmp_path: Path) -> None:
    make_tiny_chat_model(tmp_path / "model")
    config = TorchTrainerConfig(
        model_dir=tmp_path / "model",
        output_dir=tmp_path / "run",
        iterations=3,
        tasks_per_iteration=2,
        samples_per_task=2,
        max_tokens=4,
        max_staleness=2,
        checkpoint_every=0,
    )
    trainer = TorchTrainer(config)
    store = agl.MemoryStore()
    runner = agl.Runner(ask_once, store=store, n_workers=4, worker_mode="async", poll_interval=0.01)
    running = asyncio.create_task(runner.arun())
    try:
        await asyncio.wait_for(trainer.run(store, [{"q": "Q:1+2="}, {"q": "Q:3+4="}]), 600)
    finally:
        runner.stop()
        await asyncio.wait_for(running, 60)
        await trainer.stop()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [line["metrics"] for line in lines if line["kind"] == "train"]
    assert len(train) == 3 and trainer.model_version == 3
    for metrics in train:
        # every sample was trained: known version, within the bound, with the backend's behaviour log-probs
        assert metrics["samples_dropped_stale"] == metrics["samples_refused_no_logprobs"] == 0.0
        assert metrics["samples_refused_no_version"] == 0.0 and metrics["staleness_max"] <= 2.0
        lags = {int(key.rsplit("_", 1)[1]): count for key, count in metrics.items() if key.startswith("version_lag_")}
        assert sum(lags.values()) == metrics["n_samples"] == 4.0 and max(lags) <= 2
        assert math.isfinite(metrics["is_ratio_mean"]) and metrics["is_ratio_max"] >= metrics["is_ratio_mean"] > 0
        assert 0.0 <= metrics["is_truncated_fraction"] <= 1.0
    # the first batch came from the weights being updated: the backend's log-probs are the trainer's own
    assert train[0]["version_lag_0"] == 4.0 and abs(train[0]["is_ratio_mean"] - 1.0) < 0.05
