"""The same verl actor step on CUDA (one GPU, no Ray, no vLLM). Skipped without CUDA (see conftest.py)."""

from __future__ import annotations

import pytest

from .test_verl_actor_update import run_step


@pytest.mark.gpu
def test_verl_actor_update_step_on_cuda() -> None:
    result = run_step(
        "cuda",
        "--hidden",
        "256",
        "--layers",
        "4",
        "--groups",
        "4",
        "--per-group",
        "4",
        "--prompt-len",
        "128",
        "--response-len",
        "256",
        "--steps",
        "3",
    )
    metrics = result["metrics"]
    assert result["max_abs_logprob_diff_vs_hf"] < 1e-3
    assert metrics["grad_norm"] > 0
    assert result["objective_after"] > result["objective_before"]
    print(f"verl actor step on CUDA: {min(result['step_s']):.3f} s, {result['tokens_per_s']:.0f} tokens/s")
