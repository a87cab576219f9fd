"""The RAG example's recipe through the whole stack: two RL iterations of examples/rag/train.py.

runner process (Agents SDK + its adapter) → LLM proxy → local backend serving the shipped checkpoint → SQLite
store → trajectory transitions → LightningRL credit (GRPO) → PPO → a new model version served back.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("agents")

import agentlightning as agl
from agentlightning.credit import CreditConfig, build_batch_from_results
from agentlightning.transitions import TransitionConfig, results_from_store

ROOT = Path(__file__).resolve().parent.parent
RAG = ROOT / "examples" / "rag"


def _train(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(RAG / "train.py"), "--quiet", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def test_two_iterations_train_on_the_agents_searches_and_serve_new_versions(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = _train(
        "--iterations", "2", "--tasks-per-iteration", "2", "--samples-per-task", "4", "--eval-size", "3",
        "--workers", "8", "--minutes", "600", "--output", str(out), "--keep-equal-groups",
        # however slow the machine: the run ends after 2 iterations and waits for every rollout
        "--rollout-timeout", "3600",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["iterations"] == 2 and summary["eval_tasks"] == 3
    for key in ("reward", "searches", "hop1_hit", "hop2_hit", "all_hops_hit"):
        assert 0 <= summary[f"{key}_before"] <= (2 if key == "searches" else 1)
    assert (out / "reward_curve.png").stat().st_size > 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["eval", "eval", "train", "train", "eval", "eval"]
    for line in lines:  # every line carries the searches of its rollouts
        assert {"searches", "hop1_hit", "hop2_hit", "all_hops_hit"} <= set(line["metrics"])

    async def inspect() -> tuple[dict[str, list[Any]], set[int | None]]:
        store = agl.SqliteStore(out / "store.db")
        try:
            rollouts = await store.query_rollouts(status=["succeeded"])
            by_iteration: dict[str, list[Any]] = defaultdict(list)
            versions: set[int | None] = set()
            for rollout in rollouts:
                by_iteration[rollout.rollout_id.split("-")[0]].append(rollout.rollout_id)
                versions |= {call.model_version for call in await store.query_llm_calls(rollout.rollout_id)}
            config = TransitionConfig(mode="trajectory")
            results = {it: await results_from_store(store, ids, config) for it, ids in by_iteration.items()}
            return results, versions
        finally:
            await store.close()

    results, versions = asyncio.run(inspect())
    # the backend served version 0 (evaluation before, iteration 1), 1 (iteration 2) and 2 (evaluation after)
    assert versions == {0, 1, 2}, versions
    first = results["it0"]
    assert len(first) == 8
    for result in first:
        # one episode of the agent = one trajectory sample: its calls extend one another
        (transition,) = result.transitions
        assert transition.agent_name == "researcher" and transition.model_version == 0
        assert transition.prompt_token_ids and transition.response_token_ids
    batch = build_batch_from_results(first, "identical", "grpo", CreditConfig(drop_equal_groups=False))
    assert batch.metrics["n_samples"] == lines[2]["metrics"]["n_samples"] == 8
    rewards = {r.rollout_id: r.final_reward for r in first}
    groups: dict[str, list[float]] = defaultdict(list)
    for sample in batch.samples:
        assert sample.credit == rewards[sample.rollout_id]  # identical credit: the episode's F1
        groups[sample.group_id].append(sample.advantage)
    assert len(groups) == 2 and all(abs(sum(advantages)) < 1e-6 for advantages in groups.values())  # GRPO


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-dir", "/nonexistent/model"], "does not exist"),
        (["--minutes", "0"], "--minutes"),
        (["--eval-size", "0"], "--eval-size"),
        (["eval", "--base-url", "http://127.0.0.1:9/v1"], "needs --model"),
    ],
)
def test_train_refuses_bad_settings_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], example_script: Any
) -> None:
    assert example_script("rag", "train").main(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1


def test_train_names_the_bad_line_of_a_task_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], example_script: Any
) -> None:
    for name in ("corpus.jsonl", "train.jsonl"):
        (tmp_path / name).write_text((RAG / "data" / name).read_text())
    (tmp_path / "val.jsonl").write_text('{"question": "Where?", "answer": "Kelb", "gold_titles": ["Kelb"]}\n{oops\n')
    assert example_script("rag", "train").main(["--data", str(tmp_path)]) == 2
    assert f"{tmp_path / 'val.jsonl'}:2: not valid JSON" in capsys.readouterr().err
