"""``agl train --engine verl``: verl's `agentlightning.cli.EnginePlugin`, registered in this package's pyproject.

Its options are listed without verl or vLLM, the shared options map onto a `VerlTrainerConfig`, and what verl's
engine cannot do (several policies, no served store, no vLLM here) is refused in one line, exit code 2, before any
Ray or verl start. Training itself runs in ``test_verl_ray_loop.py`` / ``test_verl_vllm_loop.py`` (`VerlTrainer`).
"""

from __future__ import annotations

import importlib
import importlib.util
import tomllib
from pathlib import Path

import pytest

from agentlightning.cli import EnginePlugin, train_parser
from agentlightning.loop import ENGINE_ENTRY_POINTS
from agentlightning_verl.cli import VerlEnginePlugin, VerlSpec, verl_config

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
URL = ["--store-url", "http://127.0.0.1:4747"]


def _parse(tmp_path: Path, *words: str) -> VerlSpec:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": 1}\n')
    shared = ["--engine", "verl", "--agent", "my_agent:solve", "--model", "Qwen/Qwen2.5-0.5B", "--tasks", str(tasks)]
    return VerlSpec.from_namespace(train_parser("verl", VerlEnginePlugin()).parse_args([*shared, *words]))


def test_the_entry_point_names_the_plug_in_class() -> None:
    entry = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"][ENGINE_ENTRY_POINTS]["verl"]
    module, _, attribute = entry.partition(":")
    assert getattr(importlib.import_module(module), attribute) is VerlEnginePlugin
    assert isinstance(VerlEnginePlugin(), EnginePlugin)


def test_help_lists_verls_options_with_the_shared_ones() -> None:
    text = " ".join(train_parser("verl", VerlEnginePlugin()).format_help().split())
    assert "--engine verl: verl on GPUs" in text
    for option in ("--algorithm {grpo,ppo,reinforce_pp,rloo}", "--n-gpus-per-node", "--nnodes", "--rollout-tp",
                   "--gpu-memory-utilization", "--verl-override DOTTED.KEY=VALUE", "--agent AGENT"):  # fmt: skip
        assert option in text, option


def test_the_shared_options_become_the_verl_config(tmp_path: Path) -> None:
    args = _parse(
        tmp_path, *URL, "--tasks-per-iteration", "8", "--samples-per-task", "4", "--iterations", "3", "--lr", "2e-6",
        "--kl-coef", "0.05", "--max-tokens", "64", "--algorithm", "ppo", "--n-gpus-per-node", "2",
        "--ppo-mini-batch-size", "4", "--verl-override", "actor_rollout_ref.actor.clip_ratio=0.3",
        "--verl-override", "trainer.project_name=agl",
    )  # fmt: skip
    config = verl_config(args)
    assert (config.tasks_per_step, config.n_rollouts_per_task, config.total_steps) == (8, 4, 3)
    assert (config.lr, config.kl_loss_coef, config.max_response_length) == (2e-6, 0.05, 64)
    assert (config.algorithm, config.n_gpus_per_node, config.ppo_mini_batch_size) == ("ppo", 2, 4)
    assert config.overrides == {"actor_rollout_ref.actor.clip_ratio": 0.3, "trainer.project_name": "agl"}
    assert config.model_path == "Qwen/Qwen2.5-0.5B"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ([], "--engine verl trains on a served store"),
        ([*URL, "--policy", "a=b"], "several policies"),
        ([*URL, "--val-tasks", "val.jsonl"], "no held-out evaluation"),
        ([*URL, "--runners", "ray"], "not with ray"),
        ([*URL, "--max-staleness", "1"], "trains synchronously"),
        ([*URL, "--verl-override", "novalue"], "--verl-override takes dotted.key=value"),
        ([*URL, "--samples-per-task", "1"], "n_rollouts_per_task >= 2"),
        ([*URL, "--judge", "http://127.0.0.1:9/v1", "--judge-mode", "step"], "group scores only"),
        ([*URL, "--judge", "http://127.0.0.1:9/v1", "--judge-model", "j", "--rubric", "no-such.md"], "rubric file"),
        ([*URL, "--rubric", "rubric.md"], "need --judge URL"),
    ],
)
def test_what_verl_cannot_do_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], message: str
) -> None:
    code = VerlEnginePlugin().train(_parse(tmp_path, *words))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_a_run_says_what_to_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = VerlEnginePlugin().train(_parse(tmp_path, *URL))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "needs vllm, which is not installed here: pip install 'agentlightning-verl[gpu]'" in err[0]
