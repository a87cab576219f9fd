"""One word per thing: "adapter" names a framework adapter (``agentlightning-langchain``...), never LoRA weights.

Read with the ``ast`` module (nothing is imported): no module, class, function, method, module-level name or
attribute set on ``self`` that the trainer packages define is named with "adapter". LoRA things are named LoRA
(`agentlightning_torch.LoRAPolicies`, ``load_lora_weights``, ``LocalBackend.load_lora``). Calls into peft and vLLM
keep their own names (``set_adapter``, ``load_lora_adapter``): only definitions are checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINERS = ("packages/trainer-torch/src", "packages/trainer-verl/src")


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _assigned(node: ast.stmt) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def _defined_names(tree: ast.Module) -> list[str]:
    """The names ``tree`` defines for others to use: classes, functions and methods, names assigned at module or
    class level, and ``self.X`` attributes (a function's local variables are its own business)."""
    names: list[str] = []
    for scope in [tree, *(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]:
        names += [target.id for stmt in scope.body for target in _assigned(stmt) if isinstance(target, ast.Name)]
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            names += [
                target.attr
                for target in _assigned(node)
                if isinstance(target, ast.Attribute) and _is_self(target.value)
            ]
    return names


def _adapter_names(src: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(src.rglob("*.py")):
        where = path.relative_to(src).as_posix()
        if "adapter" in path.stem.lower():
            found.append(f"{where} (the module's name)")
        for name in _defined_names(ast.parse(path.read_text(encoding="utf-8"))):
            if "adapter" in name.lower():
                found.append(f"{where}: {name}")
    return found


def test_the_trainers_name_lora_weights_lora_not_adapter() -> None:
    found = [hit for src in TRAINERS for hit in _adapter_names(ROOT / src)]
    assert not found, "'adapter' means a framework adapter; name LoRA things LoRA:\n" + "\n".join(found)


def test_the_check_sees_a_method_an_attribute_and_a_module(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_adapters.py").write_text("")
    (tmp_path / "pkg" / "serving.py").write_text(
        "class Backend:\n"
        "    def __init__(self):\n"
        "        self.adapter_versions = {}\n"
        "    def load_adapter(self, name):\n"
        "        self.model.set_adapter(name)\n"  # a call into peft: not a definition
    )
    assert _adapter_names(tmp_path) == [
        "pkg/_adapters.py (the module's name)",
        "pkg/serving.py: load_adapter",
        "pkg/serving.py: adapter_versions",
    ]
