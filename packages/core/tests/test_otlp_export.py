"""Spans also leave to an OpenTelemetry collector: a real OTLP/HTTP exporter against a tiny receiver on loopback."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

import agentlightning as agl
from agentlightning import semconv
from agentlightning.tracing import OTLP_ENDPOINT_ENV, OTLP_INSTALL, export_to_otlp, stop_otlp_export


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


class Receiver:
    """A minimal OTLP/HTTP trace receiver (protobuf over POST /v1/traces) on 127.0.0.1."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                got = [
                    {
                        "name": span.name,
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                        "events": [event.name for event in span.events],
                        "service": {a.key: _value(a.value) for a in rs.resource.attributes}.get("service.name"),
                    }
                    for rs in request.resource_spans
                    for ss in rs.scope_spans
                    for span in ss.spans
                ]
                with receiver._changed:
                    receiver.paths.append(self.path)
                    receiver.spans.extend(got)
                    receiver._changed.notify_all()
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait_for(self, predicate: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self.spans), timeout), f"collector got {self.spans}"
            return list(self.spans)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    rec.thread.start()
    yield rec
    stop_otlp_export(rec.url)
    rec.server.shutdown()
    rec.server.server_close()


@agl.rollout
async def tiny_agent(task: dict[str, Any], resources: Any) -> float:
    agl.emit_annotation(step="thinking")
    if task["fail"]:
        raise ValueError("tiny agent failed on purpose")
    return 0.5


async def test_runner_exports_spans_to_an_otlp_collector(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OTLP_ENDPOINT_ENV, receiver.url)  # the runner reads the collector from the environment
    store = agl.MemoryStore(agl.RetryPolicy(max_attempts=1))
    ok = await store.enqueue_rollout({"fail": False}, rollout_id="otlp-ok")
    bad = await store.enqueue_rollout({"fail": True}, rollout_id="otlp-bad")
    await agl.Runner(tiny_agent, store, n_workers=2, stop_when_idle=True, poll_interval=0.05).arun()

    def both_roots(spans: list[dict[str, Any]]) -> bool:
        roots = {s["attributes"].get(semconv.ROLLOUT_ID) for s in spans if s["name"] == "agentlightning.rollout"}
        return {ok.rollout_id, bad.rollout_id} <= roots

    spans = receiver.wait_for(both_roots)
    assert set(receiver.paths) == {"/v1/traces"}
    by_rollout: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_rollout.setdefault(span["attributes"].get(semconv.ROLLOUT_ID), []).append(span)
    rewards = [s for s in by_rollout[ok.rollout_id] if s["attributes"].get(semconv.SPAN_KIND) == semconv.KIND_REWARD]
    assert [r["attributes"][semconv.REWARD_VALUE] for r in rewards] == [0.5]
    assert any(s["attributes"].get("agentlightning.annotation.step") == "thinking" for s in by_rollout[ok.rollout_id])
    (failed_root,) = [s for s in by_rollout[bad.rollout_id] if s["name"] == "agentlightning.rollout"]
    assert "exception" in failed_root["events"]
    assert {s["service"] for s in spans} == {"agentlightning"}
    # the store got the same spans as always
    assert len(await store.query_spans(ok.rollout_id)) == len(by_rollout[ok.rollout_id])


def test_missing_exporter_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ImportError) as info:
        agl.Runner(tiny_agent, agl.MemoryStore(), otlp_endpoint="http://127.0.0.1:9/never-used")
    assert OTLP_INSTALL in str(info.value) and 'pip install "agentlightning-core[otlp]"' in str(info.value)
    with pytest.raises(ValueError, match="http"):
        export_to_otlp("127.0.0.1:4318")
