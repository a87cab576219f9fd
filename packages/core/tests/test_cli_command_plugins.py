"""``agl`` finds other packages' commands through the ``agentlightning.commands`` entry-point group.

Each test installs a throwaway distribution the way pip does (a ``*.dist-info`` folder with ``METADATA`` and
``entry_points.txt`` next to its module) into a folder put first on ``sys.path``, so ``importlib.metadata`` finds
it exactly as it finds an installed package (agentlightning-torch registers ``agl model`` this way).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentlightning.cli import COMMAND_ENTRY_POINTS, build_parser, main

HELLO = """
def register(subparsers):
    parser = subparsers.add_parser("hello", help="say hello")
    parser.add_argument("--name", default="world")
    parser.set_defaults(func=lambda args: print(f"hello {args.name}") or 5)
"""


def _install(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{COMMAND_ENTRY_POINTS}]\n{lines}")
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)


def test_a_registered_command_runs_and_is_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(tmp_path, "agentlightning-hello", {"hello": "agl_fake_hello_cmd:register"}, {"agl_fake_hello_cmd": HELLO})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "hello" in build_parser().format_help()
    assert main(["hello", "--name", "agl"]) == 5
    assert capsys.readouterr().out.strip() == "hello agl"


def test_options_and_help_reach_the_commands_own_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(
        tmp_path, "agentlightning-hello3", {"hello": "agl_fake_hello_cmd3:register"}, {"agl_fake_hello_cmd3": HELLO}
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        main(["hello", "--help"])
    assert exited.value.code == 0 and "--name" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main(["hello", "--nosuch"])
    assert exited.value.code == 2 and "unrecognized arguments: --nosuch" in capsys.readouterr().err


def test_the_package_is_imported_only_when_its_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install(
        tmp_path, "agentlightning-hello4", {"hello": "agl_fake_hello_cmd4:register"}, {"agl_fake_hello_cmd4": HELLO}
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "hello" in build_parser().format_help()
    assert "agl_fake_hello_cmd4" not in sys.modules  # `agl --help` stays as fast as the core's own commands
    assert main(["hello"]) == 5
    assert "agl_fake_hello_cmd4" in sys.modules


def test_a_broken_command_package_fails_its_command_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = "import agl_no_such_dependency_anywhere\n\ndef register(subparsers):\n    pass\n"
    _install(
        tmp_path,
        "agentlightning-broken-cmd",
        {"broken": "agl_fake_broken_cmd:register"},
        {"agl_fake_broken_cmd": broken},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "store" in build_parser().format_help()  # the core's commands are untouched
    assert main(["broken", "--anything"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("error: agl broken: agl_fake_broken_cmd:register (from agentlightning-broken-cmd) does")
    assert "agl_no_such_dependency_anywhere" in lines[0]


def test_a_package_cannot_shadow_a_core_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shadow = "def register(subparsers):\n    raise AssertionError('never called for a core name')\n"
    _install(
        tmp_path, "agentlightning-shadow", {"store": "agl_fake_shadow_cmd:register"}, {"agl_fake_shadow_cmd": shadow}
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "store" in build_parser().format_help()
