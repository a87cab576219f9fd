"""Dashboard support in the store and the served app: schema migration, the /ui files, the explain endpoint."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentlightning import semconv
from agentlightning._models import LLMCall, Span
from agentlightning.store import MemoryStore, RetryPolicy, RolloutQuery, SqliteStore
from agentlightning.testing import StoreServerProcessForTests
from agentlightning.ui import ExplainRequest, explain_attempt, load_assets

_TRACE = "0af7651916cd43dd8448eb211c80319c"

# The version-1 schema (before attempts kept their reward and model version), as older releases wrote it.
_V1_SCHEMA = """
CREATE TABLE rollouts (seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL UNIQUE, status TEXT NOT NULL,
    input TEXT NOT NULL, mode TEXT, group_id TEXT, resources_id TEXT, retry_count INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, metadata TEXT NOT NULL);
CREATE INDEX ix_rollouts_queue ON rollouts (seq) WHERE status = 'queuing';
CREATE TABLE attempts (attempt_id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL, sequence INTEGER NOT NULL,
    worker_id TEXT, status TEXT NOT NULL, start_time REAL NOT NULL, end_time REAL, last_heartbeat REAL NOT NULL,
    error TEXT) WITHOUT ROWID;
CREATE UNIQUE INDEX ix_attempts_rollout ON attempts (rollout_id, sequence);
CREATE INDEX ix_attempts_running ON attempts (last_heartbeat, start_time) WHERE status = 'running';
CREATE TABLE spans (rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL, span_id TEXT NOT NULL,
    sequence_id INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (rollout_id, attempt_id, span_id)) WITHOUT ROWID;
