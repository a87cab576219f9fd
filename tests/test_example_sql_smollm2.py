"""``examples/sql/train.py --model smollm2`` at toy size: the name resolves to the fetched folder (or says in one line
how to fetch it), every agent's call opens with its messages from the prompt file, rendered by the model's own chat
template (SmolLM2's ChatML), and LoRA trains by default. A tiny random model stands in for SmolLM2: the real run is
an example (examples/sql/README.md), not a test."""

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
SQL = ROOT / "examples" / "sql"


def _train(models: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGL_MODELS": str(models)}
    cmd = [sys.executable, str(SQL / "train.py"), "--quiet", "--model", "smollm2", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "python3 scripts/dev.py smollm2"),
        (["--model-dir", "nowhere"], "--model-dir 'nowhere' is not a model folder"),
        (["--prompt-file", "nowhere.json"], "--prompt-file 'nowhere.json' does not exist"),
    ],
)
def test_a_missing_model_folder_or_prompt_file_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = _train(tmp_path / "empty", "--output", str(tmp_path / "run"), *args)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (tmp_path / "run" / "store.db").exists()  # refused before anything started


def test_a_bad_prompt_file_is_one_clear_error(tmp_path: Path) -> None:
    sys.path.insert(0, str(SQL))
    try:
        from sql_agent import prompt_messages  # pyright: ignore[reportMissingImports, reportUnknownVariableType]
    finally:
        sys.path.remove(str(SQL))

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"writer": [{"role": "system", "content": "x"}], "judge": []}))
    with pytest.raises(ValueError, match=r"keys among \['writer', 'checker', 'rewriter'\]"):
        prompt_messages(bad)
    bad.write_text(json.dumps({"writer": [{"content": "no role"}]}))
    with pytest.raises(ValueError, match="'writer' must be a list of chat messages"):
        prompt_messages(bad)
    shipped = prompt_messages(SQL / "prompts" / "smollm2.json")
    assert set(shipped) == {"writer", "checker", "rewriter"} and all(shipped.values())


def test_smollm2_builds_the_graph_with_the_prompt_file_and_trains_a_lora_adapter(tmp_path: Path) -> None:
    models = tmp_path / "models"
    corpus = ["SELECT name FROM authors WHERE country = 'Peru' OK BAD ROWS 2: a | b"]
    folder = make_smollm2_stand_in(models, corpus=corpus)  # SmolLM2's chat template, as `agl model import` writes it
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = tmp_path / "run"
    done = _train(
        models,
        "--iterations", "1", "--tasks-per-iteration", "2", "--samples-per-task", "2", "--eval-size", "2",
        "--eval-every", "0", "--workers", "4", "--runners", "1", "--minutes", "600", "--rollout-timeout", "3600",
        "--max-tokens", "8", "--output", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["model"] == "smollm2" and summary["iterations"] == 1
    assert summary["prompt_file"] == str(SQL / "prompts" / "smollm2.json")
    assert (out / "checkpoint" / "adapter").is_dir()  # LoRA by default for this model
    shared = summary["settings"]["policies"]["shared"]  # and the summary says so (it said "full")
    assert (shared["weights"], shared["lora_r"], shared["lora_targets"]) == (
        "lora",
        16,
        ["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    assert summary["trained_samples"]["checker"] == 0

    prompts = json.loads((SQL / "prompts" / "smollm2.json").read_text())
    openings = {
        agent: "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        for agent, messages in prompts.items()
    }

    async def prompts_by_agent() -> dict[str, list[str]]:
        store = agl.SqliteStore(out / "store.db")
        try:
            texts: dict[str, list[str]] = {}
            for rollout in await store.query_rollouts(status=["succeeded"]):
                for call in await store.query_llm_calls(rollout.rollout_id):
                    text = tokenizer.decode(call.prompt_token_ids)
                    assert rollout.input["question"] in text
                    texts.setdefault(_agent_of(text), []).append(text)
            return texts
        finally:
            await store.close()

    def _agent_of(text: str) -> str:
        """Which agent made a call: its own message (the last user turn) ends with the agent's request."""
        last = text.rsplit("<|im_start|>user", 1)[-1]
        return "checker" if "OK or BAD?" in last else "rewriter" if "corrected" in last else "writer"

    texts = asyncio.run(prompts_by_agent())
    assert {"writer", "checker"} <= set(texts), set(texts)
    for agent, rendered in texts.items():
        for text in rendered:
            # the agent's system prompt and worked examples, rendered by the model's own template, then its message
            assert text.startswith(openings[agent]), (agent, text[:400])
            assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
