"""The torch engine's `agentlightning.cli.EnginePlugin`: registered in this package's pyproject, its own options on
top of the ones ``agl train`` shares, and every command line the docs and tests use still parses.

The plug-in is loaded from the entry point as pyproject declares it (not from the installed metadata, which an
editable install writes only when it is installed again).
"""

from __future__ import annotations

import argparse
import importlib
import tomllib
from pathlib import Path

import pytest

from agentlightning.cli import EnginePlugin, train_parser
from agentlightning.loop import ENGINE_ENTRY_POINTS
from agentlightning_torch.cli import TorchEnginePlugin

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
SHARED = ["--agent", "calc_agent:calc_agent", "--model", "ckpt", "--tasks", "train.jsonl"]


def _declared_plugin() -> object:
    entry = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"][ENGINE_ENTRY_POINTS]["torch"]
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _parse(*words: str) -> argparse.Namespace:
    return train_parser("torch", TorchEnginePlugin()).parse_args([*SHARED, *words])


def test_the_entry_point_names_the_plug_in_class() -> None:
    target = _declared_plugin()
    assert target is TorchEnginePlugin
    assert isinstance(TorchEnginePlugin(), EnginePlugin)


def test_the_torch_options_are_the_plug_ins_own_and_listed_in_help() -> None:
    text = " ".join(train_parser("torch", TorchEnginePlugin()).format_help().split())
    assert "--engine torch: one machine, CPU or one GPU" in text
    for option in ("--backend {local,vllm}", "--vllm-url", "--tool-parser-plugin", "--lora-rank", "--threads"):
        assert option in text, option
    shared = " ".join(train_parser().format_help().split())
    assert "--backend" not in shared and "--threads" not in shared and "--lora-rank" not in shared


def test_the_defaults_are_those_agl_train_had() -> None:
    args = _parse()
    assert (args.engine, args.device, args.threads, args.lora_rank, args.backend) == ("torch", "cpu", 1, None, "local")
    assert (args.model_name, args.tool_parser, args.vllm_url, args.tool_parser_plugin) == ("policy", None, None, None)


@pytest.mark.parametrize(
    "words",
    [
        ["--iterations", "2", "--runners", "2", "--lr", "3e-4", "--tool-parser", "calc", "--output", "out"],
        ["--backend", "vllm", "--vllm-url", "http://127.0.0.1:8000", "--tool-parser-plugin", "p.py"],
        ["--device", "cuda:0", "--threads", "4", "--lora-rank", "16", "--policy", "calc=solver"],
        ["--runners", "ray", "--runner-processes", "2", "--ray-placement", "pack", "--serve-store", "0.0.0.0:4747"],
        ["--engine", "torch", "--max-staleness", "1", "--quiet", "--log-level", "info"],
    ],
)
def test_every_invocation_of_the_docs_and_tests_still_parses(words: list[str]) -> None:
    args = _parse(*words)
    assert args.agent == "calc_agent:calc_agent" and args.engine == "torch"


def test_the_judge_options_reach_the_loop(tmp_path: Path) -> None:
    """``--judge URL --judge-model M --rubric FILE``: the loop judges; step scores select the per_step strategy."""
    from agentlightning_torch.runkit import UsageError, trainer_config

    rubric = tmp_path / "rubric.md"
    rubric.write_text("The answer must equal the reference.")
    judge = ["--judge", "http://127.0.0.1:9/v1", "--judge-model", "j", "--rubric", str(rubric), "--output", "out"]
    loop = trainer_config(_parse(*judge, "--judge-mode", "both", "--judge-max-calls", "5"), model_dir=tmp_path)
    config = loop.loop_config()
    assert config.judge is not None and config.judge.rubric == "The answer must equal the reference."
    assert (config.judge.mode, config.judge.max_calls_per_iteration, config.credit) == ("both", 5, "per_step")
    assert trainer_config(_parse("--output", "out"), model_dir=tmp_path).loop_config().judge is None
    with pytest.raises(UsageError, match="--judge needs --judge-model"):
        trainer_config(_parse("--judge", "http://127.0.0.1:9/v1", "--output", "out"), model_dir=tmp_path)
