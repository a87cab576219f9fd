"""Each framework page's example runs with only what the page's own install line installs.

The cheap form of "run each page in the venv it tells the reader to make": instead of a fresh venv per page (a wheel
build and a few hundred MB from the package index, minutes per page), the page's ``pip install`` line is read
(the wheels from ``dist/``, their extras, the other requirements), its dependency closure is computed from the
installed distributions' own metadata (``Requires-Dist`` with its markers and extras), and the page's python blocks
run in a fresh folder with an import guard: importing a top-level module that no distribution of that closure
provides (nor the standard library) fails as it would in the reader's venv, ``No module named ...``. A library's
optional import (``try: import x``) sees the same error a reader's venv gives it.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = sorted((ROOT / "docs" / "frameworks").glob("*.md"))

_spec = importlib.util.spec_from_file_location("_readme_blocks", ROOT / "tests" / "test_readme_blocks.py")
assert _spec is not None and _spec.loader is not None
readme_blocks = importlib.util.module_from_spec(_spec)
sys.modules["_readme_blocks"] = readme_blocks
_spec.loader.exec_module(readme_blocks)

# A wheel of this repository on a pip line: dist/agentlightning_core-*.whl, maybe inside "$(ls ...)[extras]".
_WHEEL = re.compile(r"dist/(agentlightning_\w+)-\*\.whl\)?(?:\[([\w,]+)\])?")


def install_requirements(page_text: str) -> list[Requirement]:
    """The requirements of the page's ``pip install`` lines (this repository's wheels by their distribution name)."""
    lines = [line for line in page_text.splitlines() if line.startswith("pip install ")]
    assert lines, "the page has no pip install line"
    found: list[Requirement] = []
    for line in lines:
        words = shlex.split(line.split("#", 1)[0], posix=False)[2:]
        for word in (w.strip("\"'") for w in words):
            if word.startswith("-"):
                continue
            wheel = _WHEEL.search(word)
            if wheel is not None:
                name = wheel.group(1).replace("_", "-")
                found.append(Requirement(f"{name}[{wheel.group(2)}]" if wheel.group(2) else name))
            else:
                found.append(Requirement(word))
    return found


def closure(requirements: list[Requirement]) -> set[str]:
    """Canonical names of the distributions those requirements install, read from the installed metadata."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [(req.name, frozenset(req.extras)) for req in requirements]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        names.add(canonicalize_name(name))
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            pytest.fail(f"{name} is not installed in this venv: the check cannot read its dependencies")
        for line in requires:
            req = Requirement(line)
            environments = [{"extra": extra} for extra in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in environments):
                todo.append((req.name, frozenset(req.extras)))
    return names


def importable(distributions: set[str]) -> set[str]:
    """Top-level module names those distributions provide (this repository's packages by their naming rule)."""
    modules = {
        module
        for module, owners in metadata.packages_distributions().items()
        if any(canonicalize_name(owner) in distributions for owner in owners)
    }
    for name in distributions:
        if name == "agentlightning-core":
            modules.add("agentlightning")
        elif name.startswith("agentlightning-"):
            modules.add(name.replace("-", "_"))
    return modules


_GUARD = """
import importlib.abc as _abc, os as _os, sys as _sys
from importlib.machinery import PathFinder as _PathFinder
_ALLOWED = set({allowed!r})
# Installed code lives in site-packages (and, in this repository's dev venv, on PYTHONPATH); the stdlib is elsewhere.
_INSTALLED = tuple(p for p in _sys.path if "site-packages" in p) + tuple(
    p for p in _os.environ.get("PYTHONPATH", "").split(_os.pathsep) if p
)
class _PageInstallGuard(_abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if path is not None or name in _ALLOWED:  # a submodule: its package was allowed
            return None
        spec = _PathFinder.find_spec(name)
        where = [] if spec is None else [spec.origin or "", *(spec.submodule_search_locations or [])]
        if any(w.startswith(_INSTALLED) for w in where):
            message = f"No module named {{name!r}} (the page's install line does not install it)"
            raise ModuleNotFoundError(message, name=name)
        return None
_sys.meta_path.insert(0, _PageInstallGuard())
"""


def guarded(block: Any, allowed: set[str]) -> Any:
    """The block with the import guard run first."""
    prelude = _GUARD.format(allowed=sorted(allowed))
    return readme_blocks.Block(block.readme, block.line, block.code, prelude + "\n" + block.prelude, block.epilogue)


def test_the_guard_refuses_what_the_line_does_not_install(tmp_path: Path) -> None:
    """Not vacuous: with only the core's lean install, the LLM proxy's server side cannot be imported."""
    allowed = importable(closure([Requirement("agentlightning-core")]))
    assert "fastapi" not in allowed and "agentlightning" in allowed
    (tmp_path / "a").mkdir()
    block = readme_blocks.Block(tmp_path / "page.md", 1, "import fastapi\n")
    done = readme_blocks.run_block(guarded(block, allowed), tmp_path / "a")
    assert done.returncode != 0 and "No module named 'fastapi'" in done.stderr, done.stderr[-2000:]
    (tmp_path / "b").mkdir()  # the core's own message for its missing extra, as a reader without [serve] sees it
    block = readme_blocks.Block(tmp_path / "page.md", 1, "from agentlightning.proxy import LLMProxy\nLLMProxy\n")
    done = readme_blocks.run_block(guarded(block, allowed), tmp_path / "b")
    assert done.returncode != 0 and "pip install 'agentlightning-core[serve]'" in done.stderr, done.stderr[-2000:]


def test_the_pip_line_is_read() -> None:
    text = (
        'pip install "$(ls dist/agentlightning_core-*.whl)[serve,openai]" dist/agentlightning_autogen-*.whl '
        '"autogen-ext[openai]"   # a comment\n'
    )
    assert [str(r) for r in install_requirements(text)] == [
        "agentlightning-core[openai,serve]", "agentlightning-autogen", "autogen-ext[openai]",
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("page", FRAMEWORKS, ids=[page.stem for page in FRAMEWORKS])
def test_the_page_runs_with_what_its_install_line_installs(page: Path, tmp_path: Path) -> None:
    allowed = importable(closure(install_requirements(page.read_text())))
    blocks = [block for block in readme_blocks.parse_blocks(page) if block.skip is None]
    assert blocks, f"{page.name} has no python block to run"
    for number, block in enumerate(blocks):
        workdir = tmp_path / str(number)
        workdir.mkdir()
        done = readme_blocks.run_block(guarded(block, allowed), workdir)
        assert done.returncode == 0, (
            f"{page.name}:{block.line} does not run with only what its install line installs:\n{done.stderr[-4000:]}"
        )
