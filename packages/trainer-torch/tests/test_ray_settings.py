"""``agl train --runners ray``: the settings the CLI gives the Ray runner pool (the two-node run is in tests/)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

from agentlightning.cli import build_parser
from agentlightning_torch.cli import _ray_settings  # pyright: ignore[reportPrivateUsage]
from agentlightning_torch.runkit._ray_runners import _shipped  # pyright: ignore[reportPrivateUsage]


def _args(*extra: str) -> object:
    return build_parser().parse_args(["train", "--agent", "m:f", "--model", "x", "--tasks", "t.jsonl", *extra])


def test_the_app_dir_is_shipped_as_the_working_dir_without_the_runs_output(tmp_path: Path) -> None:
    args = _args("--runners", "ray=10.0.0.5:6379", "--app-dir", str(tmp_path), "--output", str(tmp_path / "runs" / "a"))
    settings = _ray_settings(args)  # type: ignore[arg-type]
    assert settings.address == "10.0.0.5:6379" and settings.working_dir == tmp_path.resolve()
    assert settings.excludes == ("/runs/a",)  # a run's checkpoints are never shipped to the nodes


def test_an_output_outside_the_app_dir_excludes_nothing(tmp_path: Path) -> None:
    args = _args("--runners", "ray", "--app-dir", str(tmp_path / "app"), "--output", str(tmp_path / "out"))
    assert _ray_settings(args).excludes == ()  # type: ignore[arg-type]


def test_the_runner_command_points_at_each_nodes_copy_of_the_shipped_folder(tmp_path: Path) -> None:
    cmd = ["python", "-m", "agentlightning.cli", "runner", "--app-dir", str(tmp_path.resolve()), "--agent", "m:f"]
    assert _shipped(cmd, tmp_path)[5] == "{app_dir}"  # the actor puts its working directory (Ray's copy) there
    assert _shipped(cmd, None) == cmd
