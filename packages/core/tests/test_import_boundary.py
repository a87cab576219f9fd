"""The core never imports a framework, torch, verl or an optional driver: importing every core module must leave
them unloaded."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

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
