"""``--runners ray``: the settings the Ray runner pool gets (the two-node run is in tests/test_ray_two_nodes.py).

The agent's folder (``agl train --app-dir``, an example's own folder) is shipped to the nodes as the runtime env's
``working_dir``; the run's output, when it lies inside that folder, is not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

from agentlightning.cli import train_parser
from agentlightning_torch.runkit import ray_settings, shipped_settings
from agentlightning_torch.runkit._ray_runners import _shipped  # pyright: ignore[reportPrivateUsage]


def _args(*extra: str) -> object:
    return train_parser().parse_args(["--agent", "m:f", "--model", "x", "--tasks", "t.jsonl", *extra])


def test_the_app_dir_is_shipped_as_the_working_dir_without_the_runs_output(tmp_path: Path) -> None:
    settings = ray_settings(_args("--runners", "ray=10.0.0.5:6379"))  # type: ignore[arg-type]
    assert settings.address == "10.0.0.5:6379" and settings.working_dir is None
    shipped = shipped_settings(settings, tmp_path, tmp_path / "runs" / "a")
    assert shipped.working_dir == tmp_path.resolve()
    assert shipped.excludes == ("/runs/a",)  # a run's checkpoints are never shipped to the nodes


def test_an_output_outside_the_app_dir_excludes_nothing(tmp_path: Path) -> None:
    settings = ray_settings(_args("--runners", "ray"))  # type: ignore[arg-type]
    assert shipped_settings(settings, tmp_path / "app", tmp_path / "out").excludes == ()


def test_the_runner_command_points_at_each_nodes_copy_of_the_shipped_folder(tmp_path: Path) -> None:
    cmd = ["python", "-m", "agentlightning.cli", "runner", "--app-dir", str(tmp_path.resolve()), "--agent", "m:f"]
    assert _shipped(cmd, tmp_path)[5] == "{app_dir}"  # the actor puts its working directory (Ray's copy) there
    assert _shipped(cmd, None) == cmd