CREATE TABLE llm_calls (call_id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL,
    start_time REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX ix_llm_calls_rollout ON llm_calls (rollout_id, attempt_id, start_time);
CREATE TABLE resources (version INTEGER PRIMARY KEY, resources_id TEXT NOT NULL UNIQUE, data TEXT NOT NULL);
PRAGMA user_version = 1;
"""


def _span(rid: str, aid: str, seq: int, kind: str, parent: int | None = None, **attributes: Any) -> Span:
    return Span(
        rollout_id=rid,
        attempt_id=aid,
        sequence_id=seq,
        trace_id=_TRACE,
        span_id=f"{seq + 1:016x}",
        parent_id=None if parent is None else f"{parent + 1:016x}",
        name=f"{kind}-{seq}",
        start_time=100.0 + seq,
        end_time=100.5 + seq,
        attributes={semconv.SPAN_KIND: kind, **attributes},
    )


def _reward(rid: str, aid: str, seq: int, value: float) -> Span:
    return _span(rid, aid, seq, "reward", **{semconv.REWARD_VALUE: value, semconv.REWARD_FINAL: True})


def test_version_1_file_is_migrated_and_backfilled(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(_V1_SCHEMA)
    conn.execute(
        "INSERT INTO rollouts (rollout_id, status, input, mode, group_id, resources_id, retry_count, created_at, "
        "updated_at, metadata) VALUES ('old-1', 'succeeded', '\"q\"', 'train', 'g', NULL, 0, 1.0, 2.0, '{}')"
    )
    conn.execute("INSERT INTO attempts VALUES ('at-1', 'old-1', 1, 'w', 'succeeded', 1.0, 3.0, 3.0, NULL)")
    for span in (_reward("old-1", "at-1", 2, 0.25), _reward("old-1", "at-1", 4, 0.75)):
        conn.execute(
            "INSERT INTO spans VALUES (?, ?, ?, ?, ?)",
            (span.rollout_id, span.attempt_id, span.span_id, span.sequence_id, span.model_dump_json()),
        )
    call = LLMCall(call_id="c1", rollout_id="old-1", attempt_id="at-1", model_version=7)
    conn.execute("INSERT INTO llm_calls VALUES ('c1', 'old-1', 'at-1', 1.5, ?)", (call.model_dump_json(),))
    conn.commit()
    conn.close()

    async def check() -> None:
        store = SqliteStore(path)
        try:
            (row,) = (await store.list_rollouts()).rollouts
            assert (row.rollout_id, row.reward, row.model_version, row.attempts) == ("old-1", 0.75, 7, 1)
            assert (await store.list_rollouts(RolloutQuery(model_version=7))).total == 1
            stats = await store.run_stats()
            assert stats.versions[0].model_version == 7 and stats.versions[0].reward_mean == 0.75
            assert stats.versions[0].mode == "train"
        finally:
            await store.close()
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
        assert conn.execute("SELECT mode FROM attempts").fetchall() == [("train",)]
        conn.close()

    asyncio.run(check())


def _http(url: str, token: str | None = None, body: dict[str, Any] | None = None) -> tuple[int, Any, bytes]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_ui_files_open_api_behind_the_token(tmp_path: Path) -> None:
    assets = load_assets()
    assert {"index.html", "app.js", "app.css", "lib.js", "chart.js", "rollouts.js", "rollout.js"} <= set(assets)
    with StoreServerProcessForTests(tmp_path / "s.db", token="sesame") as server:
        status, headers, body = _http(server.url + "/ui")
        assert status == 200 and b'id="login-form"' in body
        assert headers["Content-Type"].startswith("text/html")
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        status, headers, body = _http(server.url + "/ui/app.js")
        assert status == 200 and headers["Content-Type"].startswith("text/javascript") and b"sessionStorage" in body
        assert _http(server.url + "/ui/missing.js")[0] == 404
        # no CDN, no remote fetch: every script and style the page loads comes from this origin
        for name, (content, _) in assets.items():
            text = content.decode().replace("http://www.w3.org/2000/svg", "")  # the SVG namespace, not a fetch
            assert "http://" not in text and "https://" not in text and "//cdn" not in text, name
        assert _http(server.url + "/v1/rollouts/list", body={})[0] == 401
        assert _http(server.url + "/v1/rollouts/list", token="wrong", body={})[0] == 401
        assert _http(server.url + "/v1/ui/explain", body={"rollout_id": "x"})[0] == 401
        status, _, body = _http(server.url + "/v1/rollouts/list", token="sesame", body={"limit": 5})
        assert status == 200 and json.loads(body) == {"total": 0, "offset": 0, "limit": 5, "rollouts": []}
        status, _, body = _http(server.url + "/v1/rollouts/list", token="sesame", body={"limit": 0})
        assert status == 422 and "limit" in json.loads(body)["message"]
        status, _, body = _http(server.url + "/v1/ui/explain", token="sesame", body={"rollout_id": "nope"})
        assert status == 404 and "nope" in json.loads(body)["message"]
        assert _http(server.url + "/v1/resources/all", token="sesame")[0] == 200
        assert f"dashboard: {server.url}/ui" in server.output()


async def _episode(store: MemoryStore, reward: float | None, fail: bool = False) -> str:
    claim = await store.dequeue_rollout("w")
    assert claim is not None
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    spans = [
        _span(rid, aid, 0, "rollout"),
        _span(rid, aid, 1, "agent", 0, **{semconv.GEN_AI_AGENT_NAME: "planner"}),
        _span(rid, aid, 2, "llm", 1, **{semconv.GEN_AI_RESPONSE_ID: f"r-{rid}-1"}),
        _span(rid, aid, 3, "agent", 0, **{semconv.GEN_AI_AGENT_NAME: "writer"}),
        _span(rid, aid, 4, "llm", 3, **{semconv.GEN_AI_RESPONSE_ID: f"r-{rid}-2"}),
    ]
    if reward is not None:
        spans.append(_reward(rid, aid, 5, reward))
    await store.add_spans(spans)
    await store.add_llm_calls(
        [
            LLMCall(call_id=f"c-{rid}-{i}", rollout_id=rid, attempt_id=aid, response_id=f"r-{rid}-{i}",
                    prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5], model_version=2, start_time=100.0 + i)
            for i in (1, 2)
        ]
    )  # fmt: skip
    await store.finish_attempt(rid, aid, "failed" if fail else "succeeded", "boom" if fail else None)
    return rid


async def test_explain_gives_group_credit_and_says_what_was_not_trained() -> None:
    store = MemoryStore(RetryPolicy(max_attempts=1))
    for _ in range(3):
        await store.enqueue_rollout("task", group_id="g")
    winner = await _episode(store, 1.0)
    loser = await _episode(store, 0.0)
    failed = await _episode(store, None, fail=True)

    result = await explain_attempt(store, ExplainRequest(rollout_id=winner))
    assert result.group_rollouts == 2 and result.final_reward == 1.0 and result.batch_note is None
    assert [(t.agent_name, t.in_batch) for t in result.transitions] == [("planner", True), ("writer", True)]
    assert all(t.advantage is not None and t.advantage > 0 for t in result.transitions)
    assert all(t.credit == 1.0 and t.model_version == 2 for t in result.transitions)
    assert "identical" in result.credit_strategies and "grpo" in result.estimators
    lost = await explain_attempt(store, ExplainRequest(rollout_id=loser))
    assert all(t.advantage is not None and t.advantage < 0 for t in lost.transitions)

    only_writer = await explain_attempt(store, ExplainRequest(rollout_id=winner, agent_filter="writer"))
    assert [t.agent_name for t in only_writer.transitions] == ["writer"]
    (planner_call,) = [c for c in only_writer.calls if not c.trained]
    assert planner_call.agent_name == "planner" and "filtered out" in (planner_call.reason or "")

    broken = await explain_attempt(store, ExplainRequest(rollout_id=failed))
    assert broken.batch_note is not None and "failed" in broken.batch_note
    assert len(broken.transitions) == 2 and not any(t.in_batch for t in broken.transitions)
    assert broken.group_rollouts == 2

    with pytest.raises((ValueError, KeyError), match="nonsense"):
        await explain_attempt(store, ExplainRequest(rollout_id=winner, credit="nonsense"))


async def test_dashboard_server_in_a_thread_reads_a_live_sqlite_file(tmp_path: Path) -> None:
    from agentlightning.ui import DashboardServer

    store = SqliteStore(tmp_path / "run.db")
    await store.enqueue_rollout("first", rollout_id="live-1")
    with DashboardServer(tmp_path / "run.db") as dashboard:
        assert dashboard.url == f"{dashboard.base_url}/ui#token={dashboard.token}" and dashboard.port > 0
        status, _, body = await asyncio.to_thread(_http, dashboard.url)  # the fragment is not sent
        assert status == 200 and b"login-form" in body
        base = dashboard.base_url
        await store.enqueue_rollout("second", rollout_id="live-2")  # written by the run while it serves
        token = dashboard.token
        status, _, body = await asyncio.to_thread(_http, base + "/v1/rollouts/list", token, {})
        assert status == 200 and [r["rollout_id"] for r in json.loads(body)["rollouts"]] == ["live-2", "live-1"]
    with pytest.raises(OSError):
        await asyncio.to_thread(urllib.request.urlopen, dashboard.url, None, 2)
    await store.close()
    with pytest.raises(ValueError, match="token"):
        DashboardServer(tmp_path / "run.db", host="0.0.0.0")


def test_core_wheel_ships_the_dashboard_files(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="hatchling builds the wheel (scripts/dev.py test installs it)")
    import subprocess
    import sys
    import zipfile

    core = Path(__file__).resolve().parent.parent
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(core),
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("agentlightning_core-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"agentlightning/ui/static/{name}" for name in load_assets()}
    assert shipped <= names, sorted(shipped - names)
