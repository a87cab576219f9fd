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
