"""One real verl actor update (TrainingWorker + FSDP2 + ppo_loss) on CPU, fed by to_data_proto (fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("verl_actor_step.py")


def run_step(device: str, *extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", device, *extra],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.slow
def test_verl_actor_update_step_on_cpu() -> None:
    result = run_step("cpu")
    metrics = result["metrics"]
    # verl's forward on our layout (left padding, position ids, response slice) equals a plain transformers forward
    assert result["max_abs_logprob_diff_vs_hf"] < 1e-4
    # on-policy batch: ratio 1, nothing clipped, loss = -token_mean(advantages) computed from our tensors
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert abs(metrics["actor/ppo_kl"]) < 1e-6
    assert metrics["actor/pg_loss"] == pytest.approx(result["expected_pg_loss"], abs=1e-5)
    assert metrics["grad_norm"] > 0
    # a policy-gradient step raises sum(A * log p) over trained tokens; padding log-probs stay masked to 0
    assert result["objective_after"] > result["objective_before"]
    assert result["logprob_change_on_padding"] == 0.0
    assert result["n_samples"] == 4
    # VerlEngine.update: old log-probs recomputed by the actor (so on-policy again), GRPO advantages by group
    algo = result["algorithm_update_metrics"]
    assert algo["batch/samples"] == 4.0
    assert algo["batch/reward_mean"] == pytest.approx(0.5)
    assert algo["actor/pg_clipfrac"] == 0.0
    assert algo["actor/grad_norm"] > 0
