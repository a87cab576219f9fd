"""``agl doctor --model toy``: the quickstart's agents run through ``agl train``'s path (torch engine, runner process,
LLM proxy, SQLite store) and checked; a healthy LangGraph agent is trainable, a defect is named with its fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
TASKS = CALC / "data" / "train.jsonl"


def agl_doctor(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "agentlightning.cli", "doctor", "--app-dir", str(CALC), "--tasks", str(TASKS), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.timeout(600)
def test_the_quickstart_langgraph_agent_is_trainable_on_the_toy_model() -> None:
    done = agl_doctor("--agent", "calc_agent:calc_agent", "--model", "toy", "-n", "4", "--samples", "4", "--json")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    problems = {f["check"] for f in report["findings"] if f["severity"] == "problem"}
    # The toy model samples at temperature 1 and is right about a third of the time: 16 equal rewards (no learning
    # signal, rightly a problem) happen well under 1% of the time. Every other check must pass.
    assert problems <= {"constant-reward", "flat-groups"}, report["findings"]
    assert done.returncode == (1 if problems else 0), done.stdout[-3000:] + done.stderr[-3000:]
    assert report["trainable"] == (not problems)
    (site,) = report["sites"]
    assert site["agent"] == "solver" and site["calls"] == site["recorded"] == site["with_token_ids"] >= 16
    assert site["template_checked"] == site["template_equal"] == site["calls"]  # the toy model's own template
    assert site["tool_calls_parsed"] == site["tool_calls_attempted"]  # the calc parser reads CALC(...)
    figures = report["figures"]
    assert figures["rollouts"] == figures["succeeded"] == figures["with_reward"] == 16
    assert figures["context"] == 128 and 0 < figures["transition_tokens_max"] <= 128
    assert figures["agents"] == ["solver"] and figures["groups"] == 4


@pytest.mark.timeout(600)
def test_max_tokens_that_cut_every_answer_of_the_openai_agent_are_named() -> None:
    done = agl_doctor(
        "--agent", "calc_openai_agent:calc_openai_agent", "--model", "toy", "-n", "2", "--samples", "2",
        "--max-tokens", "1",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    out = " ".join(done.stdout.split())
    assert "problem [truncated]" in out and "4 of 4 answers were cut by max_tokens" in out
    assert "raise --max-tokens" in out and "not trainable" in out
    kept = " ".join(done.stderr.split()).split("the rollouts' store is kept: ", 1)[1].split()[0]
    assert kept.endswith("store.db") and Path(kept).is_file()
    # the kept store, checked again with --store: the same findings, the prompts against the toy model's template
    again = subprocess.run(
        [sys.executable, "-m", "agentlightning.cli", "doctor", "--store", kept, "--model", "toy", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert again.returncode == 1, again.stderr[-3000:]
    report = json.loads(again.stdout.strip().splitlines()[-1])
    assert "truncated" in {f["check"] for f in report["findings"] if f["severity"] == "problem"}
    (site,) = report["sites"]
    assert site["template_checked"] == site["template_equal"] == 4 and report["figures"]["context"] == 128
    shutil.rmtree(Path(kept).parent)


def test_an_agent_that_does_not_import_is_exit_2_in_one_line() -> None:
    done = agl_doctor("--agent", "calc_agent:no_such_function", "--model", "toy")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "could not run: module 'calc_agent' has no function 'no_such_function'" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
