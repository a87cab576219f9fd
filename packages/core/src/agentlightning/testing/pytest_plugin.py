"""pytest fixtures for adapter and agent tests, registered through the ``pytest11`` entry point of the core.

Installing ``agentlightning-core[test]`` (pytest, pytest-asyncio) makes these fixtures available to every test,
with no import and no conftest:

- ``agl_script``: what the scripted model answers (override it in a test module or class; default: the
  server's echo reply);
- ``agl_model_server``: a running `ScriptedModelServer` on 127.0.0.1 answering with ``agl_script``;
- ``agl_store``: a fresh `MemoryStore`;
- ``agl_proxy``: a started `LLMProxy` in front of ``agl_model_server`` writing to ``agl_store``;
- ``agl_harness``: a `KitHarness` over the three: ``run(agent, task)`` runs ``agent(base_url, task)`` inside a
  fresh rollout with its per-rollout proxy URL, ``collect(record)`` reads back spans, calls and transitions,
  ``instrumented(adapter, ...)`` instruments adapters for a ``with`` block;
- ``agl_tracer``: a tracer whose spans, started inside a rollout, are stored in that rollout's store;
- ``agl_postgres``: one `PostgresServer` for the whole test session (skipped where PostgreSQL's server programs
  or the psycopg driver are not installed); ``agl_postgres.new_schema()`` gives a DSN of a fresh, empty store.

Async fixtures need pytest-asyncio (an async test is collected in its ``auto`` mode, or marked
``@pytest.mark.asyncio`` in ``strict`` mode). Heavy imports happen inside the fixtures, so a pytest run that
uses none of them pays nothing for this plugin.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from agentlightning.proxy import LLMProxy
    from agentlightning.store import MemoryStore
    from agentlightning.testing._adapter_kit import KitHarness
    from agentlightning.testing._model_server import Script, ScriptedModelServer
    from agentlightning.testing._postgres_server import PostgresServer

__all__ = [
    "agl_harness",
    "agl_model_server",
    "agl_postgres",
    "agl_proxy",
    "agl_script",
    "agl_store",
    "agl_tracer",
]

_NEEDS_ASYNCIO = "agentlightning's async pytest fixtures need pytest-asyncio: pip install 'agentlightning-core[test]'"

try:
    import pytest_asyncio

    _async_fixture: Any = pytest_asyncio.fixture
except ImportError:  # the sync fixtures still work; the async ones say what to install
    pytest_asyncio = None
    _async_fixture = pytest.fixture


@pytest.fixture
def agl_script() -> Script:
    """The scripted model's reply to each request body; ``None`` keeps the server's default echo reply."""
    return None


@pytest.fixture
def agl_model_server(agl_script: Script) -> Iterator[ScriptedModelServer]:
    """A `ScriptedModelServer` on 127.0.0.1, running for the test and stopped after it."""
    from agentlightning.testing._model_server import ScriptedModelServer

    with ScriptedModelServer(agl_script) as server:
        yield server


@pytest.fixture
def agl_store() -> MemoryStore:
    """A fresh in-memory store."""
    from agentlightning.store import MemoryStore

    return MemoryStore()


@_async_fixture
async def agl_proxy(agl_store: MemoryStore, agl_model_server: ScriptedModelServer) -> AsyncIterator[LLMProxy]:
    """A started `LLMProxy` forwarding to ``agl_model_server`` and recording calls into ``agl_store``."""
    if pytest_asyncio is None:
        pytest.fail(_NEEDS_ASYNCIO)
    from agentlightning.proxy import LLMProxy

    async with LLMProxy(agl_store, [agl_model_server.base_url]) as proxy:
        yield proxy


@pytest.fixture
def agl_harness(agl_model_server: ScriptedModelServer, agl_proxy: LLMProxy, agl_store: MemoryStore) -> KitHarness:
    """Runs agents inside rollouts against the proxy and builds their transitions (see `KitHarness`)."""
    from agentlightning.testing._adapter_kit import KitHarness

    return KitHarness(agl_model_server, agl_proxy, agl_store)


@pytest.fixture
def agl_tracer() -> Tracer:
    """A tracer of Agent Lightning's provider: spans started inside a rollout land in that rollout's store."""
    from agentlightning.adapters import lightning_tracer

    return lightning_tracer("agentlightning.pytest")


@pytest.fixture(scope="session")
def agl_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server started once for the test session and stopped at its end.

    Skipped where ``initdb`` / ``pg_ctl`` (Debian: ``apt-get install postgresql``) or the driver
    (``pip install "agentlightning-core[postgres]"``) are missing, and failed there when the ``CI`` environment
    variable is set. Its data is scratch: ``fsync`` is off, which only matters if the machine itself crashes (a
    killed store server is what the tests exercise).
    """
    import importlib.util

    from agentlightning.testing._postgres_server import PostgresServer, find_pg_bin

    # Under CI (``CI`` set) a missing server or driver fails the tests that need it instead of skipping them.
    missing = pytest.fail if os.environ.get("CI") else pytest.skip
    if find_pg_bin() is None:
        missing("PostgreSQL's server programs are not installed (apt-get install postgresql)")
    if importlib.util.find_spec("psycopg") is None or importlib.util.find_spec("psycopg_pool") is None:
        missing('the PostgreSQL driver is not installed (pip install "agentlightning-core[postgres]")')
    with PostgresServer(settings={"fsync": "off"}) as server:
        yield server
