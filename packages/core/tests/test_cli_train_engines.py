"""``agl train`` finds its engine through the ``agentlightning.engines`` entry-point group, never by package name.

Each test installs a throwaway distribution the way pip does (a ``*.dist-info`` folder with ``METADATA`` and
``entry_points.txt`` next to its module) into a folder put first on ``sys.path``, so ``importlib.metadata`` finds
it exactly as it finds an installed engine package.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlightning.cli import main
from agentlightning.cli._train import DEFAULT_ENGINE, EngineNotFoundError, load_engine
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


def test_an_engine_registered_in_the_group_runs_agl_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = (
        "def train(args):\n"
        "    print(f'fake engine trains {args.agent} on {args.model} (engine {args.engine})')\n"
        "    return 7\n"
    )
    _install(tmp_path, "agentlightning-fake", {"fake": "agl_fake_engine_ok:train"}, {"agl_fake_engine_ok": source})
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["train", "--engine", "fake", *ARGS])
    assert code == 7  # the engine's exit code is agl's
    assert capsys.readouterr().out.strip() == "fake engine trains my_agent:solve on some/model (engine fake)"


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
    import agentlightning.cli._train as train_cli

    # A machine with the core alone: the metadata lists no engine at all.
    monkeypatch.setattr(train_cli, "entry_points", lambda group: [])
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


def test_an_entry_point_that_is_not_a_function_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install(tmp_path, "agentlightning-odd", {"odd": "agl_fake_engine_odd:TRAIN"}, {"agl_fake_engine_odd": "TRAIN = 3"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EngineNotFoundError, match="entry point agl_fake_engine_odd:TRAIN is not a function"):
        load_engine("odd")
