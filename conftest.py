"""Root pytest configuration: tests marked ``gpu`` run only where CUDA is available."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in gpu_items:
        item.add_marker(skip)


# The core's pytest plugin comes in through its ``pytest11`` entry point; an editable install made before that
# entry point existed lacks it (reinstall with `.venv/bin/python -m pip install --no-deps -e packages/core`).
if not any(
    ep.value == "agentlightning.testing.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11")
):
    pytest_plugins = ["agentlightning.testing.pytest_plugin"]
