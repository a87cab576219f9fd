"""``agl train`` finds its engine through the ``agentlightning.engines`` entry-point group, never by package name:
an `EnginePlugin` that adds its own options to the ones the core shares, and trains.

Each test installs a throwaway distribution the way pip does (a ``*.dist-info`` folder with ``METADATA`` and
``entry_points.txt`` next to its module) into a folder put first on ``sys.path``, so ``importlib.metadata`` finds
it exactly as it finds an installed engine package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlightning.cli import main
from agentlightning.cli._train import DEFAULT_ENGINE, EngineNotFoundError, load_engine, train_parser
from agentlightning.loop import ENGINE_ENTRY_POINTS

ARGS = ["--agent", "my_agent:solve", "--model", "some/model", "--tasks", "tasks.jsonl"]


def _install(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """A distribution ``dist`` in ``site``: its modules, and a dist-info declaring ``entry_points`` as engines."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENGINE_ENTRY_POINTS}]\n{lines}")
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


THIRD = """\
import json

from pydantic import Field

from agentlightning.cli import EngineCapabilities, RunSpec


class ThirdSpec(RunSpec):
    third_knob: int = Field(3, description="the third engine's own knob")


class ThirdEngine:
    summary = "a third engine, written in the test"
    spec = ThirdSpec
    capabilities = EngineCapabilities(honours=frozenset({"agent", "model", "tasks", "iterations", "runners"}))

    def train(self, spec: ThirdSpec) -> int:
        with open(spec.tasks, encoding="utf-8") as tasks:
            count = sum(1 for line in tasks if line.strip())
        print(json.dumps({"engine": spec.engine, "agent": spec.agent, "knob": spec.third_knob, "tasks": count,
                          "iterations": spec.iterations, "runners": spec.runners}))
        return 7
"""
"""An engine package of its own: a plug-in class with one option of its own and a train that reads the tasks."""


def _install_third(site: Path) -> None:
    _install(site, "agentlightning-third", {"third": "agl_third_engine:ThirdEngine"}, {"agl_third_engine": THIRD})


def test_an_engine_registered_in_the_group_runs_agl_train_with_its_own_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _install_third(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": 1}\n{"q": 2}\n')
    code = main(["train", "--engine", "third", *ARGS[:-1], str(tasks), "--third-knob", "9", "--iterations", "2"])
    assert code == 7  # the engine's exit code is agl's
    ran = json.loads(capsys.readouterr().out.strip())
    assert ran == {"engine": "third", "agent": "my_agent:solve", "knob": 9, "tasks": 2, "iterations": 2, "runners": 1}
    with pytest.raises(SystemExit) as refused:  # its option is parsed by agl train's parser, as a shared one is
        main(["train", "--engine", "third", *ARGS, "--third-knob", "many"])
    assert refused.value.code == 2 and "argument --third-knob: invalid int value: 'many'" in capsys.readouterr().err


@pytest.mark.timeout(900)  # two fresh interpreters: minutes each on a loaded 2-core machine
def test_a_third_engine_is_found_lists_its_options_in_help_and_runs_as_a_command(tmp_path: Path) -> None:
    """``agl train --engine third`` in a fresh interpreter, found through the metadata (a dist-info on the path)."""
    _install_third(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}

    def agl_train(*words: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "agentlightning.cli", "train", *words]
        return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=420, check=False)

    shown = agl_train("--engine", "third", "--help")
    assert shown.returncode == 0, shown.stderr
    help_text = " ".join(shown.stdout.split())
    assert "--engine third: a third engine, written in the test" in help_text
    assert "--third-knob THIRD_KNOB the third engine's own knob (default: 3)" in help_text
    assert "--agent AGENT" in help_text and "--runners N|ray[=ADDRESS]" in help_text  # the shared options too
    assert "installed: " in help_text and "third" in help_text
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n')
    ran = agl_train("--engine", "third", *ARGS, "--third-knob", "4", "--runners", "0")
    assert ran.returncode == 7, ran.stderr
    assert json.loads(ran.stdout) == {
        "engine": "third", "agent": "my_agent:solve", "knob": 4, "tasks": 1, "iterations": 100000, "runners": 0
    }  # fmt: skip


def test_the_shared_options_are_the_cores_and_no_engines_own() -> None:
    """The core defines what every engine shares; an engine's own flags (torch's serving, devices) are its plug-in's."""
    shared = {action.dest for action in train_parser()._actions}  # pyright: ignore[reportPrivateUsage]
    expected = ["agent", "model", "tasks", "app_dir", "iterations", "output", "runners", "ray_placement", "workers"]
    expected += ["store_url", "serve_store", "proxy_token", "policy", "policies", "lr", "log_level", "engine"]
    assert set(expected) <= shared, set(expected) - shared
    for torch_only in ("backend", "vllm_url", "tool_parser_plugin", "lora_rank", "threads", "device", "tool_parser"):
        assert torch_only not in shared, torch_only


