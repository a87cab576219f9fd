"""The package shows its parts: ``models``, ``serving``, ``vllm``, ``training`` and ``runkit`` subpackages, each with
its own public names, and every one of them also importable from ``agentlightning_torch`` itself."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentlightning_torch
from agentlightning_torch import models, runkit, serving, training, vllm

PACKAGE = Path(agentlightning_torch.__file__).parent
PARTS = {"models": models, "serving": serving, "vllm": vllm, "training": training, "runkit": runkit}
TOP_MODULES = {"__init__.py", "cli.py", "model_cli.py", "doctor_cli.py", "testing.py"}
"""The modules that stay at the top: the package's names, three CLI entry points (``agl train``'s plug-in,
``agl model``, ``agl doctor``'s plug-in), and the test kit."""


def test_the_top_of_the_package_holds_only_its_parts_and_entry_points() -> None:
    modules = {path.name for path in PACKAGE.glob("*.py")}
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert modules == TOP_MODULES, f"a module outside the parts: {sorted(modules - TOP_MODULES)}"
    assert folders == set(PARTS)


def test_every_public_name_has_one_part_and_the_same_object_at_the_top() -> None:
    homes: dict[str, list[str]] = {}
    for part_name, part in PARTS.items():
        for name in part.__all__:
            assert hasattr(part, name), f"agentlightning_torch.{part_name}.__all__ names a missing {name}"
            homes.setdefault(name, []).append(part_name)
    assert not {name: parts for name, parts in homes.items() if len(parts) > 1}, "a name exported by two parts"
    top = set(agentlightning_torch.__all__) - {"__version__"}
    assert top - set(homes) == set(), "a top-level name no part exports"
    for name in top:
        assert getattr(agentlightning_torch, name) is getattr(PARTS[homes[name][0]], name), name


@pytest.mark.parametrize(
    "old",
    [
        "VLLMServing",
        "PolicyAdapters",
        "load_adapter_weights",
        "VLLMAdapterError",
        "LoraSettings",  # one casing: LoRASettings beside LoRAPolicies
        "Serving",  # core's agentlightning.loop.Serving is the one contract
        "VLLM_LORA_ARGS",  # vllm_lora_args(adapters, rank)
    ],
)
def test_an_old_name_is_gone(old: str) -> None:
    """Renamed before any release: the old name is not kept as an alias (CHANGELOG.md lists what replaced it)."""
    with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
        getattr(agentlightning_torch, old)
