"""``benchmarks/vllm_differential.py`` at toy size: against the session's real vLLM (serving the tool test model),
the embedded backend gives the same greedy tokens on the calculator's prompt-file requests, the turn after a tool
result and open prompts; and the step comparison it reports on a real model names a real difference."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from vllm_differential import compare, main  # noqa: E402  # pyright: ignore[reportMissingImports]


def _answer(ids: list[int], logprobs: list[list[float]]) -> dict[str, Any]:
    entries = [{"logprob": lp[0], "top_logprobs": [{"logprob": v} for v in lp]} for lp in logprobs]
    return {"ids": ids, "entries": entries}


def test_the_comparison_tells_a_near_tie_from_a_real_difference() -> None:
    reference = _answer([5, 6, 7], [[-0.1, -2.0], [-0.5, -0.5002], [-0.2, -3.0]])
    same = compare("same", reference, _answer([5, 6, 7], [[-0.1001, -2.0], [-0.5, -0.5002], [-0.2, -3.0]]), 1e-3, 1e-3)
    assert same.same_tokens and same.mismatch is None and same.max_logprob_diff == pytest.approx(1e-4)
    # step 1: vLLM's two best are 2e-4 apart and ours took the second: a near tie, not a mismatch
    tie = compare("tie", reference, _answer([5, 8, 9], [[-0.1, -2.0], [-0.5002, -0.5], [-0.1, -3.0]]), 1e-3, 1e-3)
    assert tie.tie_at == 1 and tie.mismatch is None
    # step 2: a different token where vLLM's choice was clear, then log-probs off by more than the tolerance
    other = compare("other", reference, _answer([5, 6, 8], [[-0.1, -2.0], [-0.5, -0.5002], [-0.2, -3.0]]), 1e-3, 1e-3)
    assert other.mismatch is not None and other.mismatch.startswith("step 2: token 8")
    drift = compare("drift", reference, _answer([5, 6, 7], [[-0.1, -2.0], [-0.6, -0.7], [-0.2, -3.0]]), 1e-3, 1e-3)
    assert drift.mismatch is not None and "log-probs differ" in drift.mismatch
    short = compare("short", reference, _answer([5, 6], [[-0.1, -2.0], [-0.5, -0.5002]]), 1e-3, 1e-3)
    assert short.mismatch == "2 tokens vs vLLM's 3"


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_the_benchmark_finds_the_backends_agree_on_a_model_vllm_serves(
    vllm_server: Any, tool_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "--model-dir", str(tool_model_dir), "--served-name", "tiny", "--vllm-url", vllm_server.base_url,
        "--prompts", "3", "--max-tokens", "24", "--tolerance", "1e-4", "--tie", "1e-4", "--threads", "1",
    ])  # fmt: skip
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and figures["mismatches"] == 0, figures
    assert figures["requests"] == 3 + 1 + 4  # the questions, the turn after a tool result, the open prompts
    assert figures["same_tokens"] + figures["near_ties"] == figures["requests"]
    assert figures["steps_compared"] > 0
