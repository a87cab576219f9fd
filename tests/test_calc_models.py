"""``examples/calc/train.py --model smollm2`` at toy size: the name resolves to the fetched folder (or says how to fetch
it), the runners open every conversation with the prompt file's messages, and the model's own chat template (SmolLM2's
ChatML, with no tool section) renders them. A tiny random model stands in for SmolLM2: the real one (a 98 MB
download) is an example run, not a test."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")
pytest.importorskip("peft")  # --model smollm2 trains LoRA adapters


from transformers import AutoTokenizer

import agentlightning as agl
from agentlightning_torch.testing import make_smollm2_stand_in

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"


def _train(models: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGL_MODELS": str(models)}
    cmd = [sys.executable, str(CALC / "train.py"), "--quiet", "--no-dashboard", "--model", "smollm2", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)


def test_smollm2_not_fetched_says_in_one_line_how_to_fetch_it(tmp_path: Path) -> None:
    done = _train(tmp_path / "empty", "--output", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "python3 scripts/dev.py smollm2" in lines[0], done.stderr


def test_smollm2_resolves_to_the_fetched_folder_and_its_template_renders_the_prompt_file(tmp_path: Path) -> None:
    models = tmp_path / "models"
    # SmolLM2's chat template, as `agl model import` writes it
    folder = make_smollm2_stand_in(models, corpus=["CALC(12*7+3) A:87 Q:2*3+1="])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = tmp_path / "run"
    done = _train(
        models,
        "--iterations", "1", "--tasks-per-iteration", "2", "--samples-per-task", "2", "--eval-size", "2",
        "--eval-every", "0", "--workers", "4", "--runners", "1", "--minutes", "600", "--rollout-timeout", "3600",
        "--output", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["model"] == "smollm2" and summary["iterations"] == 1
    # LoRA by default for this model: the checkpoint keeps the adapter beside the merged weights
    assert (out / "checkpoint" / "adapter").is_dir()

    # the per-iteration breakdown is in metrics.jsonl: generation, transitions, update, sync seconds, tokens/s
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row["metrics"] for row in rows if row["kind"] == "train"]
    assert train_rows
    for metrics in train_rows:
        for key in ("time_rollouts", "time_batch", "time_update", "time_sync", "tokens_per_s", "tokens_generated"):
            assert metrics[key] >= 0, key
        assert metrics["tokens_generated"] > 0 and metrics["tokens_per_s"] > 0

    prompt = json.loads((CALC / "prompts" / "smollm2.json").read_text())
    opening = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in prompt)

    async def first_prompts() -> list[str]:
        store = agl.SqliteStore(out / "store.db")
        try:
            texts: list[str] = []
            for rollout in await store.query_rollouts(status=["succeeded"]):
                calls = await store.query_llm_calls(rollout.rollout_id)
                first = min(calls, key=lambda c: len(c.prompt_token_ids))
                texts.append(tokenizer.decode(first.prompt_token_ids))
                assert rollout.input["question"] in texts[-1]
            return texts
        finally:
            await store.close()

    texts = asyncio.run(first_prompts())
    assert texts
    for text in texts:
        # the system prompt and the worked example (its tool turn included), rendered by the model's own template
        assert text.startswith(opening), text[:400]
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_a_prompt_files_worked_examples_leave_the_episode_its_whole_call_budget() -> None:
    """The graph's call budget counts this episode's calls, not the prompt file's example assistant messages.

    Counting them once ended every episode at its first call: a calculator call then scored -0.1 (malformed) and RL
    taught SmolLM2 never to call the calculator.
    """
    script = """
import json
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END
from calc_agent import MAX_LLM_CALLS, PROMPT, next_step
assert sum(isinstance(m, AIMessage) for m in PROMPT) >= MAX_LLM_CALLS  # the examples alone would fill the budget
call = AIMessage("", tool_calls=[{"name": "calculator", "args": {"expression": "2*3"}, "id": "c1"}])
episode = [*PROMPT, HumanMessage("Q:2*3+1=")]
steps = [
    next_step([*episode, call]),
    next_step([*episode, call, ToolMessage("6", tool_call_id="c1"), AIMessage("A:7")]),
    next_step([*episode, call, ToolMessage("6", tool_call_id="c1"), call]),
]
print(json.dumps([s == END for s in steps]))
"""
    env = {**os.environ, "CALC_PROMPT_FILE": str(CALC / "prompts" / "smollm2.json")}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=CALC, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # a first call to the calculator goes to the tool; an answer ends; a second call is past the budget
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, True, True]
