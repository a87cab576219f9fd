"""Faults and bad input at the store: nothing lost silently, nobody in where they do not belong (issue 12).

Real parts: SQLite files, a real ``agl store serve`` process over loopback, raw HTTP bodies.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from pydantic import ValidationError

import agentlightning as agl
from agentlightning import LLMCall, Span
from agentlightning.store import (
    InvalidRequestError,
    MemoryStore,
    NotFoundError,
    PostgresStore,
    RolloutRequest,
    SqliteStore,
    StorageError,
    StoreClient,
)
from agentlightning.testing import StoreServerProcessForTests, make_call, make_span

TOKEN = "reliability-token-0123456789"
AGL = [sys.executable, "-c", "import sys; from agentlightning.cli import main; sys.exit(main())"]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[agl.LightningStore]:
    backend: agl.LightningStore
    if request.param == "memory":
        backend = MemoryStore()
    elif request.param == "sqlite":
        backend = SqliteStore(tmp_path / "s.db")
    else:
        backend = PostgresStore(request.getfixturevalue("agl_postgres").new_schema(), pool_size=2)
    yield backend
    await backend.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[StoreServerProcessForTests]:
    with StoreServerProcessForTests(tmp_path / "served.db", token=TOKEN) as server:
        yield server


async def _claim(store: agl.LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout("task")
    claim = await store.dequeue_rollout()
    assert claim is not None
    return claim.rollout.rollout_id, claim.attempt.attempt_id


async def _post(url: str, path: str, body: object) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1{path}", data=data, headers=headers) as resp:
        return resp.status, await resp.json()


# ------------------------------------------------------------------------------------------- NaN / Infinity


async def test_non_finite_numbers_are_refused_naming_the_field(store: agl.LightningStore) -> None:
    rid, aid = await _claim(store)
    good = make_span(rid, aid, 0)
    built = Span.model_construct(**{**good.__dict__, "start_time": math.nan, "end_time": math.nan})
    with pytest.raises(InvalidRequestError, match=r"0\.start_time"):  # made without validation: validated now
        await store.add_spans([built])
    with pytest.raises(InvalidRequestError, match="start_time"):
        await store.add_spans([{**good.model_dump(), "start_time": math.inf}])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="finite"):  # the model itself refuses it
        Span(**{**good.model_dump(), "attributes": {"score": math.nan}})
    with pytest.raises(InvalidRequestError, match=r"input\['scores'\]\[1\]"):
        await store.enqueue_rollout({"scores": [1.0, math.nan]})
    with pytest.raises(ValidationError, match=r"request\['temperature'\]"):
        LLMCall.model_validate({**make_call(rid, aid, 0, 1.0).model_dump(), "request": {"temperature": math.inf}})
    assert await store.query_spans(rid) == []  # nothing was stored half-way
    assert await store.add_spans([good]) == 1


async def test_served_store_answers_422_naming_the_non_finite_field(served: StoreServerProcessForTests) -> None:
    client = StoreClient(served.url, token=TOKEN)
    try:
        await client.enqueue_rollout("task")
        claim = await client.dequeue_rollout()
        assert claim is not None
        span = make_span(claim.rollout.rollout_id, claim.attempt.attempt_id, 0).model_dump(mode="json")
        raw = json.dumps({"spans": [span]}, separators=(",", ":")).replace(
            '"start_time":1700000000.0', '"start_time":NaN'
        )
        assert "NaN" in raw
        status, answer = await _post(served.url, "/spans", raw)
        assert status == 422 and "spans.0.start_time" in str(answer["message"])
        status, answer = await _post(served.url, "/rollouts/enqueue", '{"requests":[{"input":{"x":Infinity}}]}')
        assert status == 422 and "input" in str(answer["message"]) and "non-finite" in str(answer["message"])
        assert await client.query_spans(claim.rollout.rollout_id) == []
    finally:
        await client.close()


async def test_one_unreadable_row_does_not_hide_the_rest_of_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = SqliteStore(path)
    rid, aid = await _claim(store)
    await store.add_spans([make_span(rid, aid, i) for i in (0, 2)])
    await store.add_llm_calls([make_call(rid, aid, 0, 1.0)])
    # rows as an older version (JSON text) stored them: one readable, and one with a NaN time stored as null
    legacy = [make_span(rid, aid, 1).model_dump(mode="json"), make_span(rid, aid, 3).model_dump(mode="json")]
    legacy[0]["start_time"] = None
    call = make_call(rid, aid, 1, 2.0).model_dump(mode="json")
    call["prompt_token_ids"] = None
    with sqlite3.connect(path) as raw:
        (attempt_key,) = raw.execute("SELECT attempt_key FROM span_attempts WHERE attempt_id = ?", (aid,)).fetchone()
        for span in legacy:
            raw.execute(
                "INSERT INTO spans VALUES (?, ?, ?, ?)",
                (attempt_key, int(span["span_id"], 16) - 2**63, span["sequence_id"], json.dumps(span)),
            )
        raw.execute(
            "INSERT INTO llm_calls (call_id, rollout_id, attempt_id, start_time, data) VALUES (?, ?, ?, 2.0, ?)",
            (call["call_id"], rid, aid, json.dumps(call)),
        )
    assert [s.sequence_id for s in await store.query_spans(rid)] == [0, 2, 3]
    assert len(await store.query_llm_calls(rid, aid)) == 1
    await store.close()


# ------------------------------------------------------------------------------------------- unknown attempts


async def test_records_of_attempts_the_store_never_started_are_refused(store: agl.LightningStore) -> None:
    rid, aid = await _claim(store)
    with pytest.raises(NotFoundError, match="rollout 'nope'"):
        await store.add_spans([make_span("nope", aid, 0)])
    with pytest.raises(NotFoundError, match="attempt 'at-forged'"):
        await store.add_spans([make_span(rid, aid, 0), make_span(rid, "at-forged", 1)])
    with pytest.raises(NotFoundError, match="attempt 'at-forged'"):
        await store.add_llm_calls([make_call(rid, "at-forged", 0, 1.0)])
    with pytest.raises(InvalidRequestError, match="span_id"):
        await store.add_spans([{**make_span(rid, aid, 0).model_dump(), "span_id": "abc"}])  # type: ignore[list-item]
    assert await store.query_spans(rid) == [] and await store.query_llm_calls(rid) == []


async def test_served_store_answers_404_for_a_forged_attempt(served: StoreServerProcessForTests) -> None:
    client = StoreClient(served.url, token=TOKEN)
    try:
        await client.enqueue_rollout("task", rollout_id="ro-real")
        status, answer = await _post(
            served.url, "/llm_calls", {"calls": [make_call("ro-real", "at-forged", 0, 1.0).model_dump(mode="json")]}
        )
        assert status == 404 and "at-forged" in str(answer["message"])
        span = make_span("ro-real", "at-forged", 0).model_dump(mode="json")
        status, _ = await _post(served.url, "/spans", {"spans": [{**span, "span_id": "00ff"}]})
        assert status == 422
    finally:
        await client.close()


# ------------------------------------------------------------------------------------------- retried requests


async def test_a_dequeue_retried_after_the_server_died_gets_the_same_claim(served: StoreServerProcessForTests) -> None:
    client = StoreClient(served.url, token=TOKEN)
    try:
        await client.enqueue_rollouts([RolloutRequest(rollout_id=f"q-{i}") for i in range(3)])
        status, first = await _post(served.url, "/rollouts/dequeue", {"worker_id": "w", "request_id": "req-1"})
        assert status == 200
        served.restart(hard=True)  # the answer above is "lost": the client retries after the restart
        status, again = await _post(served.url, "/rollouts/dequeue", {"worker_id": "w", "request_id": "req-1"})
        assert status == 200 and again == first
        stats = await client.stats()
        assert stats.rollouts["running"] == 1 and stats.attempts == 1  # no second claim, no orphan attempt
        claim = await client.dequeue_rollout(request_id="req-2")
        assert claim is not None and claim.rollout.rollout_id == "q-1"
    finally:
        await client.close()


async def test_a_retried_add_spans_reports_the_count_of_the_first_try(
    store: agl.LightningStore, served: StoreServerProcessForTests
) -> None:
    rid, aid = await _claim(store)
    spans = [make_span(rid, aid, i) for i in range(3)]
    assert await store.add_spans(spans, request_id="batch-1") == 3
    assert await store.add_spans(spans, request_id="batch-1") == 3  # the retry: those 3 are new to the caller
    assert await store.add_spans(spans, request_id="batch-2") == 0  # a different request: nothing new
    # partly new: the first try stores the two new spans; its retry (nothing new to store) is answered from memory
    overlapping = [make_span(rid, aid, i) for i in range(1, 5)]
    assert await store.add_spans(overlapping, request_id="batch-3") == 2
    assert await store.add_spans(overlapping, request_id="batch-3") == 2
    assert len(await store.query_spans(rid)) == 5
    call = make_call(rid, aid, 0, 1.0)
    assert await store.add_llm_calls([call], request_id="calls-1") == 1
    assert await store.add_llm_calls([call], request_id="calls-1") == 1
    # over HTTP, across a server restart (the answer to the first try lost)
    client = StoreClient(served.url, token=TOKEN)
    try:
        await client.enqueue_rollout("t")
        claim = await client.dequeue_rollout()
        assert claim is not None
        body = {
            "spans": [make_span(claim.rollout.rollout_id, claim.attempt.attempt_id, i).model_dump() for i in range(4)],
            "request_id": "http-batch",
        }
        assert await _post(served.url, "/spans", body) == (200, {"added": 4})
        served.restart(hard=True)
        assert await _post(served.url, "/spans", body) == (200, {"added": 4})
    finally:
        await client.close()


# ------------------------------------------------------------------------------------------- disk full, read-only


async def test_disk_full_and_read_only_are_clear_storage_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteStore(tmp_path / "full.db")
    rid, aid = await _claim(store)
    conn = store._conn  # pyright: ignore[reportPrivateUsage]
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")  # the file cannot grow: what a full disk looks like to SQLite
    big = [make_span(rid, aid, i).model_copy(update={"name": "x" * 4000}) for i in range(50)]
    with pytest.raises(StorageError, match="database or disk is full"):
        await store.add_spans(big)
    assert store.storage_error is not None and "database or disk is full" in store.storage_error
    assert any("database or disk is full" in r.getMessage() for r in caplog.records)
    conn.execute("PRAGMA max_page_count = 1000000")
    assert await store.add_spans(big[:1]) == 1  # space again: the next write works and the error clears
    assert store.storage_error is None
    conn.execute("PRAGMA query_only = 1")  # what a read-only file or mount looks like to SQLite
    with pytest.raises(StorageError, match="database is read-only"):
        await store.add_spans(big[1:2])
    assert [s.sequence_id for s in await store.query_spans(rid)] == [0]  # reads still work
    await store.close()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_served_store_on_a_full_disk_answers_507_and_healthz_says_so(tiny_disk: Path) -> None:
    with StoreServerProcessForTests(tiny_disk / "store.db", token=TOKEN) as server:
        client = StoreClient(server.url, token=TOKEN)
        try:
            await client.enqueue_rollout("t")
            claim = await client.dequeue_rollout()
            assert claim is not None
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            with pytest.raises(StorageError, match="database or disk is full"):  # at once: 507 is not retried
                for start in range(0, 10_000, 50):
                    spans = [
                        make_span(rid, aid, i).model_copy(update={"name": "y" * 2000}) for i in range(start, start + 50)
                    ]
                    await client.add_spans(spans)
            async with aiohttp.ClientSession() as http, http.get(f"{server.url}/healthz") as resp:
                assert resp.status == 503
                assert "database or disk is full" in (await resp.json())["message"]
        finally:
            await client.close()
        assert "database or disk is full" in server.output()


# ------------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    "args",
    [
        ["store", "serve", "--db", "/nonexistent/dir/x.db"],
        ["proxy", "serve", "--db", "/nonexistent/dir/x.db", "--backend", "http://127.0.0.1:9"],
        ["proxy", "serve", "--db", "x.db", "--backend", "localhost:8000"],
        ["store", "serve", "--host", "0.0.0.0", "--token", "abc"],
    ],
    ids=["store-bad-db", "proxy-bad-db", "proxy-bad-backend", "store-short-token"],
)
def test_cli_refuses_bad_arguments_in_one_line_with_exit_code_2(args: list[str], tmp_path: Path) -> None:
    done = subprocess.run([*AGL, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    if "abc" in args:
        assert "16 characters" in lines[0] and "secrets.token_urlsafe" in lines[0]


# ------------------------------------------------------------------------------------------- big batches


async def test_a_20mb_batch_does_not_stall_healthz(served: StoreServerProcessForTests) -> None:
    client = StoreClient(served.url, token=TOKEN)
    try:
        await client.enqueue_rollout("t")
        claim = await client.dequeue_rollout()
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        spans = [make_span(rid, aid, i).model_copy(update={"name": "z" * 1000}) for i in range(16_000)]
        body = json.dumps({"spans": [s.model_dump(mode="json") for s in spans]}).encode()
        assert len(body) > 20_000_000
        head = (
            f"POST /v1/spans HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sent = threading.Event()
        order: list[str] = []

        def big() -> bytes:
            with socket.create_connection(("127.0.0.1", served.port)) as sock:
                sock.sendall(head + body)  # returns once the server has read (nearly) all of it
                sent.set()
                answer = b"".join(iter(lambda: sock.recv(65536), b""))
            order.append("batch")
            return answer

        batch = asyncio.create_task(asyncio.to_thread(big))
        await asyncio.to_thread(sent.wait)
        # The server is now parsing and storing 16,000 spans (seconds of work): /healthz must not wait for it.
        async with aiohttp.ClientSession() as http, http.get(f"{served.url}/healthz") as resp:
            assert resp.status == 200
            order.append("healthz")
        answer = await batch
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"added":16000}')
        assert order == ["healthz", "batch"]
        assert (await client.stats()).spans == len(spans)
    finally:
        await client.close()


def test_llm_call_model_refuses_non_finite_logprobs() -> None:
    with pytest.raises(ValidationError, match="response_logprobs"):
        LLMCall(call_id="c", rollout_id="r", attempt_id="a", response_token_ids=[1], response_logprobs=[-math.inf])
