"""The serving side of the core is an extra: one check, one install line.

What an agent's process needs (schema, tracing, adapters' base, runner, store client) installs with few dependencies;
the store server, the LLM proxy, the dashboard and the serving commands of ``agl`` need the ``serve`` extra (an ASGI
stack and ``rich``). Without it, they fail with `SERVE_INSTALL` in one line, never with a traceback about starlette.
"""

from __future__ import annotations

import importlib.util

__all__ = ["SERVE_INSTALL", "SERVE_MODULES", "missing_serve_modules", "require_serve", "serve_hint"]

SERVE_INSTALL = "pip install 'agentlightning-core[serve]'"
"""The command that installs the serving side."""

SERVE_MODULES = ("fastapi", "starlette", "uvicorn", "rich")
"""Top-level modules the serving side imports (starlette comes with fastapi)."""


def missing_serve_modules() -> list[str]:
    """Names in `SERVE_MODULES` that this environment cannot import."""
    missing: list[str] = []
    for name in SERVE_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses the name counts as missing
            found = False
        if not found:
            missing.append(name)
    return missing


def serve_hint(what: str, missing: list[str]) -> str:
    """One line saying that ``what`` needs the serving extra, and how to install it."""
    return f"{what}: the serving extra is not installed (no {', '.join(missing)}); install it: {SERVE_INSTALL}"


def require_serve(what: str) -> None:
    """Raise `ImportError` with the install line when the serving extra is not installed.

    Args:
        what: What needs it, as the user knows it (``"agl store serve"``, ``"LLMProxy"``).

    Raises:
        ImportError: A module of `SERVE_MODULES` is missing.
    """
    missing = missing_serve_modules()
    if missing:
        raise ImportError(serve_hint(what, missing))
