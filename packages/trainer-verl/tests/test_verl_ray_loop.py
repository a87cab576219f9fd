"""`VerlTrainer.run` on a local Ray cluster (CPU): GRPO and PPO-with-critic, weight sync, checkpoint + resume.

verl's actor and critic worker groups run as Ray actors on the CPU platform; rollouts are served by the embedded
torch backend (loaded from the same model folder) behind the LLM proxy, to runners with a plain OpenAI agent.
The run happens in a fresh process (`verl_ray_loop.py`); 3-6 minutes on two cores shared with other jobs, most of
it Ray and the worker process starting.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("ray")

SCRIPT = Path(__file__).with_name("verl_ray_loop.py")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("verl-ray")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def _check_syncs(phase: dict[str, Any], versions: list[int]) -> None:
    syncs = phase["syncs"]
    assert [s["version"] for s in syncs] == versions
    for sync in syncs:
        # what the server serves is bit for bit what verl's actor holds, under the version the loop gave it
        assert sync["served"] == sync["actor"], sync
        assert sync["served_version"] == sync["version"]
    # every update changed the weights
    assert len({s["actor"] for s in syncs}) == len(syncs)


def _check_step_metrics(metrics: dict[str, float], *, critic: bool) -> None:
    for key in ("actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "batch/reward_mean"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["actor/grad_norm"] > 0
    assert metrics["actor/entropy"] > 0
    assert metrics["batch/samples"] == 4.0  # 2 tasks x 2 rollouts, one LLM call each
    # the log-probs the server returned equal the actor's on the same tokens: it served the actor's weights
    assert metrics["rollout/logprob_diff_max"] < 1e-3
    if critic:
        for key in ("critic/vf_loss", "critic/grad_norm"):
            assert key in metrics and math.isfinite(metrics[key]), key
        assert metrics["critic/grad_norm"] > 0
    else:
        assert not any(k.startswith("critic/") for k in metrics)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the module fixture (one Ray run, up to 900 s on a busy machine) counts against this test
def test_grpo_two_steps_serve_the_new_version(result: dict[str, Any]) -> None:
    grpo = result["grpo"]
    assert grpo["steps"] == 2 and grpo["model_version"] == 2
    _check_syncs(grpo, [0, 1, 2])
    assert grpo["syncs"][0]["actor"] == result["initial_checksum"]  # version 0 = the model folder's weights
    # step 1's calls were served by version 0, step 2's by version 1
    assert grpo["call_versions"] == {"it0": [0], "it1": [1]}
    assert grpo["calls_per_step"] == {"it0": 4, "it1": 4}
    for metrics in grpo["history"]:
        _check_step_metrics(metrics, critic=False)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ppo_with_critic_checkpoint_resumes_into_step_two(result: dict[str, Any]) -> None:
    first, resumed = result["ppo_first"], result["ppo_resumed"]
    assert first["steps"] == 1 and first["model_version"] == 1
    _check_syncs(first, [0, 1])
    assert first["syncs"][0]["actor"] == result["initial_checksum"]
    _check_step_metrics(first["history"][0], critic=True)
    # the rebuilt workers held the initial weights; the checkpoint brought back step 1's, served as version 1
    assert result["after_reset_checksum"] == result["initial_checksum"]
    _check_syncs(resumed, [1, 2])
    assert resumed["syncs"][0]["actor"] == first["syncs"][1]["actor"]
    assert resumed["steps"] == 2 and resumed["model_version"] == 2 and len(resumed["history"]) == 1
    assert resumed["history"][0]["iteration"] == 2
    _check_step_metrics(resumed["history"][0], critic=True)
    assert resumed["call_versions"]["it1"] == [1]  # the resumed step's rollouts: version 1
    files = set(result["checkpoint_files"])
    assert "loop_state.json" in files
    for part in ("actor", "critic"):
        assert f"verl/{part}/model_world_size_1_rank_0.pt" in files
        assert f"verl/{part}/optim_world_size_1_rank_0.pt" in files
