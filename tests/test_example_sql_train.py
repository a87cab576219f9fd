"""examples/sql's CPU recipe (train.py): bad settings refused in one line; the GPU recipe's verl config."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")


ROOT = Path(__file__).resolve().parent.parent
SQL = ROOT / "examples" / "sql"
_spec = importlib.util.spec_from_file_location("sql_train", SQL / "train.py")  # "train" is a common module name
assert _spec is not None and _spec.loader is not None
sql_train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sql_train)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--minutes", "0"], "--minutes must be positive"),
        (["--runners", "0"], "must be at least 1"),
        (["--model-dir", "nowhere"], "is not a model folder"),
    ],
)
def test_bad_settings_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert sql_train.main(args) == 2
    assert message in capsys.readouterr().err


def test_the_gpu_recipe_builds_a_verl_config_with_the_same_agent_filter() -> None:
    pytest.importorskip("agentlightning_verl")
    sys.path.insert(0, str(SQL))
    try:
        from gpu_config import CONFIG, LOOP  # pyright: ignore[reportMissingImports]
    finally:
        sys.path.remove(str(SQL))
    verl = CONFIG.to_verl_config()
    assert verl.actor_rollout_ref.model.path == "meta-llama/Llama-3.2-3B-Instruct"
    assert LOOP.agent_filter == ("writer", "rewriter") and LOOP.samples_per_task == 8 and LOOP.estimator == "grpo"
