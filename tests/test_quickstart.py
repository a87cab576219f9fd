"""End to end through the whole stack: the quickstart's LangGraph agent trained by the torch trainer.

runner → LangChain adapter → LLM proxy → local backend → store → transitions → LightningRL → PPO → new version.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")

import torch
from transformers import AutoModelForCausalLM

import agentlightning as agl
import agentlightning_torch
from agentlightning_torch import TorchTrainer, TorchTrainerConfig
from agentlightning_torch.serving import _backend as backend_module

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
CHECKPOINT = CALC / "checkpoint"


def _run_quickstart(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(CALC / "train.py"), "--quiet", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def test_quickstart_small_run_trains_and_serves_new_versions(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = _run_quickstart(
        "--iterations", "2", "--tasks-per-iteration", "4", "--samples-per-task", "4", "--eval-size", "4",
        "--workers", "16", "--minutes", "600", "--output", str(out), "--transition-mode", "trajectory",
        "--eval-every", "1",
        # however slow the machine: the run ends after 2 iterations (not a time budget), and every rollout
        # finishes (none is cancelled as late); the subprocess timeout is only a safety net
        "--rollout-timeout", "3600", timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # A healthy run's log: no traceback, no warning (the calculator's results once grew past what str() converts
    # and the prompt past the model's context, and an agent of the runners' watched process lost its LLM spans)
    warnings = [line for line in done.stderr.splitlines() if "Traceback" in line or "WARNING" in line]
    assert not warnings, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {"reward_before", "reward_after", "greedy_before", "greedy_after", "rl_seconds", "iterations"}
    assert set(summary) >= expected | {"seconds", "best_iteration", "greedy_best"}
    assert summary["iterations"] == 2
    assert (out / "reward_curve.png").stat().st_size > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # --eval-every 1: a held-out point before RL, after each iteration (in the loop) and after RL (same weights)
    evals = [row for row in rows if row["kind"] == "eval"]
    assert [row["iteration"] for row in evals] == [0, 1, 2, 2]
    # checkpoint/best holds the first evaluation with the highest held-out accuracy (the quickstart's metric)
    scores = [row["metrics"]["accuracy"] for row in evals]
    best = evals[scores.index(max(scores))]
    assert [row for row in evals if row["metrics"].get("best")][-1] is best
    state = json.loads((out / "checkpoint" / "best" / "loop_state.json").read_text())
    assert state == {"iteration": best["iteration"], "model_version": best["model_version"]}
    assert summary["best_iteration"] == best["iteration"] and summary["greedy_best"] == round(max(scores), 4)
    assert summary["greedy_before"] == round(scores[0], 4) and summary["greedy_after"] == round(scores[-1], 4)
    train_rows = [row for row in rows if row["kind"] == "train"]
    for row in train_rows:
        metrics = row["metrics"]
        # trajectory mode: one sample per episode, unless a call's prompt did not extend the previous call's
        assert metrics["transitions"] == metrics["attempts"] + metrics["trajectory_breaks"]
        # what the backend did this iteration: admission groups, decode steps and the rows each decoded
        assert metrics["backend_batches"] >= 1 and metrics["backend_steps"] >= 1
        assert 1 <= metrics["backend_mean_rows"] <= 16 and 1 <= metrics["backend_mean_batch"] <= 16
        assert metrics["cpu_generating"] > 0  # the generation thread's CPU this iteration

    # The trained weights differ from the warm start they began from; the checkpoint is a plain transformers folder.
    trained = AutoModelForCausalLM.from_pretrained(out / "checkpoint")
    original = AutoModelForCausalLM.from_pretrained(CHECKPOINT)
    deltas = [(p1 - p0).abs().max().item() for p1, p0 in zip(trained.parameters(), original.parameters(), strict=True)]
    assert max(deltas) > 0

    # Every LLM call went through the proxy; after the updates, calls were served by newer model versions.
    async def served_versions() -> set[int | None]:
        store = agl.SqliteStore(out / "store.db")
        try:
            rollouts = await store.query_rollouts(status=["succeeded"])
            assert rollouts, "no rollout succeeded"
            versions: set[int | None] = set()
            for rollout in rollouts:
                versions |= {call.model_version for call in await store.query_llm_calls(rollout.rollout_id)}
            return versions
        finally:
            await store.close()

    # Exactly the versions the backend served: 0 (evaluation before RL and iteration 1), 1 (iteration 2) and 2
    # (evaluation after RL); never a resources version (each model version is published as two resources).
    versions = asyncio.run(served_versions())
    assert versions == {0, 1, 2}, versions


async def test_update_trains_on_exactly_the_token_ids_the_backend_generated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.insert(0, str(CALC))
    try:
        from calc_agent import calc_agent  # pyright: ignore[reportMissingImports]

        import agentlightning_langchain
    finally:
        sys.path.remove(str(CALC))

    generated: list[tuple[list[int], list[int]]] = []
    real_submit = backend_module.LocalBackend.submit

    def spying_submit(backend: Any, prompt_ids: list[int], *args: Any, **kwargs: Any) -> Any:
        future = real_submit(backend, prompt_ids, *args, **kwargs)
        future.add_done_callback(lambda done: generated.append((list(prompt_ids), list(done.result().token_ids))))
        return future

    monkeypatch.setattr(backend_module.LocalBackend, "submit", spying_submit)
    config = TorchTrainerConfig(
        model_dir=CHECKPOINT,
        tool_parser="calc",
        output_dir=tmp_path,
        tasks_per_iteration=4,
        samples_per_task=4,
        drop_equal_groups=False,
        rollout_timeout_s=3600,  # wait for every rollout, however slow the machine
    )
    trainer = TorchTrainer(config)
    batches: list[agl.TrainingBatch] = []
    real_update = trainer.engine.update

    def spying_update(batch: agl.TrainingBatch) -> dict[str, float]:
        batches.append(batch)
        return real_update(batch)

    monkeypatch.setattr(trainer.engine, "update", spying_update)
    before = [p.detach().clone() for p in trainer.engine.policy.parameters()]
    store = agl.MemoryStore()
    agentlightning_langchain.instrument()
    runner = agl.Runner(calc_agent, store=store, n_workers=16, worker_mode="async", poll_interval=0.02)
    runner_task = asyncio.create_task(runner.arun())
    try:
        await trainer.start(store)
        tasks = [json.loads(line) for line in (CALC / "data" / "train.jsonl").read_text().splitlines()[:50]]
        report = await trainer.train_iteration(store, tasks)
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await trainer.stop()
        agentlightning_langchain.uninstrument()

    assert report.finished == 16 and trainer.model_version == 1
    (batch,) = batches
    assert batch.samples, "the batch is empty"
    produced = {(tuple(p), tuple(r)) for p, r in generated}
    for sample in batch.samples:
        # The backend generated up to and including eos; the sample must be that exact pair, not a re-tokenization.
        assert (tuple(sample.prompt_token_ids), tuple(sample.response_token_ids)) in produced
        assert sample.model_version == 0  # generated by the initial weights
    assert batch.metrics["staleness_max"] == 0.0
    after = list(trainer.engine.policy.parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-dir", "/nonexistent/model"], "does not exist"),
        (["--lr", "-1"], "lr"),
        (["--threads", "0"], "--threads"),
        (["--minutes", "0"], "--minutes"),
        (["--transition-mode", "per_step"], "--transition-mode"),
        (["--max-staleness", "-1"], "--max-staleness"),
    ],
)
def test_quickstart_rejects_bad_settings_with_a_clear_message(args: list[str], message: str) -> None:
    done = _run_quickstart(*args, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_quickstart_rejects_a_task_file_that_does_not_parse(tmp_path: Path) -> None:
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"question": "Q:2*3+4=", "answer": 10}\n{"question": oops}\n')
    done = _run_quickstart("--train-tasks", str(bad), timeout=120)
    assert done.returncode == 2
    assert f"{bad}:2: not valid JSON" in done.stderr and "Traceback" not in done.stderr
    assert agentlightning_torch.__version__  # the package imported fine; only the input was rejected
