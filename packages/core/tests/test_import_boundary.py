"""The core never imports a framework, torch, verl or an optional driver: importing every core module must leave
them unloaded."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import agentlightning

FORBIDDEN = (
    "torch",
    "transformers",
    "verl",
    "vllm",
    "langchain",
    "langchain_core",
    "langgraph",
    "agents",
    "autogen_agentchat",
    "autogen_core",
    "litellm",
    "openai",
    # the PostgreSQL driver is an optional extra, imported only when a PostgresStore is opened
    "psycopg",
    "psycopg_pool",
)


def _all_core_modules() -> list[str]:
    walk = pkgutil.walk_packages(agentlightning.__path__, prefix="agentlightning.")
    return sorted(info.name for info in walk if not info.name.endswith(".__main__"))  # __main__ runs the CLI


def test_core_imports_no_framework() -> None:
    modules = _all_core_modules()
    assert "agentlightning.store" in modules  # the walk found the package
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"bad = sorted(n for n in {FORBIDDEN!r} if n in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.strip()
    assert loaded == "", f"core modules imported forbidden packages at import time: {loaded}"


def _imports_of(package: str) -> dict[str, set[str]]:
    """Module file -> every module it imports, at any depth of its code (lazy imports inside functions too)."""
    root = Path(agentlightning.__path__[0]) / package
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(root.parent))] = names
    return found


def _offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module, names in _imports_of(package).items()
        for name in names
        if any(name == banned or name.startswith(banned + ".") for banned in forbidden)
    )


def test_the_store_never_imports_the_dashboard() -> None:
    """The dashboard (agentlightning.ui) reads the store; the store serves the dashboard's routes only when given."""
    assert _offenders("store", ("agentlightning.ui",)) == []


def test_the_proxy_never_imports_the_store_server() -> None:
    """Shared server constants live in a neutral module (agentlightning._server_base), not in the store's server."""
    banned = ("agentlightning.store._server", "agentlightning.store._asgi", "agentlightning.store._server_dashboard")
    assert _offenders("proxy", banned) == []


# Packages the core may never import, at any depth, nor name in an import by string: the ML frameworks the trainer
# packages are built on, the agent frameworks the adapters hook, and every other package of the workspace.
FRAMEWORKS = (
    "torch",
    "transformers",
    "verl",
    "vllm",
    "ray",
    "peft",
    "langchain",
    "langchain_core",
    "langchain_openai",
    "langgraph",
    "agents",
    "autogen_agentchat",
    "autogen_core",
    "autogen_ext",
)
IMPORT_BY_NAME = {"import_module", "__import__", "find_spec", "import_string"}
CORE_SRC = Path(agentlightning.__path__[0])
# Files the core ships but never imports: they run in another program's process. The vLLM worker extension runs in
# vLLM's worker process and imports torch and vLLM there (tests/test_vllm_worker_single_copy.py checks it imports
# nothing of ours); the core only tells trainers where it is (agentlightning.vllm_worker_files).
STANDALONE = (CORE_SRC / "vllm_worker",)
PACKAGES = CORE_SRC.parents[2]  # packages/ (core/src/agentlightning -> packages)


def _trainer_names() -> list[str]:
    """Distribution and import names of every trainer package in the workspace (both spellings of each)."""
    names = {"agentlightning-torch", "agentlightning_torch", "agentlightning-verl", "agentlightning_verl"}
    for src in PACKAGES.glob("trainer-*/src/*/__init__.py"):
        module = src.parent.name
        names.update({module, module.replace("_", "-")})
    return sorted(names)


def _banned(module: str) -> bool:
    root = module.split(".")[0]
    return root in FRAMEWORKS or (root.startswith("agentlightning_") and root != "agentlightning")


def test_core_imports_no_framework_or_other_package_even_lazily_by_name() -> None:
    """No ``import`` anywhere in the core's code (inside functions too) and no ``importlib.import_module("...")``-like
    call with a literal name reaches a framework, a trainer or an adapter package: engines and adapters are found
    through entry points (``agentlightning.engines``, ``agentlightning.adapters``)."""
    offenders: list[str] = []
    for path in sorted(CORE_SRC.rglob("*.py")):
        if any(path.is_relative_to(folder) for folder in STANDALONE):
            continue
        where = path.relative_to(CORE_SRC.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named: list[str] = []
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named = [node.module]
            elif isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if called in IMPORT_BY_NAME:
                    named = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            offenders += [f"{where}:{node.lineno} imports {name}" for name in named if _banned(name)]
    assert offenders == [], "the core imports packages it must not know:\n" + "\n".join(offenders)


def test_core_never_names_a_trainer_package() -> None:
    """Not in code, strings or docs: the core finds trainer packages' engines through entry points only."""
    names = _trainer_names()
    assert "agentlightning_torch" in names
    offenders = [
        f"{path.relative_to(CORE_SRC.parent)}:{number}: {line.strip()}"
        for path in sorted(CORE_SRC.rglob("*"))
        if path.is_file() and path.suffix in {".py", ".md", ".txt", ".toml", ".json", ".js", ".html", ".css"}
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1)
        if any(name in line for name in names)
    ]
    assert offenders == [], "the core names a trainer package:\n" + "\n".join(offenders)
