"""Test kits and test doubles shipped with the core, for every package's tests.

Names are loaded lazily so importing ``agentlightning.testing`` never pulls in pytest unless a kit is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlightning.testing._adapter_kit import AdapterConformanceTests
    from agentlightning.testing._attempts import start_attempts
    from agentlightning.testing._model_server import ScriptedModelServer, ScriptedReply, ToyTokenizer
    from agentlightning.testing._store_kit import StoreConformanceTests

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "StoreConformanceTests": "agentlightning.testing._store_kit",
    "AdapterConformanceTests": "agentlightning.testing._adapter_kit",
    "ScriptedModelServer": "agentlightning.testing._model_server",
    "ScriptedReply": "agentlightning.testing._model_server",
    "ToyTokenizer": "agentlightning.testing._model_server",
    "start_attempts": "agentlightning.testing._attempts",
}

__all__ = [
    "AdapterConformanceTests",
    "ScriptedModelServer",
    "ScriptedReply",
    "StoreConformanceTests",
    "ToyTokenizer",
    "start_attempts",
]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'agentlightning.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)
