"""Test kits and test doubles shipped with the core, for every package's tests.

Names are loaded lazily so importing ``agentlightning.testing`` never pulls in pytest unless a kit is used.
The fixtures (``agl_harness``, ``agl_proxy``, ``agl_model_server``, ``agl_store``, ``agl_tracer``) come from the
pytest plugin `agentlightning.testing.pytest_plugin`, registered through the ``pytest11`` entry point.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlightning.testing._adapter_kit import AdapterConformanceTests, KitHarness, RunRecord
    from agentlightning.testing._attempts import start_attempts
    from agentlightning.testing._failover import FailoverReport, TcpFailover, run_failover
    from agentlightning.testing._guard import KitGuard, silent_overrides
    from agentlightning.testing._loop_kit import ScriptedServerEngine, chat_through_proxy
    from agentlightning.testing._model_server import ScriptedModelServer, ScriptedReply, ServedCall, ToyTokenizer
    from agentlightning.testing._netns import NetnsPair, netns_pair, why_no_netns
    from agentlightning.testing._postgres_server import PostgresServer, find_pg_bin
    from agentlightning.testing._raw_http import RawHttpServer, read_request
    from agentlightning.testing._store_kit import StoreConformanceTests, StoreFactory, make_call, make_span
    from agentlightning.testing._store_server import StoreServerProcessForTests, free_port
    from agentlightning.testing._wait import wait_until

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "StoreConformanceTests": "agentlightning.testing._store_kit",
    "AdapterConformanceTests": "agentlightning.testing._adapter_kit",
    "KitHarness": "agentlightning.testing._adapter_kit",
    "RunRecord": "agentlightning.testing._adapter_kit",
    "ScriptedModelServer": "agentlightning.testing._model_server",
    "ScriptedReply": "agentlightning.testing._model_server",
    "ToyTokenizer": "agentlightning.testing._model_server",
    "start_attempts": "agentlightning.testing._attempts",
    "ServedCall": "agentlightning.testing._model_server",
    "StoreServerProcessForTests": "agentlightning.testing._store_server",
    "PostgresServer": "agentlightning.testing._postgres_server",
    "NetnsPair": "agentlightning.testing._netns",
    "netns_pair": "agentlightning.testing._netns",
    "why_no_netns": "agentlightning.testing._netns",
    "FailoverReport": "agentlightning.testing._failover",
    "TcpFailover": "agentlightning.testing._failover",
    "run_failover": "agentlightning.testing._failover",
    "find_pg_bin": "agentlightning.testing._postgres_server",
    "free_port": "agentlightning.testing._store_server",
    "StoreFactory": "agentlightning.testing._store_kit",
    "make_call": "agentlightning.testing._store_kit",
    "make_span": "agentlightning.testing._store_kit",
    "KitGuard": "agentlightning.testing._guard",
    "silent_overrides": "agentlightning.testing._guard",
    "wait_until": "agentlightning.testing._wait",
    "ScriptedServerEngine": "agentlightning.testing._loop_kit",
    "chat_through_proxy": "agentlightning.testing._loop_kit",
    "RawHttpServer": "agentlightning.testing._raw_http",
    "read_request": "agentlightning.testing._raw_http",
}

__all__ = [
    "AdapterConformanceTests",
    "FailoverReport",
    "KitGuard",
    "KitHarness",
    "NetnsPair",
    "PostgresServer",
    "RawHttpServer",
    "RunRecord",
    "ScriptedModelServer",
    "ScriptedReply",
    "ScriptedServerEngine",
    "ServedCall",
    "StoreConformanceTests",
    "StoreFactory",
    "StoreServerProcessForTests",
    "TcpFailover",
    "ToyTokenizer",
    "chat_through_proxy",
    "find_pg_bin",
    "free_port",
    "make_call",
    "make_span",
    "netns_pair",
    "read_request",
    "run_failover",
    "silent_overrides",
    "start_attempts",
    "wait_until",
    "why_no_netns",
]


def __getattr__(name: str) -> Any:
    """The kits' names, imported on first use."""
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'agentlightning.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)
