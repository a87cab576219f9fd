"""The quickstart trained through real vLLM (``examples/calc/train.py --backend vllm``), at toy size.

The full run (10 minutes of RL, the README's figures) is measured by hand; here two iterations check the path end to
end: the trainer launches vLLM with the example's ``CALC(...)`` tool-parser plugin, the LangGraph agent's tool calls
are parsed by vLLM, every weight sync is verified by log-probs, each recorded call carries the version that served
it, and the run ends with the same JSON line as the other backends.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")

from agentlightning import SqliteStore

ROOT = Path(__file__).resolve().parent.parent


def _needs_vllm() -> None:
    """Fail (not skip) without vLLM: `python3 scripts/dev.py test` installs it."""
    from agentlightning_torch import VLLMNotInstalledError, find_vllm_python

    try:
        find_vllm_python()
    except VLLMNotInstalledError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.mark.timeout(1200)  # vLLM's CPU start (~100 s, minutes on a loaded 2-core machine) plus two iterations
def test_calc_example_trains_through_vllm_for_two_iterations(tmp_path: Path) -> None:
    _needs_vllm()
    out = tmp_path / "run"
    cmd = [
        sys.executable, str(ROOT / "examples" / "calc" / "train.py"), "--backend", "vllm", "--iterations", "2",
        "--minutes", "600", "--tasks-per-iteration", "4", "--samples-per-task", "4", "--workers", "16",
        "--runners", "1", "--eval-size", "8", "--output", str(out), "--quiet", "--no-dashboard",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1100, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["backend"] == "vllm" and summary["iterations"] == 2
    assert {"reward_before", "reward_after", "greedy_before", "greedy_after", "rl_seconds"} <= set(summary)
    reports = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in reports if r["kind"] == "train"]
    assert [r["model_version"] for r in train] == [1, 2]
    for report in train:  # each sync verified against the trainer's weights (tolerance 1e-3)
        assert report["metrics"]["vllm_sync_max_logprob_diff"] <= 1e-3
    versions = asyncio.run(_call_versions(out / "store.db"))
    assert versions == {0, 1, 2}  # before RL + iteration 1, iteration 2, the evaluation after RL
    # vLLM parsed CALC(...) as a tool call: the agent used its calculator in some rollouts
    assert max(r["multi_call_rate"] for r in train) > 0


async def _call_versions(path: Path) -> set[int | None]:
    """Model versions of every stored LLM call (read through the store: calls are stored compactly, not as JSON)."""
    store = SqliteStore(path)
    try:
        versions: set[int | None] = set()
        for rollout in await store.query_rollouts():
            versions |= {call.model_version for call in await store.query_llm_calls(rollout.rollout_id)}
        return versions
    finally:
        await store.close()


@pytest.mark.timeout(1200)
def test_killed_trainer_leaves_no_vllm_behind(tmp_path: Path) -> None:
    """``kill -9`` of ``train.py --backend vllm`` after its first iteration: vLLM's server, engine core and workers
    (and the runners) end too; the engine starts vLLM from a worker thread, under a guard that watches its lifeline."""
    import os
    import signal

    import psutil

    from agentlightning.testing import wait_until

    _needs_vllm()
    out = tmp_path / "run"
    cmd = [
        sys.executable, str(ROOT / "examples" / "calc" / "train.py"), "--backend", "vllm", "--iterations", "1000",
        "--minutes", "600", "--tasks-per-iteration", "2", "--samples-per-task", "4", "--workers", "8",
        "--runners", "1", "--eval-size", "4", "--output", str(out), "--quiet", "--no-dashboard",
    ]  # fmt: skip
    with (tmp_path / "stderr.txt").open("w") as stderr:
        trainer = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    metrics = out / "metrics.jsonl"

    def trained_once() -> bool:
        assert trainer.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
        return metrics.exists() and '"kind": "train"' in metrics.read_text()

    try:
        wait_until(trained_once, "the first iteration", timeout=1000)
        children = psutil.Process(trainer.pid).children(recursive=True)
        assert any("vllm" in " ".join(child.cmdline()) for child in children)
    finally:
        trainer.kill()  # kill -9: the trainer cleans up nothing itself
        trainer.wait()

    def gone(process: psutil.Process) -> bool:
        try:
            return process.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    try:  # each child ends on its own lifeline; the bound only turns a hang into a failure
        wait_until(lambda: all(gone(child) for child in children), "the trainer's children to end", timeout=300)
    finally:
        for child in children:
            if not gone(child):
                os.kill(child.pid, signal.SIGKILL)
