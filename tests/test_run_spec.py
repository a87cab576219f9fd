"""One typed run specification (issue 57, item 1): `agentlightning.cli.RunSpec` defines each option every engine
shares once; ``agl train``, the runkit and every example's training script parse it from that definition, and every
registered engine either honours a shared option or refuses it, in one line, before anything loads."""

from __future__ import annotations

import argparse
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import pytest

from agentlightning.cli import EngineRefusal, RunSpec, engine_names, load_engine, option_flag, parse_train_spec

BASE = ["--model", "some/model", "--tasks", "tasks.jsonl"]
ENGINES = engine_names()
SHARED = [name for name in RunSpec.model_fields if name != "engine"]


def _other_value(name: str) -> list[str]:
    """Command-line words that set shared option ``name`` to a value other than its default."""
    special = {
        "runners_ray": ["--runners", "ray"],
        "ray_address": ["--runners", "ray=10.0.0.5:6379"],
        "log_level": ["--log-level", "debug"],
        "output": ["--output", "runs/elsewhere"],
    }
    if name in special:
        return special[name]
    field = RunSpec.model_fields[name]
    kind: Any = field.annotation
    if get_origin(kind) in (Union, types.UnionType):
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    flag = option_flag(name)
    if kind is bool:
        return [flag]
    if get_origin(kind) is Literal:
        return [flag, str(next(choice for choice in get_args(kind) if choice != field.default))]
    if get_origin(kind) is list:
        return [flag, "writer=writer"]
    if kind in (int, float):
        return [flag, str((field.default or 0) + 2)]
    return [flag, f"other-{name}"]


def _words(name: str) -> list[str]:
    agent = [] if name in ("agent", "agent_command") else ["--agent", "my_agent:solve"]
    return [*BASE, *agent, *_other_value(name)]


def test_every_engine_is_walked() -> None:
    assert {"torch", "verl"} <= set(ENGINES)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", SHARED)
def test_every_shared_option_is_honoured_or_refused_by_every_engine(engine: str, name: str) -> None:
    """A shared option set to a non-default value is either one the engine declares it honours (and reaches its
    typed spec), or refused in one line naming the option and the engine: never silently ignored."""
    plugin = load_engine(engine)
    capabilities = plugin.capabilities
    label = "--runners ray" if name in ("runners_ray", "ray_address") else option_flag(name)
    if name in capabilities.honours:
        spec = parse_train_spec(_words(name), engine, plugin)
        assert isinstance(spec, plugin.spec)
        assert getattr(spec, name) != RunSpec.model_fields[name].get_default(call_default_factory=True), name
        return
    with pytest.raises(EngineRefusal) as refused:
        parse_train_spec(_words(name), engine, plugin)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"agl train --engine {engine} cannot honour {label}")


@pytest.mark.parametrize("engine", ENGINES)
def test_the_defaults_pass_every_engine(engine: str) -> None:
    """Only a value that differs from the default is refused: the plain command line runs on every engine."""
    plugin = load_engine(engine)
    spec = parse_train_spec([*BASE, "--agent", "my_agent:solve"], engine, plugin)
    assert isinstance(spec, plugin.spec) and (spec.model, spec.engine) == ("some/model", engine)


def test_verl_refuses_what_it_silently_ignored() -> None:
    """The five shared options verl's engine read nowhere before (issue 57) are refused, each in one line."""
    plugin = load_engine("verl")
    for words in (["--dashboard-port", "5000"], ["--heartbeat-timeout", "5"], ["--quiet"], ["--store-servers", "2"]):
        with pytest.raises(EngineRefusal, match=f"cannot honour {words[0]}: verl's engine"):
            parse_train_spec([*BASE, "--agent", "m:f", *words], "verl", plugin)
    with pytest.raises(EngineRefusal, match="cannot honour --store: "):
        parse_train_spec([*BASE, "--agent", "m:f", "--store", "postgresql://u:p@h:5432/db"], "verl", plugin)


def test_verls_runners_get_the_agent_commands_timeout(tmp_path: Path) -> None:
    """``--agent-timeout`` is honoured by verl's engine: its runner processes stop a command that runs too long."""
    from agentlightning_verl.cli import runner_commands

    plugin = load_engine("verl")
    words = [*BASE, "--agent-command", "node agent.mjs", "--agent-timeout", "12.5", "--runners", "2"]
    spec = parse_train_spec([*words, "--store-url", "http://127.0.0.1:4747"], "verl", plugin)
    commands = runner_commands(spec)
    assert len(commands) == 2
    assert commands[0][commands[0].index("--agent-timeout") + 1] == "12.5"


def _help_text(example: str, module: Any, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        module.parse_train_args(["--help"]) if example == "math" else module.parse_args(["--help"])
    return " ".join(capsys.readouterr().out.split())


TOTALS = {"calc": 128, "sql": 128, "rag": 64, "math": 64}
"""Each example's concurrent rollouts by default, over all its runner processes (as before ``--workers`` meant one
runner process's, as ``agl train``'s does)."""


@pytest.mark.parametrize("example", ["calc", "sql", "rag", "math"])
def test_every_example_parses_the_shared_options_as_the_spec_defines_them(
    example: str, example_script: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An example's shared options are `TorchSpec`'s (one help, one type); its defaults may differ, on purpose, and
    keep its total concurrency (``--workers`` is per runner process everywhere)."""
    from agentlightning_torch.runkit import RUN_OPTIONS, TorchSpec, total_workers

    if example in ("sql", "calc"):
        pytest.importorskip("langgraph")
    module = example_script(example, "train")
    text = _help_text(example, module, capsys)
    for name in RUN_OPTIONS:
        field = TorchSpec.model_fields[name]
        if name in ("runners_ray", "ray_address"):
            continue
        assert " ".join(str(field.description).split()) in text, (example, name)
    args = module.parse_train_args([]) if example == "math" else module.parse_args([])
    for name in RUN_OPTIONS:
        value, default = getattr(args, name), TorchSpec.model_fields[name].get_default(call_default_factory=True)
        assert isinstance(value, type(default)) or default is None, (example, name, value)
    assert total_workers(args) == TOTALS[example]


def test_a_script_default_is_an_override_of_the_one_definition() -> None:
    """`add_run_arguments` takes only defaults of the spec's options: not a second definition of any."""
    from agentlightning_torch.runkit import add_run_arguments

    parser = argparse.ArgumentParser()
    add_run_arguments(parser, output=Path("runs/x"), lr=5e-4)
    assert parser.parse_args([]).lr == 5e-4
    with pytest.raises(KeyError, match="no option no_such_option"):
        add_run_arguments(argparse.ArgumentParser(), output=Path("runs/x"), no_such_option=1)
