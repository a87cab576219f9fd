"""trainer-torch's parts are layers: a part imports only the parts below it (read from the sources with ``ast``).

``models`` (loading, chat templates, LoRA, checkpoints, model files) < ``serving`` (the local backend and its
servings) < ``vllm`` (vLLM's server, syncs and servings) < ``training`` (PPO, policies, the engine, which picks a
serving) < ``runkit`` (what ``agl train`` and the examples share). Every import counts: at module level, inside a
function, or for type checking only (a type a part names is a part it depends on). The package's top-level modules
(``__init__``, the CLI entry points, ``testing``) sit above all parts.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "agentlightning_torch"
LAYERS = ("models", "serving", "vllm", "training", "runkit")
"""From the bottom up."""


def _imported_parts(path: Path) -> dict[str, int]:
    """The parts of this package ``path`` imports, each with the line of its first import."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "agentlightning_torch" and len(parts) > 1 and parts[1] in LAYERS:
                found.setdefault(parts[1], node.lineno)
    return found


def _upward_imports(package: Path) -> list[str]:
    wrong: list[str] = []
    for level, part in enumerate(LAYERS):
        for path in sorted((package / part).rglob("*.py")):
            for imported, line in sorted(_imported_parts(path).items(), key=lambda item: item[1]):
                if LAYERS.index(imported) > level:
                    wrong.append(f"{path.relative_to(package)}:{line}: {part} imports {imported}, a part above it")
    return wrong


def test_no_part_imports_a_part_above_it() -> None:
    assert all((PACKAGE / part / "__init__.py").is_file() for part in LAYERS)
    wrong = _upward_imports(PACKAGE)
    assert wrong == [], f"trainer-torch's layers are {' < '.join(LAYERS)}:\n" + "\n".join(wrong)


def test_the_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    for part in LAYERS:
        (tmp_path / part).mkdir()
        (tmp_path / part / "__init__.py").write_text("")
    (tmp_path / "serving" / "_a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agentlightning_torch.training._x import X\n"
        "def f():\n    import agentlightning_torch.vllm\n"
        "from agentlightning_torch import runkit\n"
        "from agentlightning_torch.models import y\n"
    )
    assert _upward_imports(tmp_path) == [
        "serving/_a.py:3: serving imports training, a part above it",
        "serving/_a.py:5: serving imports vllm, a part above it",
        "serving/_a.py:6: serving imports runkit, a part above it",
    ]