def test_an_engine_option_that_clashes_with_a_shared_one_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clash = (
        "from agentlightning.cli import EngineCapabilities, RunSpec\n"
        "class ClashSpec(RunSpec):\n"
        "    lr: float = 1e-3\n"
        "class Clash:\n"
        "    summary = 'redefines --lr'\n"
        "    spec = ClashSpec\n"
        "    capabilities = EngineCapabilities(honours=frozenset({'lr'}))\n"
        "    def train(self, spec):\n"
        "        return 0\n"
    )
    _install(tmp_path, "agentlightning-clash", {"clash": "agl_clash_engine:Clash"}, {"agl_clash_engine": clash})
    monkeypatch.syspath_prepend(str(tmp_path))
    line = _one_line_error(capsys, main(["train", "--engine", "clash", *ARGS]))
    assert line.startswith("error: agl train --engine clash: its spec redefines the shared option --lr;")


def test_a_shared_option_the_engine_does_not_honour_is_refused_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The third engine honours neither --lr nor --quiet: set, they are one line and its train never runs."""
    _install_third(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    line = _one_line_error(capsys, main(["train", "--engine", "third", *ARGS, "--lr", "0.5"]))
    assert line.startswith("error: agl train --engine third cannot honour --lr: this engine does not support it")
    line = _one_line_error(capsys, main(["train", "--engine", "third", *ARGS, "--runners", "ray"]))
    assert line.startswith("error: agl train --engine third cannot honour --runners ray:")


def test_a_train_function_is_not_a_plug_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine registered the old way (``train(args)``, the core defining its options) is named, not half-run."""
    old = "def train(args):\n    return 0\n"
    _install(tmp_path, "agentlightning-old", {"old": "agl_old_engine:train"}, {"agl_old_engine": old})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EngineNotFoundError, match="entry point agl_old_engine:train is not an engine plug-in"):
        load_engine("old")


def test_help_without_the_engine_lists_the_shared_options_and_names_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["train", "--engine", "nosuch", "--help"])
    captured = capsys.readouterr()
    assert code == 2 and "--agent AGENT" in captured.out
    assert captured.err.strip().endswith("; pip install agentlightning-nosuch")


def test_an_engine_that_is_not_installed_names_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(tmp_path, "agentlightning-other", {"other": "agl_fake_engine_other:train"}, {})
    monkeypatch.syspath_prepend(str(tmp_path))
    line = _one_line_error(capsys, main(["train", "--engine", "nosuch", *ARGS]))
    assert line.startswith("error: agl train --engine nosuch: no such engine is installed (installed: ")
    assert "other" in line and line.endswith("; pip install agentlightning-nosuch")


def test_without_any_engine_the_default_says_which_package_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import agentlightning.cli._engines as engines

    # A machine with the core alone: the metadata lists no engine at all.
    monkeypatch.setattr(engines, "entry_points", lambda group: [])
    line = _one_line_error(capsys, main(["train", *ARGS]))
    hint = f"pip install agentlightning-{DEFAULT_ENGINE}"
    assert line == f"error: agl train --engine {DEFAULT_ENGINE}: no such engine is installed; {hint}"


def test_an_engine_whose_package_does_not_import_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = "import agl_no_such_dependency_anywhere\n\ndef train(args):\n    return 0\n"
    _install(
        tmp_path,
        "agentlightning-broken",
        {"broken": "agl_fake_engine_broken:train", "missing": "agl_fake_engine_missing:train"},
        {"agl_fake_engine_broken": broken},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    line = _one_line_error(capsys, main(["train", "--engine", "broken", *ARGS]))
    assert "entry point agl_fake_engine_broken:train does not load" in line
    assert "agl_no_such_dependency_anywhere" in line and line.endswith("; pip install agentlightning-broken")
    line = _one_line_error(capsys, main(["train", "--engine", "missing", *ARGS]))
    assert "entry point agl_fake_engine_missing:train does not load" in line


def test_an_entry_point_that_is_not_a_plug_in_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install(tmp_path, "agentlightning-odd", {"odd": "agl_fake_engine_odd:TRAIN"}, {"agl_fake_engine_odd": "TRAIN = 3"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EngineNotFoundError, match="entry point agl_fake_engine_odd:TRAIN is not an engine plug-in"):
        load_engine("odd")
