"""Schemathesis fuzzing of the served store's OpenAPI schema: whatever the input, never a 5xx.

Runs the ASGI app in-process on a real SQLite file; generated bodies are valid and invalid (negative) data.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from agentlightning.store import SqliteStore
from agentlightning.store._server import create_store_app

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

_DB_DIR = tempfile.TemporaryDirectory(prefix="agl-fuzz-")
_STORE = SqliteStore(Path(_DB_DIR.name) / "fuzz.db")
app = create_store_app(_STORE, token=TOKEN, max_body_bytes=1024 * 1024)
schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_no_input_makes_the_server_fail(case: schemathesis.Case) -> None:
    response = case.call(headers=AUTH)
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}"
    case.validate_response(response, checks=[not_a_server_error])


def test_inputs_the_fuzzer_found_are_rejected_cleanly(tmp_path: Path) -> None:
    """Regressions: ints beyond 64 bits and NUL characters in ids used to reach SQLite and end in a 500."""
    from starlette.testclient import TestClient

    local = create_store_app(SqliteStore(tmp_path / "regress.db"), token=TOKEN)
    with TestClient(local, raise_server_exceptions=False, headers=AUTH) as http:
        assert http.post("/v1/rollouts/enqueue", json={"requests": [{"rollout_id": "r1"}]}).status_code == 200
        attempt = http.post("/v1/rollouts/dequeue", json={}).json()["claim"]["attempt"]["attempt_id"]
        before = http.get("/v1/stats").json()
        span = {
            "rollout_id": "r1",
            "attempt_id": attempt,
            "sequence_id": 2**70,
            "trace_id": "0" * 32,
            "span_id": "1" * 16,
            "name": "x",
            "start_time": 1.0,
            "end_time": 2.0,
        }
        resp = http.post("/v1/spans", json={"spans": [span]})
        assert resp.status_code == 422 and "too large" in resp.json()["message"]
        resp = http.post("/v1/rollouts/enqueue", json={"requests": [{"rollout_id": "bad\u0000id"}]})
        message = resp.json()["message"]
        assert resp.status_code == 422 and "rollout_id" in message and "control characters" in message
        resp = http.post("/v1/resources", json={"resources_id": "res\u0000"})  # the same id rule as a rollout's
        message = resp.json()["message"]
        assert resp.status_code == 422 and "resources_id" in message and "control characters" in message
        assert http.get("/v1/stats").json() == before


def test_a_tiny_throughput_bucket_is_refused_not_allocated(tmp_path: Path) -> None:
    """window / bucket is the length of the series the store builds: 86400 / 1e-9 buckets would exhaust memory."""
    from agentlightning.store import RunStatsQuery

    with pytest.raises(ValueError, match="buckets"):
        RunStatsQuery(window=86_400, bucket=1e-9)
    assert RunStatsQuery(window=86_400, bucket=8.64).bucket == 8.64  # exactly the most buckets: accepted
