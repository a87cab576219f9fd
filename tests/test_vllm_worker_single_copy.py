"""The vLLM CPU weight-restore step exists once: the core's standalone worker file, used by both trainer packages.

It runs inside vLLM's worker process (trainer-torch's ``.venv-vllm`` has no ``agentlightning``), so it must import
nothing of ours; and no other source file may carry its own copy of the restore (the two copies once differed).
Scanned with ``ast`` / text only: nothing here needs torch, vLLM or verl.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT / "packages/core/src/agentlightning/vllm_worker/agl_vllm_worker.py"
# What only a copy of the restore step does, in code (not in strings): rebuild a linear layer's weight with vLLM's
# own loader (vLLM's WEIGHT_LOADER_V2_SUPPORTED, a quant method's create_weights, a layer's output_partition_sizes).
RESTORE_MARKERS = {"WEIGHT_LOADER_V2_SUPPORTED", "create_weights", "output_partition_sizes"}
ALLOWED_IMPORTS = {"torch", "safetensors", "vllm"} | set(sys.stdlib_module_names)


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            roots.add("." * node.level)  # a relative import: it would need a package around the file
    return roots


def _restore_code(path: Path) -> set[str]:
    """The restore step's markers that ``path``'s code uses (imported names, attributes, names)."""
    used: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            used.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.Name):
            used.add(node.id)
    return used & RESTORE_MARKERS


def test_the_shared_worker_file_imports_nothing_of_ours() -> None:
    assert SHARED.is_file()
    roots = _imported_roots(SHARED)
    assert {"torch", "vllm"} <= roots  # the scan sees the file's imports
    foreign = sorted(roots - ALLOWED_IMPORTS)
    assert foreign == [], f"{SHARED.relative_to(ROOT)} runs in vLLM's process and may not import {foreign}"


def test_no_second_copy_of_the_restore_step() -> None:
    copies = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.glob("packages/*/src/**/*.py")
        if path != SHARED and _restore_code(path)
    )
    assert _restore_code(SHARED) == RESTORE_MARKERS  # the scan recognises the step
    assert copies == [], f"a second copy of the vLLM weight-restore step (use {SHARED.name}): {copies}"


def test_both_trainers_use_the_shared_file() -> None:
    from agentlightning.vllm_worker_files import VLLM_WORKER_DIR, load_worker_module

    assert SHARED.parent == VLLM_WORKER_DIR
    torch_client = ROOT / "packages/trainer-torch/src/agentlightning_torch/vllm/_client.py"
    verl_worker = ROOT / "packages/trainer-verl/src/agentlightning_verl/_vllm_integration/worker.py"
    assert "VLLM_WORKER_DIR" in torch_client.read_text()
    assert load_worker_module.__name__ in verl_worker.read_text()
