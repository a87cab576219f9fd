"""Root pytest configuration: tests marked ``gpu`` run only where CUDA is available."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

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


_EXAMPLES = Path(__file__).resolve().parent / "examples"
_SHARED_NAMES = frozenset(
    stem for stem in {path.stem for path in _EXAMPLES.glob("*/*.py")} if len(list(_EXAMPLES.glob(f"*/{stem}.py"))) > 1
)
"""Module names more than one example uses (``train``, ``agent``, ``run_agents`` ...)."""


def _drop_shared_example_modules() -> None:
    for name in _SHARED_NAMES:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(_EXAMPLES):
            del sys.modules[name]


@pytest.fixture(autouse=True)
def _fresh_example_modules() -> Iterator[None]:
    """Each test imports its own example's ``train`` / ``agent`` / ... module, not one another example left behind.

    A test puts its example's folder first on ``sys.path`` and imports; a module of the same name that another
    example's test left in ``sys.modules`` would be taken instead, so those shared names are dropped around each
    test (a test module that bound one at import time keeps the module object it imported), and ``sys.path`` is
    put back as it was after each test.
    """
    path = list(sys.path)
    _drop_shared_example_modules()
    yield
    _drop_shared_example_modules()
    sys.path[:] = path  # a folder a test (or `agl train`'s --app-dir, run in-process) put first goes again
