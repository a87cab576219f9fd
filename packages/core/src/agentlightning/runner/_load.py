"""`load_agent`: the agent function named by ``module:function``, as ``agl runner --agent`` takes it."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["load_agent"]


def load_agent(spec: str, app_dir: str = ".") -> Any:
    """The object named by ``module:attribute`` (``app_dir`` first on ``sys.path``).

    Raises:
        ValueError: With a one-line reason when the spec is malformed or names nothing importable.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"an agent must look like module:function (e.g. my_pkg.agent:solve), got {spec!r}")
    path = os.path.abspath(app_dir)
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for --agent (from {path}): {exc}") from None
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no {attribute!r} (from --agent {spec})") from None
    if not callable(obj):
        raise ValueError(f"--agent {spec} is not callable")
    return obj
