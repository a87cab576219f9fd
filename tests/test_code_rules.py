"""The workspace's written code rules, each checked (read with the ``ast`` module and as text; nothing is imported).

* A function fits on a screen: none in ``packages/*/src`` is longer than `MAX_FUNCTION_LINES`.
* No deprecated names: nothing in ``packages/*/src`` raises a `DeprecationWarning` or serves an old name through a
  module ``__getattr__`` (the renames are listed in ``CHANGELOG.md``).
* Every document the code points readers to is a file of this repository.
* Core's subpackages import each other's public names (at most `MAX_PRIVATE_REACH_INS` private reach-ins).
* One name per thing: no two classes in ``packages/*/src`` share a name, across packages, public or private
  (`SAME_CLASS_NAME_ALLOWED` lists the deliberate ones, each with its reason).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MAX_FUNCTION_LINES = 80
"""Longest function or method, from its ``def`` line to the end of its body (``docs/contributing.md``, "Rules that
are tests")."""


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
    """A long function reads as a list of named phases, each its own function (``docs/contributing.md``)."""
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
    lines = ["class C:", "    def long(self):", *(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))]
    (tmp_path / "m.py").write_text("\n".join(lines) + "\n")
    assert _function_lengths(tmp_path / "m.py") == [("C.long", MAX_FUNCTION_LINES + 1)]


