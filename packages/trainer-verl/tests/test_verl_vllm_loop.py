"""verl's own vLLM rollout (`VLLMReplicaServing`) end to end under a local Ray cluster, on the CPU build of vLLM.

The run happens in a fresh process (`verl_vllm_loop.py`) with the interpreter of the environment that holds verl,
vLLM's CPU build and this project together (``python3 scripts/dev.py verl-vllm`` makes it; CI does). Skipped, with
that command, where it is missing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("verl_vllm_loop.py")
VENV_ENV = "AGL_VERL_VLLM_VENV"
LOGPROB_TOLERANCE = 1e-4
"""vLLM's float32 CPU kernels vs transformers' float32 forward pass on the same weights (measured: ~1e-6)."""


def verl_vllm_python() -> Path:
    venv = Path(os.environ.get(VENV_ENV) or ROOT / ".venv-verl-vllm")
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no verl + vLLM CPU environment at {venv}: python3 scripts/dev.py verl-vllm")
    return python


def run_script(workdir: Path, *args: str, timeout: float = 1500) -> dict[str, Any]:
    """Run `verl_vllm_loop.py` with the verl + vLLM interpreter; returns its ``RESULT`` JSON."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONPATH": os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src"))),
    }
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        [str(verl_vllm_python()), str(SCRIPT), "--device", "cpu", "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_script(tmp_path_factory.mktemp("verl-vllm"), "--phases", "grpo,ppo,late")


def check_syncs(phase: dict[str, Any], versions: list[int]) -> None:
    """After every sync: vLLM received exactly the actor's weights, and computes the actor's log-probs."""
    syncs = phase["syncs"]
    assert [s["version"] for s in syncs] == versions
    for sync in syncs:
        assert sync["received"] == [sync["actor"]], sync  # one vLLM worker, the actor's bytes, tensor by tensor
        assert sync["probe_logprob_diff_max"] < LOGPROB_TOLERANCE, sync
    assert len({s["actor"] for s in syncs}) == len(syncs)  # every update changed the weights


def check_step(metrics: dict[str, float], *, critic: bool) -> None:
    for key in ("actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "batch/reward_mean"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["actor/grad_norm"] > 0
    assert metrics["batch/samples"] == 4.0  # 2 tasks x 2 rollouts, one LLM call each
    # the log-probs vLLM returned for the tokens it sampled equal the actor's recomputed ones
    assert metrics["rollout/logprob_diff_max"] < LOGPROB_TOLERANCE
    assert ("critic/vf_loss" in metrics) == critic


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_grpo_two_steps_through_verls_vllm_rollout(result: dict[str, Any]) -> None:
    grpo = result["grpo"]
    assert grpo["steps"] == 2 and grpo["model_version"] == 2
    check_syncs(grpo, [0, 1, 2])
    assert grpo["syncs"][0]["actor"] == result["initial_checksum"]  # version 0: the model folder's weights
    assert grpo["call_versions"] == {"it0": [0], "it1": [1]}  # step 1 served by version 0, step 2 by version 1
    assert grpo["calls_per_step"] == {"it0": 4, "it1": 4}
    for metrics in grpo["history"]:
        check_step(metrics, critic=False)
    # vLLM's log-probs reached the batch through the proxy (the update's comparison above is not vacuous)
    served = grpo["served_logprobs"]
    assert len(served) == sum(m["batch/response_tokens"] for m in grpo["history"])  # one per trained token
    assert all(x <= 0 for x in served) and any(x < 0 for x in served)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ppo_with_critic_checkpoint_and_resume_through_vllm(result: dict[str, Any]) -> None:
    first, resumed = result["ppo_first"], result["ppo_resumed"]
    assert first["steps"] == 1 and first["model_version"] == 1
    check_syncs(first, [0, 1])
    check_step(first["history"][0], critic=True)
    assert result["after_reset_checksum"] == result["initial_checksum"]  # rebuilt workers: the folder's weights
    check_syncs(resumed, [1, 2])
    assert resumed["syncs"][0]["actor"] == first["syncs"][1]["actor"]  # the checkpoint's weights, served as v1
    assert resumed["steps"] == 2 and resumed["history"][0]["iteration"] == 2
    check_step(resumed["history"][0], critic=True)
    assert resumed["call_versions"]["it1"] == [1]
    files = set(result["checkpoint_files"])
    for part in ("actor", "critic"):
        assert f"verl/{part}/model_world_size_1_rank_0.pt" in files


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_late_rollouts_leave_no_request_in_vllm_when_the_update_starts(result: dict[str, Any]) -> None:
    late = result["late"]
    assert late["late_status"] == "cancelled" and late["late_calls_started"] >= 1
    assert late["steps"] == 1 and late["history"][0]["batch/samples"] >= 1.0
    # verl's abort of every vLLM request ran before the update: nothing was generating when it started
    assert late["requests_at_release"] == [0]
