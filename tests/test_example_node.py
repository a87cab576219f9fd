"""``examples/node``: a JavaScript agent (the official ``openai`` npm package) trained by ``agl train --agent-command``.

Real parts: ``npm ci`` of the committed lock file, ``node`` processes run by a real runner, the toy calculator model
served by the embedded backend behind the LLM proxy, two RL iterations. The held-out rise needs minutes of RL
(docs/agents-in-other-languages.md reports a run); this test checks what the run trained on: the Node agent's calls
as transitions with the exact token ids and the rewards it printed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "examples" / "node"
CALC = ROOT / "examples" / "calc"


@pytest.fixture(scope="module")
def node_modules() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed (python3 scripts/dev.py test installs them on Debian)")
    done = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.timeout(900)  # the trainer imports torch and evaluates: minutes on a loaded 2-core machine
def test_the_node_agent_trains_through_agl_train(tmp_path: Path, node_modules: None) -> None:
    import agentlightning as agl

    val = tmp_path / "val.jsonl"
    val.write_text("".join((CALC / "data" / "val.jsonl").read_text().splitlines(keepends=True)[:8]))
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "agentlightning.cli", "train",
        "--agent-command", "node agent.mjs", "--app-dir", str(NODE),
        "--model", str(CALC / "checkpoint"), "--tasks", str(CALC / "data" / "train.jsonl"), "--val-tasks", str(val),
        "--iterations", "2", "--runners", "1", "--lr", "3e-4", "--tool-parser", "calc", "--output", str(out),
        "--tasks-per-iteration", "4", "--samples-per-task", "4", "--workers", "8", "--max-tokens", "24", "--quiet",
        "--dashboard-port", "0",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=800, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["iterations"] == 2
    assert "runner: 8 async worker(s) running 'node agent.mjs'" in done.stderr

    async def trained() -> tuple[list[agl.Transition], list[str]]:
        store = agl.SqliteStore(out / "store.db")
        try:
            rollouts = [
                r for r in await store.query_rollouts(status=["succeeded"]) if not r.rollout_id.startswith("eval")
            ]
            failed = [
                a.error or ""
                for r in await store.query_rollouts(status=["failed"])
                for a in await store.query_attempts(r.rollout_id)
            ]
            return await agl.transitions_from_store(store, [r.rollout_id for r in rollouts]), failed
        finally:
            await store.close()

    transitions, failed = asyncio.run(trained())
    assert failed == []
    assert len(transitions) >= 2 * 4 * 4  # each rollout calls the model once or twice
    assert all(t.prompt_token_ids and t.response_token_ids and t.response_logprobs for t in transitions)
    assert {t.final_reward for t in transitions} <= {1.0, 0.0, -0.1}
