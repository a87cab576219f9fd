"""Examples name their modules uniquely, so one process (a test run, a notebook) can import several examples.

Entry scripts (``train.py``, ``make_data.py``) share names across examples; they are run by path
(``python examples/<x>/train.py``) and no module imports them by name.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ENTRY_SCRIPTS = {"train", "make_data"}


def _modules() -> list[Path]:
    return sorted(EXAMPLES.glob("*/*.py"))


def test_only_entry_scripts_share_a_module_name() -> None:
    counts = Counter(path.stem for path in _modules())
    shared = {stem for stem, count in counts.items() if count > 1}
    assert shared <= ENTRY_SCRIPTS, f"rename per example: {sorted(shared - ENTRY_SCRIPTS)}"


def test_no_example_module_imports_an_entry_script_by_name() -> None:
    offenders: list[str] = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(EXAMPLES)}: import {name}" for name in names if name in ENTRY_SCRIPTS]
    assert offenders == []
