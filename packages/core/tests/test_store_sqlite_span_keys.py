"""The SQLite store's integer-keyed spans table (schema version 7) and the migration of version-6 files to it.

``data/store_v6.db`` was written by the code of schema version 6 (``data/make_store_v6.py``, run at d049ccd): the
kit's round-trip spans, spans whose sequence ids tie (their span ids decide the order), and rows that code could
hold but the current one refuses to write: span ids that are not 16 lowercase hex digits (compact and legacy JSON
rows) and spans of attempts the attempts table does not know. Every span must read back as the version-6 code read
it: the same spans, the same order.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentlightning import SqliteStore
from agentlightning._models import Span
from agentlightning.store import AttemptEndedError
from agentlightning.store._codec import decode_rows
from agentlightning.store._codec_spans import decode_spans
from agentlightning.store._sqlite_spans import span_id_of, span_key, span_keys
from agentlightning.testing import make_span

V6_FILE = Path(__file__).parent / "data" / "store_v6.db"
ODD_IDS = {"abc", "ABCDEF0123456789", "123", "0123456789abcdef0", "00000000000000ag", " 0f067aa0ba902b7", "zz"}
# how the version-6 code read a rollout's (or an attempt's) spans
_V6_SELECT = (
    "SELECT s.rollout_id, s.attempt_id, s.span_id, s.sequence_id, s.data FROM spans s "
    "LEFT JOIN attempts a ON a.attempt_id = s.attempt_id WHERE {} "
    "ORDER BY COALESCE(a.sequence, 2147483647), s.attempt_id, s.sequence_id, s.span_id"
)


def _v6_read(conn: sqlite3.Connection, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
    where, params = "s.rollout_id = ?", [rollout_id]
    if attempt_id is not None:
        where, params = where + " AND s.attempt_id = ?", [rollout_id, attempt_id]
    rows = conn.execute(_V6_SELECT.format(where), params).fetchall()

    def fetch(keys: list[bytes]) -> dict[bytes, bytes]:
        marks = ", ".join("?" * len(keys))
        return dict(conn.execute(f"SELECT key, data FROM blobs WHERE key IN ({marks})", keys).fetchall())

    return decode_rows(rows, decode_spans, fetch, "span")


def test_span_keys_give_back_every_id_and_sort_as_the_ids() -> None:
    rng = random.Random(7)
    hex_ids = [f"{rng.getrandbits(64):016x}" for _ in range(500)]
    hex_ids += ["0" * 16, "f" * 16, "7fffffffffffffff", "8000000000000000"]
    keys = span_keys(hex_ids)
    assert keys == [span_key(i) for i in hex_ids] and {type(k) for k in keys} == {int}
    assert all(-(2**63) <= k < 2**63 for k in keys if isinstance(k, int))  # SQLite's INTEGER range
    assert [span_id_of(k) for k in keys] == hex_ids
    assert sorted(keys, key=lambda k: int(k)) == span_keys(sorted(hex_ids))  # integers in the ids' text order
    # any other id is kept as itself (text), in a batch of usual ids too
    mixed = [*hex_ids[:3], *sorted(ODD_IDS), "0123456789ABCDEF", "0x23456789abcdef"]
    mixed_keys = span_keys(mixed)
    assert mixed_keys[:3] == keys[:3] and mixed_keys[3:] == mixed[3:]
    assert [span_id_of(k) for k in mixed_keys] == mixed
    # 16 characters that are not 16 lowercase hex digits, among usual ids (the batch's fast lane must see them)
    odds = ("ABCDEF0123456789", " 0f067aa0ba902b7", "0f067aa0ba902b7 ", "00000000000000ag", "0f067aa0ba902b7\u00e9")
    for odd in odds:
        assert len(odd) == 16 and span_keys([*hex_ids[:3], odd]) == [*keys[:3], odd]


RUNNING_ATTEMPT = "at-e30f5561323440b1a04acbd5263d0354"
"""The one attempt of the version-6 file that still runs (rollout ro-a): records may still be added to it."""


@pytest.fixture
def v6_copy(tmp_path: Path) -> Path:
    path = tmp_path / "v6.db"
    shutil.copyfile(V6_FILE, path)
    return path


async def test_a_version_6_file_migrates_and_every_span_reads_back_as_before(v6_copy: Path) -> None:
    with sqlite3.connect(v6_copy) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
        pairs = conn.execute("SELECT DISTINCT rollout_id, attempt_id FROM spans ORDER BY 1, 2").fetchall()
        total = conn.execute("SELECT COUNT(*) FROM spans").fetchone()[0]
        before = {rid: _v6_read(conn, rid) for rid in ("ro-a", "ro-b", "ro-gone")}
        before_attempts = {(rid, aid): _v6_read(conn, rid, aid) for rid, aid in pairs}
    assert sum(map(len, before.values())) == total == 79
    assert {s.span_id for spans in before.values() for s in spans} >= ODD_IDS
    assert [s.attempt_id for s in before["ro-a"]][-2:] == ["at-orphan", "at-orphan"]  # unknown attempts last
    store = SqliteStore(v6_copy)
    try:
        for rid, spans in before.items():
            got = await store.query_spans(rid)
            assert got == spans
            assert [s.model_dump_json() for s in got] == [s.model_dump_json() for s in spans]
        for (rid, aid), spans in before_attempts.items():
            assert await store.query_spans(rid, aid) == spans
        assert (await store.stats()).spans == total
        # the migrated spans of an attempt that ended cannot be added again (late records), and change nothing
        ended = [s for s in before["ro-b"] if s.span_id not in ODD_IDS]
        with pytest.raises(AttemptEndedError):
            await store.add_spans(ended)
        # re-adding a running attempt's migrated spans stores nothing, with a request id too (its retry: same answer)
        running = [s for s in before["ro-a"] if s.attempt_id == RUNNING_ATTEMPT and s.span_id not in ODD_IDS]
        assert len(running) >= 5
        assert await store.add_spans(running) == 0
        assert await store.add_spans(running[:5], request_id="again") == 0
        assert await store.add_spans(running[:5], request_id="again") == 0
        # a new span of a migrated attempt lands in its place among the old ones
        rid, aid = running[0].rollout_id, running[0].attempt_id
        new = make_span(rid, aid, 5).model_copy(update={"span_id": "0000000000000001"})
        assert await store.add_spans([new], request_id="new") == 1
        assert await store.add_spans([new], request_id="new") == 1  # the retry: the first answer
        after = await store.query_spans(rid)
        assert [s for s in after if s != new] == before["ro-a"]
        mine = await store.query_spans(rid, aid)
        assert [(s.sequence_id, s.span_id) for s in mine] == sorted((s.sequence_id, s.span_id) for s in mine)
        assert await store.query_spans("ro-b") == before["ro-b"]
    finally:
        await store.close()
    with sqlite3.connect(v6_copy) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'spans_v6'").fetchone() is None
        types = dict(conn.execute("SELECT typeof(span_key), COUNT(*) FROM spans GROUP BY 1").fetchall())
        odd_rows = sum(1 for spans in before.values() for s in spans if s.span_id in ODD_IDS)
        assert types == {"integer": total + 1 - odd_rows, "text": odd_rows}


async def test_a_failed_write_does_not_keep_the_attempt_key_it_took(tmp_path: Path) -> None:
    """A key taken in a transaction that rolled back is free again: another process may take it for its attempt.
    This process must not keep using it (its spans would read back as the other attempt's)."""
    path = tmp_path / "store.db"
    first, second = SqliteStore(path), SqliteStore(path)
    try:
        await first.enqueue_rollout("a", rollout_id="ro-1")
        await first.enqueue_rollout("b", rollout_id="ro-2")
        claims: list[Any] = [await first.dequeue_rollout(), await first.dequeue_rollout()]
        (r1, a1), (r2, a2) = ((c.rollout.rollout_id, c.attempt.attempt_id) for c in claims)
        with sqlite3.connect(path) as raw:  # a write that fails after the attempt's key was given
            raw.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON spans WHEN NEW.sequence_id = 99 "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        with pytest.raises(sqlite3.IntegrityError, match="refused by the test"):
            await first.add_spans([make_span(r1, a1, 99)])
        assert await second.add_spans([make_span(r2, a2, 0)]) == 1  # takes the key the failed write gave back
        assert await first.add_spans([make_span(r1, a1, 1)]) == 1
        assert [(s.rollout_id, s.sequence_id) for s in await second.query_spans(r2)] == [(r2, 0)]
        assert [(s.rollout_id, s.sequence_id) for s in await first.query_spans(r1)] == [(r1, 1)]
    finally:
        await first.close()
        await second.close()
