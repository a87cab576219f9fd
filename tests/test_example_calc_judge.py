"""``examples/calc/judge_run.py`` end to end at toy size: the checker's run, a judge's calibration and its run.

The judge here is the script's rule-based ``oracle`` (a real HTTP server on 127.0.0.1 reading the group prompt the
judge library builds); the full run with SmolLM2 as the judge is the example (README figures), not a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
sys.path.insert(0, str(CALC))
try:
    from judge_run import oracle_scores  # pyright: ignore[reportMissingImports, reportUnknownVariableType]
finally:
    sys.path.remove(str(CALC))

from agentlightning.judge import JudgedTrace, TraceStep, parse_scores  # noqa: E402


def test_the_oracle_judge_scores_the_group_prompt_by_the_reference_answer() -> None:
    task = {"question": "Q:23*19-4=", "answer": 433}
    finals = ["A:433", "A:430", "calculator says 433", "A:-433"]
    traces = [
        JudgedTrace(f"t-s{i}", "a", "t", task, [TraceStep(1, f"s{i}", "calc", f"Q:23*19-4=\nanswer: {text}")])
        for i, text in enumerate(finals)
    ]
    ids = [f"r{i + 1}" for i in range(len(traces))]
    # the group prompt's shape (agentlightning.judge): the task as JSON, then each rollout's rendered trace
    rollouts = [f"=== rollout {i} ===\n{t.render(4000)}" for i, t in zip(ids, traces, strict=True)]
    parts = [f"Task:\n{json.dumps(task)}", *rollouts]
    messages = [{"role": "system", "content": "rubric"}, {"role": "user", "content": "\n\n".join(parts)}]
    scores = parse_scores(oracle_scores({"messages": messages}), "scores", "id", ids)
    assert [scores[i].score for i in ids] == [1.0, 0.0, 0.0, 0.0]


def test_train_py_takes_the_judge_options(tmp_path: Path, example_script: Any) -> None:
    train = example_script("calc", "train")
    rubric = CALC / "prompts" / "judge_rubric.md"
    judge = ["--judge", "http://127.0.0.1:9/v1", "--judge-model", "j", "--rubric", str(rubric)]
    out = ["--output", str(tmp_path / "run")]
    config = train.build_config(
        train.parse_args([*judge, "--judge-answer-tokens", "160", "--judge-attempts", "1", *out])
    )
    assert config.judge is not None and config.judge.rubric == rubric.read_text().strip()
    assert config.judge.mode == "group" and config.judge.max_tokens == 160 and config.judge.max_attempts == 1
    assert train.build_config(train.parse_args(out)).judge is None  # the checker's reward, as before
    from agentlightning_torch.runkit import UsageError

    with pytest.raises(UsageError, match="--judge needs --judge-model"):
        train.build_config(train.parse_args([*judge[:2], *out]))


@pytest.mark.slow
def test_judge_run_trains_with_the_checker_and_with_a_judge(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable, str(CALC / "judge_run.py"), "--judges", "oracle", "--iterations", "1", "--eval-every", "1",
        "--tasks-per-iteration", "2", "--samples-per-task", "2", "--eval-size", "4", "--calibrate-tasks", "2",
        "--output", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["budget"] == {"iterations": 1, "tasks_per_iteration": 2, "samples_per_task": 2, "eval_size": 4}
    checker, judged = summary["runs"]["checker"], summary["runs"]["judge:oracle"]
    for run in (checker, judged):
        assert run["returncode"] == 0 and run["iterations"] == 1 and run["trained_iterations"] == 1
        assert {"greedy_before", "greedy_best", "greedy_after"} <= set(run)
        assert [iteration for iteration, _ in run["held_out"]] == [0, 1, 1]  # before, in the loop, after RL
    assert "judge_calls" not in checker  # the checker's run asked no judge
    # the judge's run: one group call per task, every rollout scored (its only reward)
    assert judged["judge_calls"] == 2 and judged["judge_failed_calls"] == 0 and judged["judge_rollouts_missing"] == 0
    calibration = summary["calibration"]["oracle"]
    assert calibration["judged"] == calibration["rollouts"] == 4 and calibration["pass_fail_agreement"] == 1.0
    assert (out / "calibrate-oracle" / "calibration.json").is_file()
    assert "| judge:oracle |" in done.stderr and "calibration oracle: 4/4 rollouts judged" in done.stderr
