"""examples/sql/compare_policies.py at toy size: two LoRA adapters (checker frozen) vs one shared policy, one run.

Both modes train two iterations of the real graph (runner processes, LangChain adapter, proxy, local backend, SQLite
store) from the shipped checkpoint; the script reports both and draws one plot. The stores show the routing: in the
adapters run each agent's calls went to its own policy (the checker's to the frozen base), in the shared run to none.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")
pytest.importorskip("peft")

import agentlightning as agl

ROOT = Path(__file__).resolve().parent.parent
SQL = ROOT / "examples" / "sql"

needs_checkpoint = pytest.mark.skipif(
    not (SQL / "checkpoint" / "config.json").is_file(), reason="examples/sql/checkpoint is not shipped"
)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SQL / "compare_policies.py"), "--quiet", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)


async def _routes(db: Path) -> set[tuple[str | None, str | None]]:
    """(agent, policy) of every LLM call of the run."""
    store = agl.SqliteStore(db)
    try:
        routes: set[tuple[str | None, str | None]] = set()
        for rollout in await store.query_rollouts():
            routes |= {(c.agent_name, c.policy) for c in await store.query_llm_calls(rollout.rollout_id)}
        return routes
    finally:
        await store.close()


@needs_checkpoint
def test_both_modes_train_from_the_same_start_and_report_per_agent_curves(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    done = _run(
        "--iterations", "2", "--tasks-per-iteration", "4", "--samples-per-task", "4", "--eval-size", "4",
        "--workers", "16", "--runners", "1", "--minutes", "600", "--output", str(out),
        "--rollout-timeout", "3600",  # the run ends after 2 iterations however slow the machine
        "--lr", "2e-4", "--policy-settings", "rewriter:lr=1e-3,rank=4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    adapters, shared = summary["modes"]["adapters"], summary["modes"]["shared"]
    # the settings each mode used: the writer's LoRA lr is the default (10x --lr), the rewriter's its own
    used = adapters["settings"]["policies"]
    assert used["writer"]["lr"] == pytest.approx(2e-3) and used["writer"]["lora_r"] == 8
    assert (used["rewriter"]["lr"], used["rewriter"]["lora_r"]) == (1e-3, 4)
    assert shared["settings"]["policies"] == {"shared": {"weights": "full", "lr": 2e-4, "kl_coef": 0.05}}
    assert "adapters: policy rewriter: lora weights, lr 0.001" in " ".join(done.stderr.split())
    assert adapters["iterations"] == shared["iterations"] == 2
    # LoRA adapters start at zero: before RL both modes serve the same model, greedily the same answers
    assert adapters["reward_before"] == shared["reward_before"]
    for mode in (adapters, shared):
        writer = mode["agent_curves"]["writer"]
        assert [point[0] for point in writer] == [1, 2]  # the writer acts in every rollout of both iterations
        assert all(point[2] == 16 for point in writer)
        assert all(0.0 <= point[1] <= 1.0 for curve in mode["agent_curves"].values() for point in curve)
    assert (out / "compare.png").stat().st_size > 0
    assert json.loads((out / "shared" / "summary.json").read_text()) == shared
    assert "adapters: held-out execution accuracy" in done.stderr

    checkpoint = out / "adapters" / "checkpoint" / "adapters"
    assert (checkpoint / "writer" / "adapter_config.json").is_file()
    assert (checkpoint / "rewriter" / "adapter_config.json").is_file()
    routed = asyncio.run(_routes(out / "adapters" / "store.db"))
    assert {("writer", "writer"), ("checker", "frozen")} <= routed
    assert routed <= {("writer", "writer"), ("rewriter", "rewriter"), ("checker", "frozen")}
    assert {policy for _, policy in asyncio.run(_routes(out / "shared" / "store.db"))} == {None}


def test_an_unknown_mode_is_one_line(
    tmp_path: Path, example_script: Callable[[str, str], ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    compare = example_script("sql", "compare_policies")
    assert compare.main(["--modes", "adapters,lora", "--output", str(tmp_path)]) == 2
    expected = "error: --modes takes adapters, shared, one-adapter, full (comma-separated), got ['lora']"
    assert capsys.readouterr().err.strip().splitlines()[-1] == expected


@needs_checkpoint
def test_the_full_mode_gives_writer_and_rewriter_full_weights_of_their_own(
    tmp_path: Path, example_script: Callable[[str, str], ModuleType]
) -> None:
    compare = example_script("sql", "compare_policies")
    args = compare.parse_args(["--modes", "full", "--output", str(tmp_path), "--policy-settings", "rewriter:lr=1e-3"])
    assert args.modes == ("full",)
    config = compare.sql_train.build_config(compare.args_of(args, "full"), compare.policy_map("full"))
    assert {name: s.weights for name, s in config.policy_settings.items()} == {"writer": "full", "rewriter": "full"}
    assert config.policy_settings["rewriter"].lr == 1e-3 and config.policy_settings["writer"].lr is None
    assert config.policies.trained == ["writer", "rewriter"] and config.policies.resolve("checker", None)[0] == "frozen"