# ------------------------------------------------------------------------------------------------ deprecations
WARNING_CLASSES = {"DeprecationWarning", "PendingDeprecationWarning", "FutureWarning"}
LAZY_MODULE_GETATTR = {"packages/core/src/agentlightning/testing/__init__.py": "imports the kits on first use"}
"""Modules whose ``__getattr__`` is allowed, with the reason: a module ``__getattr__`` was how old names were served."""


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _deprecations(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line: what`` of every deprecated name served in ``paths``: a deprecation warning raised, a helper that
    warns of a rename, or a module ``__getattr__`` outside `LAZY_MODULE_GETATTR`."""
    found: list[str] = []
    for path in paths:
        tree = _tree(path)
        where = str(path.relative_to(root))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
            if _called(node) == "warn_renamed" or any(
                isinstance(v, ast.Name) and v.id in WARNING_CLASSES for v in arguments
            ):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:100]}")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and where not in LAZY_MODULE_GETATTR:
                found.append(f"{where}:{node.lineno}: a module __getattr__")
    return found


def test_no_deprecated_name_remains() -> None:
    """0.1.0 was never published: a renamed name is simply renamed (``CHANGELOG.md`` keeps the renames), never kept
    as a deprecated alias that warns."""
    found = _deprecations(_sources())
    assert found == [], "deprecated names (remove them; CHANGELOG.md says what replaced them):\n" + "\n".join(found)


def test_the_deprecation_scan_sees_each_way_of_keeping_an_old_name(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import warnings\n"
        "def __getattr__(name):\n"
        "    warnings.warn('old is deprecated', DeprecationWarning, stacklevel=2)\n"
        "def f():\n"
        "    warn_renamed('a', 'b', removed_in='0.3.0')\n"
        "    warnings.warn('x', category=FutureWarning)\n"
        "    warnings.warn('a user mistake', UserWarning)\n"
    )
    found = _deprecations([tmp_path / "m.py"], tmp_path)
    assert [line.split(":")[1] for line in found] == ["3", "5", "6", "2"], found


# ------------------------------------------------------------------------------------------ documents referred to
SCANNED = ("packages/*/src/**/*", "scripts/**/*", "examples/**/*", "benchmarks/**/*")
TESTS = ("packages/*/tests/**/*.py", "tests/**/*.py")
"""Also read for `NAMED_DOCUMENT` only (test fixtures name made-up ``.md`` files): the rules' own docs included."""
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".yaml", ".yml", ".json", ".sh", ".cfg", ".ini", ".js", ".html"}
MARKDOWN_PATH = re.compile(r"(?<![\w./-])((?:\.\.?/)*[\w-][\w./-]*\.md)\b")
OUTSIDE = re.compile(r"(?<![\w.])\.\./shared\b|(?<![\w./-])shared/notes/")
DOCUMENT_NAMES = ("CONVENTIONS.md", "DESIGN.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "STYLE.md")
NAMED_DOCUMENT = re.compile(r"\b(" + "|".join(name.removesuffix(".md") for name in DOCUMENT_NAMES) + r")\b(?!\.md)")
"""A document named by its stem, without ``.md``: it must be a file of the repository too."""


def _referred_files() -> list[Path]:
    files = {p for pattern in SCANNED for p in ROOT.glob(pattern) if p.is_file() and p.suffix in TEXT_SUFFIXES}
    skipped = {"__pycache__", ".venv", "node_modules"}  # installed code (npm ci in examples/node) is not ours
    return sorted(p for p in files if not skipped.intersection(p.parts))


def _resolves(path: Path, name: str) -> bool:
    """Whether ``name`` is a file of the repository, read from ``path``'s folder or any folder above it."""
    folder = path.parent
    while True:
        target = (folder / name).resolve()
        if target.is_file() and ROOT in target.parents:
            return True
        if folder == ROOT:
            return False
        folder = folder.parent


def _unnamed_documents(where: str, line: str) -> list[str]:
    return [
        f"{where}: {m.group(1)} (no {m.group(1)}.md in the repository)"
        for m in NAMED_DOCUMENT.finditer(line)
        if not any(ROOT.glob(f"*/{m.group(1)}.md")) and not (ROOT / f"{m.group(1)}.md").exists()
    ]


def test_every_document_the_code_refers_to_is_in_the_repository() -> None:
    """A ``.md`` path named in code, comments or docs resolves to a file of this repository (read from the naming
    file's folder or one above it, up to the root), and nothing points outside it (``../shared``, notes)."""
    files = _referred_files()
    assert any(p.name == "_store.py" for p in files)
    broken: list[str] = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            where = f"{path.relative_to(ROOT)}:{number}"
            broken += [f"{where}: {m.group(0)} (outside the repository)" for m in OUTSIDE.finditer(line)]
            broken += _unnamed_documents(where, line)
            broken += [
                f"{where}: {m.group(1)}" for m in MARKDOWN_PATH.finditer(line) if not _resolves(path, m.group(1))
            ]
    tests = sorted({p for pattern in TESTS for p in ROOT.glob(pattern)})
    for path in tests:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            broken += _unnamed_documents(f"{path.relative_to(ROOT)}:{number}", line)
    assert broken == [], "documents referred to that are not in the repository:\n" + "\n".join(sorted(set(broken)))


# ------------------------------------------------------------------------------------------- one name per class
SAME_CLASS_NAME_ALLOWED: dict[str, str] = {}
"""Class names (as `_class_key` spells them) defined more than once on purpose, with the reason. Keep this short."""


def _class_key(name: str) -> str:
    """A class name as a reader tells names apart: ``Route``, ``_Route`` and ``ROUTE`` are one name."""
    return name.replace("_", "").lower()


def _classes(paths: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """`_class_key` -> ``"file:line: Name"`` of every class defined in ``paths``, nested ones included."""
    found: defaultdict[str, list[str]] = defaultdict(list)
    for path in paths:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                found[_class_key(node.name)].append(f"{path.relative_to(root)}:{node.lineno}: {node.name}")
    return dict(found)


def _shared_class_names(classes: dict[str, list[str]]) -> dict[str, list[str]]:
    return {key: where for key, where in classes.items() if len(where) > 1 and key not in SAME_CLASS_NAME_ALLOWED}


def test_no_two_classes_share_a_name() -> None:
    """One name per thing (``docs/contributing.md``): two classes of one name are two things a reader (and a search, a
    traceback, the API reference) cannot tell apart, e.g. the proxy's ``Route`` of a call to a policy beside the
    servers' ``Route`` of an HTTP operation. Private classes count too, and the packages are read together."""
    classes = _classes(_sources())
    assert "storeserverprocess" in classes and "serving" in classes  # the scan sees core and the trainers
    shared = _shared_class_names(classes)
    assert shared == {}, "classes sharing a name (rename one, or allow it with a reason):\n" + "\n".join(
        "; ".join(where) for where in shared.values()
    )
    stale = sorted(key for key in SAME_CLASS_NAME_ALLOWED if len(classes.get(key, [])) < 2)
    assert stale == [], f"allowed shared class names no longer shared (remove them from the list): {stale}"


def test_the_class_name_check_reads_every_file_and_nested_classes(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class Route:\n    class Serving: ...\n")
    (tmp_path / "b.py").write_text("def f():\n    class _route: ...\n")
    (tmp_path / "c.py").write_text("class Routes: ...\n")
    classes = _classes(sorted(tmp_path.glob("*.py")), root=tmp_path)
    assert _shared_class_names(classes) == {"route": ["a.py:1: Route", "b.py:2: _route"]}


# ------------------------------------------------------------------------ core's subpackages meet at their faces
MAX_PRIVATE_REACH_INS = 20
"""Imports in one subpackage of core of another subpackage's private module (``from agentlightning.store._base import``
in ``agentlightning/proxy/``): what one subpackage needs of another is exported by its ``__init__``; the few left
are internals shared on purpose (the tracing internals the adapters hook into, the store's server app)."""


def _private_reach_ins(core: Path) -> list[str]:
    """``file:line: module`` of every import of another core subpackage's ``_private`` module."""
    found: list[str] = []
    for path in sorted(core.rglob("*.py")):
        parts = path.relative_to(core).parts
        own = parts[0] if len(parts) > 1 else None
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{core.name}."):
                module = node.module.split(".")
                if len(module) > 2 and module[2].startswith("_") and module[1] != own:
                    found.append(f"{path.relative_to(core.parent)}:{node.lineno}: {node.module}")
    return found


def test_core_subpackages_import_each_other_through_their_faces() -> None:
    found = _private_reach_ins(ROOT / "packages/core/src/agentlightning")
    assert len(found) <= MAX_PRIVATE_REACH_INS, (
        f"{len(found)} imports of another subpackage's private module (at most {MAX_PRIVATE_REACH_INS}): export the "
        "name from that subpackage's __init__ and import it from there:\n" + "\n".join(found)
    )


def test_the_reach_in_count_sees_only_other_subpackages_private_modules(tmp_path: Path) -> None:
    core = tmp_path / "agentlightning"
    for sub in ("store", "proxy"):
        (core / sub).mkdir(parents=True)
        (core / sub / "__init__.py").write_text("")
    (core / "proxy" / "_proxy.py").write_text(
        "from agentlightning.store._base import LightningStore\n"  # counted
        "from agentlightning.store import StoreClient\n"  # the face
        "from agentlightning.proxy._transport import Transport\n"  # its own subpackage
        "from agentlightning._models import Span\n"  # core's top-level private modules are shared
    )
    assert _private_reach_ins(core) == ["agentlightning/proxy/_proxy.py:1: agentlightning.store._base"]
