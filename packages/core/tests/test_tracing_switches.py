"""Switches in tracing are explicit: read through an accessor or declared through a typed protocol, never a module
global copied by ``from ... import`` or an attribute looked up by name.

- whether a span source was ever used is read through `source_in_use`;
- whether another processor on our provider reads our own spans is declared through `OwnSpanReader`, and an unknown
  processor that turns light spans off says so once in the log;
- a span source never sets the global provider itself (the adapter contract): the next rollout start does.
"""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import SpanProcessor

from agentlightning.adapters import GatedSpanProcessor
from agentlightning.tracing import OwnSpanReader, _genai
from agentlightning.tracing._provider import get_tracer_provider

_SRC = Path(__file__).resolve().parents[2]  # packages/


def test_a_registered_source_is_seen_through_the_accessor() -> None:
    registration = _genai.SourceRegistration("switch-test", lambda: False)
    _genai.register_source(("switch-test-scope",), registration)
    try:
        assert _genai.source_in_use()
    finally:
        _genai.unregister_source(("switch-test-scope",), "switch-test")
    assert _genai.source_in_use()  # spans it marked may still wait for conversion


def _rebound_globals(tree: ast.Module) -> set[str]:
    return {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}


def test_no_module_imports_a_rebound_module_global_by_name() -> None:
    """A name a module rebinds (``global x; x = ...``) read as ``from module import x`` is a copy that goes stale."""
    trees: dict[str, ast.Module] = {}
    for path in _SRC.glob("*/src/**/*.py"):
        parts = path.relative_to(_SRC).parts[2:]  # after "<package>/src"
        module = ".".join(parts[:-1] if parts[-1] == "__init__.py" else (*parts[:-1], path.stem))
        trees[module] = ast.parse(path.read_text(encoding="utf-8"))
    rebound = {module: _rebound_globals(tree) for module, tree in trees.items()}
    found = [
        f"{module}: from {node.module} import {alias.name}"
        for module, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in rebound
        for alias in node.names
        if alias.name in rebound[node.module]
    ]
    assert found == []
    assert "used" not in vars(_genai)  # the old flag, read as ``_genai.used``, is gone


def test_an_unknown_processor_turns_light_spans_off_once_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider: Any = get_tracer_provider()
    monkeypatch.setattr(provider, "others", [])
    assert provider.light_allowed() == provider.default_limits

    class AppExporter(SpanProcessor):  # the app's own processor: it receives our spans, so they take the SDK path
        pass

    with caplog.at_level(logging.INFO, logger="agentlightning.tracing._provider"):
        provider.add_span_processor(AppExporter())
    assert not provider.light_allowed()
    lines = [r.getMessage() for r in caplog.records if "light spans off" in r.getMessage()]
    assert lines == [
        "light spans off: test_an_unknown_processor_turns_light_spans_off_once_and_says_so.<locals>."
        "AppExporter also receives Agent Lightning's spans"
    ]
    caplog.clear()
    for _ in range(3):
        provider.light_allowed()
    assert not any("light spans off" in r.getMessage() for r in caplog.records)  # once per processor, not per span


def test_a_framework_span_mapper_declares_it_does_not_read_our_spans(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider: Any = get_tracer_provider()
    monkeypatch.setattr(provider, "others", [])
    mapper = GatedSpanProcessor()
    assert isinstance(mapper, OwnSpanReader) and not mapper.reads_own_spans()
    with caplog.at_level(logging.INFO, logger="agentlightning.tracing._provider"):
        provider.add_span_processor(mapper)
    assert provider.light_allowed() == provider.default_limits
    assert not any("light spans off" in r.getMessage() for r in caplog.records)


def test_the_otlp_exporter_declares_it_reads_our_spans_until_stopped() -> None:
    from agentlightning.tracing._otlp import _Switchable  # pyright: ignore[reportPrivateUsage]

    switchable = _Switchable(GatedSpanProcessor())
    assert isinstance(switchable, OwnSpanReader) and switchable.reads_own_spans()
    switchable.shutdown()
    assert not switchable.reads_own_spans()


_SOURCE_SCRIPT = textwrap.dedent(
    """
    import asyncio
    from opentelemetry import trace
    from opentelemetry.trace import ProxyTracerProvider
    from agentlightning.adapters import OpenAIV2Source
    from agentlightning.store import MemoryStore
    from agentlightning.testing import start_attempts
    from agentlightning.tracing import get_tracer_provider, rollout_context

    OpenAIV2Source.SCOPES = ("switch-test-scope",)  # no instrumentation package needed for the routing itself
    source = OpenAIV2Source()
    source._instrument()
    assert isinstance(trace.get_tracer_provider(), ProxyTracerProvider), "the source set the global provider"
    tracer = trace.get_tracer("switch-test-scope")  # the app's instrumentation took its tracer before any rollout

    async def main():
        store = MemoryStore()
        ((rollout_id, attempt_id),) = (await start_attempts(store, ["r-route"])).items()
        with rollout_context(store, rollout_id, attempt_id):  # the runner owns the process: routed now
            assert trace.get_tracer_provider() is get_tracer_provider()
            tracer.start_span("chat m", attributes={"gen_ai.operation.name": "chat"}).end()
        from agentlightning.tracing import aflush
        await aflush()
        print(sorted(s.name for s in await store.query_spans(rollout_id)))

    asyncio.run(main())
    source._uninstrument()
    """
)


def test_a_span_source_leaves_the_global_provider_to_the_rollout_start() -> None:
    """The adapter contract: instrumenting a source sets no global provider; the first rollout start routes the
    global one (ours, as the app set none) into the store, and a tracer taken before then follows it."""
    done = subprocess.run([sys.executable, "-c", _SOURCE_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['chat m']"
