"""Old store files and databases open, migrate to the compact record format, and read back everything.

``data/store_v4.db`` was written by the SQLite store of schema version 4 (the code before the compact format,
JSON rows) with the kit's round-trip records (`agentlightning.testing._store_kit_records`), a finished attempt and
one resources version. A database newer than the code is refused with one clear line. The record round trip also
runs through `agl store serve` over PostgreSQL here (the other backends run it in their conformance kits).
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentlightning import SqliteStore
from agentlightning.store import AttemptEndedError, LightningStore, StoreClient, StoreError
from agentlightning.testing import PostgresServer, StoreServerProcessForTests
from agentlightning.testing._store_kit_records import RecordRoundTripTests, round_trip_calls, round_trip_spans

V4_FILE = Path(__file__).parent / "data" / "store_v4.db"


@pytest.fixture
def v4_copy(tmp_path: Path) -> Path:
    path = tmp_path / "old.db"
    shutil.copyfile(V4_FILE, path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 4
        assert conn.execute("SELECT typeof(data) FROM spans LIMIT 1").fetchone()[0] == "text"
    return path


async def test_a_version_4_file_migrates_on_open_and_reads_back_everything(v4_copy: Path) -> None:
    store = SqliteStore(v4_copy)
    try:
        (rollout,) = await store.query_rollouts()
        (attempt,) = await store.query_attempts(rollout.rollout_id)
        rid, aid = rollout.rollout_id, attempt.attempt_id
        assert (rollout.status, rollout.mode, rollout.group_id, attempt.status) == (
            "succeeded",
            "train",
            "g1",
            "succeeded",
        )
        calls, spans = round_trip_calls(rid, aid), round_trip_spans(rid, aid)
        # the file predates the calls' policy and agent name: they read as unknown
        calls = [c.model_copy(update={"policy": None, "agent_name": None}) for c in calls]
        assert await store.query_llm_calls(rid) == calls
        assert [c.model_dump_json() for c in await store.query_llm_calls(rid, aid)] == [
            c.model_dump_json() for c in calls
        ]
        assert await store.query_spans(rid) == spans
        assert [s.model_dump_json() for s in await store.query_spans(rid, aid)] == [s.model_dump_json() for s in spans]
        resources = await store.get_resources()
        assert resources is not None and resources.resources_id == "res-1"
        # the attempt has ended: re-adding its old records is refused as late, and changes nothing
        with pytest.raises(AttemptEndedError):
            await store.add_llm_calls(calls)
        with pytest.raises(AttemptEndedError):
            await store.add_spans(spans)
        assert len(await store.query_llm_calls(rid)) == len(calls) and len(await store.query_spans(rid)) == len(spans)
        (row,) = (await store.list_rollouts()).rollouts
        assert row.model_version == 3
        # the per-policy statistics read the old JSON rows' agent and version (filled in by the migration)
        assert [(p.policy, p.model_version, p.calls) for p in (await store.run_stats()).policies] == [
            (None, None, 2),
            (None, 3, 1),
        ]
    finally:
        await store.close()
    with sqlite3.connect(v4_copy) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
        assert conn.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0


async def test_new_records_in_a_migrated_file_are_compact_and_read_with_the_old_ones(v4_copy: Path) -> None:
    store = SqliteStore(v4_copy)
    try:
        await store.enqueue_rollout({"q": 2}, rollout_id="new-rollout")
        claim = await store.dequeue_rollout()
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        calls, spans = round_trip_calls(rid, aid), round_trip_spans(rid, aid)
        calls = [c.model_copy(update={"call_id": "new-" + c.call_id}) for c in calls]
        assert await store.add_llm_calls(calls) == 3 and await store.add_spans(spans) == 3
        assert await store.query_llm_calls(rid) == calls and await store.query_spans(rid) == spans
        assert len(await store.query_llm_calls("rt-rollout")) == 3
    finally:
        await store.close()
    with sqlite3.connect(v4_copy) as conn:
        kinds = dict(
            conn.execute(
                "SELECT k.rollout_id, typeof(s.data) FROM spans s JOIN span_attempts k USING (attempt_key) "
                "GROUP BY k.rollout_id"
            ).fetchall()
        )
        assert kinds == {"rt-rollout": "text", "new-rollout": "blob"}
        # the tools and the system prompt shared by the new calls, and the prompt the span repeats, stored once
        assert conn.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 3


def test_a_file_of_a_newer_schema_is_refused_in_one_line(v4_copy: Path) -> None:
    with sqlite3.connect(v4_copy) as conn:
        conn.execute("PRAGMA user_version = 8")
    with pytest.raises(StoreError) as caught:
        SqliteStore(v4_copy)
    message = str(caught.value)
    assert "schema version 8" in message and "upgrade" in message and "\n" not in message


async def test_a_version_1_postgres_database_migrates_on_open_and_reads_back_everything(
    agl_postgres: PostgresServer,
) -> None:
    psycopg = pytest.importorskip(
        "psycopg", reason='the PostgreSQL driver: pip install "agentlightning-core[postgres]"'
    )
    from agentlightning import PostgresStore
    from agentlightning.store._postgres_schema import _SCHEMA_V1  # pyright: ignore[reportPrivateUsage]

    dsn = agl_postgres.new_schema()
    rid, aid = "rt-rollout", "at-1"
    calls, spans = round_trip_calls(rid, aid), round_trip_spans(rid, aid)
    with psycopg.connect(dsn, autocommit=True) as conn:  # the schema and rows as the version-1 code wrote them
        for statement in _SCHEMA_V1.split(";"):
            conn.execute(statement)
        conn.execute("CREATE TABLE agl_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO agl_schema VALUES (1)")
        conn.execute(
            "INSERT INTO agl_rollouts (rollout_id, status, input, mode, group_id, resources_id, retry_count, "
            "created_at, updated_at, metadata) VALUES (%s, 'succeeded', '{}', 'train', NULL, NULL, 0, 1.0, 2.0, '{}')",
            (rid,),
        )
        conn.execute(
            "INSERT INTO agl_attempts VALUES "
            "(%s, %s, 1, 'w', 'succeeded', 1.0, 3.0, 3.0, NULL, NULL, NULL, 3, 'train')",
            (aid, rid),
        )
        for call in calls:
            conn.execute(
                "INSERT INTO agl_llm_calls (call_id, rollout_id, attempt_id, start_time, data) "
                "VALUES (%s, %s, %s, %s, %s)",
                (call.call_id, rid, aid, call.start_time, call.model_dump_json()),
            )
        for span in spans:
            conn.execute(
                "INSERT INTO agl_spans VALUES (%s, %s, %s, %s, %s)",
                (rid, aid, span.span_id, span.sequence_id, span.model_dump_json()),
            )
    store = PostgresStore(dsn, pool_size=2)
    try:
        assert await store.query_llm_calls(rid) == calls
        assert [c.model_dump_json() for c in await store.query_llm_calls(rid, aid)] == [
            c.model_dump_json() for c in calls
        ]
        assert await store.query_spans(rid) == spans
        with pytest.raises(AttemptEndedError):  # the attempt ended: its old records are not added again
            await store.add_llm_calls(calls)
        with pytest.raises(AttemptEndedError):
            await store.add_spans(spans)
        assert len(await store.query_llm_calls(rid)) == len(calls) and len(await store.query_spans(rid)) == len(spans)
    finally:
        await store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM agl_schema").fetchall() == [(3,)]
        assert conn.execute("SELECT COUNT(*) FROM agl_blobs").fetchone() == (0,)


class TestServedPostgresRoundTrip(RecordRoundTripTests):
    """The record round trip through ``agl store serve`` over PostgreSQL (the other backends run it in their kits)."""

    @pytest.fixture
    async def store(self, agl_postgres: PostgresServer) -> AsyncIterator[LightningStore]:
        pytest.importorskip("psycopg", reason='the PostgreSQL driver: pip install "agentlightning-core[postgres]"')
        server = StoreServerProcessForTests(agl_postgres.new_schema(), token="round-trip-token").start()
        client = StoreClient(server.url, token="round-trip-token")
        try:
            yield client
        finally:
            await client.close()
            server.stop()
