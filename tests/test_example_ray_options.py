"""Every example's training script takes the Ray runner options of ``agl train`` (issue 43): ``--runners
ray[=ADDRESS] --runner-processes N --runner-cpus C --ray-placement``, mapped to `RunSettings.ray` by
`agentlightning_torch.runkit.ray_settings` (no Ray cluster is started here)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("ray")

RAY = ["--runners", "ray=10.0.0.5:6379", "--runner-processes", "3", "--runner-cpus", "0.5", "--ray-placement", "pack"]


def _parse(example: str, module: Any, argv: list[str]) -> Any:
    return module.parse_train_args(argv) if example == "math" else module.parse_args(argv)


@pytest.mark.parametrize("example", ["calc", "sql", "rag", "math"])
def test_an_example_maps_the_ray_runner_options(example: str, example_script: Any, tmp_path: Any) -> None:
    from agentlightning_torch.runkit import RayRunnerSettings, ray_settings

    if example in ("sql", "calc"):
        pytest.importorskip("langgraph")
    module = example_script(example, "train")
    args = _parse(example, module, ["--output", str(tmp_path), *RAY])
    assert args.runners == 0 and args.runners_ray  # no local runner process: Ray's actors run the agent
    assert ray_settings(args) == RayRunnerSettings(address="10.0.0.5:6379", processes=3, cpus=0.5, placement="pack")
    module.build_config(args)  # no local runner is not refused when Ray runs them
    local = _parse(example, module, ["--output", str(tmp_path), "--runners", "2"])
    assert local.runners == 2 and ray_settings(local) is None
    default = _parse(example, module, ["--output", str(tmp_path), "--runners", "ray"])
    assert ray_settings(default) == RayRunnerSettings(address=None, processes=1, cpus=1.0, placement="spread")
