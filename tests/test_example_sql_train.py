"""examples/sql through the whole stack: two RL iterations of train.py on the shipped checkpoint.

runner processes (LangGraph graph, LangChain adapter) → LLM proxy → local backend → SQLite store → transitions of the
writer and rewriter only → LightningRL credit (GRPO) → PPO → a new model version served.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")

import agentlightning as agl
from agentlightning import TrainingBatch, TrainingSample
from agentlightning.credit import build_batch_from_results
from agentlightning.transitions import TransitionConfig, results_from_store

ROOT = Path(__file__).resolve().parent.parent
SQL = ROOT / "examples" / "sql"
_spec = importlib.util.spec_from_file_location("sql_train", SQL / "train.py")  # "train" is a common module name
assert _spec is not None and _spec.loader is not None
sql_train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sql_train)

needs_checkpoint = pytest.mark.skipif(
    not (SQL / "checkpoint" / "config.json").is_file(),
    reason="examples/sql/checkpoint is not shipped yet (python examples/sql/sql_model.py warmstart --out ...)",
)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SQL / "train.py"), "--quiet", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)


async def _stored(db: Path) -> tuple[set[int | None], list[Any], dict[str, int]]:
    """Model versions that served calls, the training rollouts' results (writer + rewriter), agents of all calls."""
    store = agl.SqliteStore(db)
    try:
        rollouts = await store.query_rollouts(status=["succeeded"])
        versions: set[int | None] = set()
        for rollout in rollouts:
            versions |= {call.model_version for call in await store.query_llm_calls(rollout.rollout_id)}
        first = [r.rollout_id for r in rollouts if r.rollout_id.startswith("it0-")]
        trained = await results_from_store(store, first, TransitionConfig(agent_filter=("writer", "rewriter")))
        every = await results_from_store(store, first, TransitionConfig())
        agents = Counter(t.agent_name or "" for result in every for t in result.transitions)
        return versions, trained, dict(agents)
    finally:
        await store.close()


@needs_checkpoint
def test_two_iterations_train_only_the_writer_and_rewriter_and_serve_new_versions(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = _run(
        "--iterations", "2", "--tasks-per-iteration", "4", "--samples-per-task", "4", "--eval-size", "4",
        "--workers", "16", "--runners", "1", "--minutes", "600", "--output", str(out),
        "--rollout-timeout", "3600",  # the run ends after 2 iterations however slow the machine; none is cut off
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["iterations"] == 2
    trained = summary["trained_samples"]
    # groups whose samples all got the same reward carry no advantage and are dropped, the others are trained
    assert trained["checker"] == 0 and trained["writer"] > 0
    assert summary["filtered_calls"] >= 2 * 16  # every rollout's checker calls were left out of the batch
    assert (out / "reward_curve.png").stat().st_size > 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["eval", "train", "train", "eval"]
    # an iteration whose groups all got one reward each has no sample and skips its update (no counts then)
    trains = [line["metrics"] for line in lines if line["kind"] == "train"]
    assert all(m.get("skipped_update") == 1 or m["samples_checker"] == 0 for m in trains), trains

    updates = sum(m.get("skipped_update") != 1 for m in trains)
    assert updates >= 1

    versions, results, agents = asyncio.run(_stored(out / "store.db"))
    # with both updates, 0: evaluation before RL and iteration 1; 1: iteration 2; 2: evaluation after RL
    assert versions == set(range(updates + 1)), (versions, trains)
    # The checker ran on the same model (its calls are in the store) but only writer + rewriter are transitions
    assert agents["writer"] == 16 and agents["checker"] >= 16, agents
    assert {t.agent_name for r in results for t in r.transitions} <= {"writer", "rewriter"}
    # LightningRL credit: every trained call of a rollout gets its execution-match reward; GRPO centres each group
    batch = build_batch_from_results(results, "identical", "grpo", None)
    assert {s.agent_name for s in batch.samples} <= {"writer", "rewriter"}
    for result in results:
        credits = {s.credit for s in batch.samples if s.rollout_id == result.rollout_id}
        assert credits <= {result.final_reward}
    for group in {s.group_id for s in batch.samples}:
        rewards = {r.rollout_id: r.final_reward for r in results}
        members = [s for s in batch.samples if s.group_id == group]
        if len({rewards[s.rollout_id] for s in members}) > 1:  # winners above losers
            best = max(members, key=lambda s: s.credit)
            worst = min(members, key=lambda s: s.credit)
            assert best.advantage > 0 > worst.advantage


def _sample(agent: str) -> TrainingSample:
    return TrainingSample(
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_mask=[1],
        credit=1.0,
        advantage=1.0,
        group_id="g",
        rollout_id="r",
        attempt_id="a",
        step_index=0,
        agent_name=agent,
    )


@needs_checkpoint
def test_a_checker_sample_in_the_batch_stops_the_update(tmp_path: Path) -> None:
    args = sql_train.parse_args(["--output", str(tmp_path)])
    trainer = sql_train.make_trainer(sql_train.build_config(args))
    batch = TrainingBatch(samples=[_sample("writer"), _sample("checker")])
    with pytest.raises(RuntimeError, match=r"agent filter let samples of \['checker'\] into the batch"):
        trainer.engine.update(batch)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--minutes", "0"], "--minutes must be positive"),
        (["--runners", "0"], "must be at least 1"),
        (["--model-dir", "nowhere"], "is not a model folder"),
        (["--vllm-url", "http://127.0.0.1:9/v1"], "--vllm-url needs --backend vllm"),
    ],
)
def test_bad_settings_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert sql_train.main(args) == 2
    assert message in capsys.readouterr().err


@needs_checkpoint
def test_backend_vllm_is_the_engine_s_vllm_serving_with_the_same_agent_filter(tmp_path: Path) -> None:
    """``--backend vllm`` (the real run: examples/sql/README.md) sets the engine's vLLM serving; the agent filter,
    the tool parser and the model are the embedded backend's."""
    local = sql_train.build_config(sql_train.parse_args(["--output", str(tmp_path)]))
    argv = ["--output", str(tmp_path), "--backend", "vllm", "--vllm-url", "http://127.0.0.1:8100/v1"]
    config = sql_train.build_config(sql_train.parse_args(argv))
    assert (local.backend, config.backend) == ("local", "vllm")
    assert config.vllm.url == "http://127.0.0.1:8100/v1"
    for same in ("agent_filter", "tool_parser", "model_dir", "model_name", "temperature", "max_tokens"):
        assert getattr(config, same) == getattr(local, same), same


def test_the_gpu_recipe_builds_a_verl_config_with_the_same_agent_filter() -> None:
    pytest.importorskip("agentlightning_verl")
    sys.path.insert(0, str(SQL))
    try:
        from sql_gpu_config import CONFIG, LOOP  # pyright: ignore[reportMissingImports]
    finally:
        sys.path.remove(str(SQL))
    verl = CONFIG.to_verl_config()
    assert verl.actor_rollout_ref.model.path == "meta-llama/Llama-3.2-3B-Instruct"
    assert LOOP.agent_filter == ("writer", "rewriter") and LOOP.samples_per_task == 8 and LOOP.estimator == "grpo"
