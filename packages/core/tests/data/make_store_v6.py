"""Writes ``store_v6.db``: a SQLite store of schema version 6 (spans keyed by three text ids), for the migration test.

Run with the code that wrote schema version 6 (agentlightning-core at d049ccd), not with the current code:

    PYTHONPATH=<checkout of d049ccd>/packages/core/src python packages/core/tests/data/make_store_v6.py OUT.db

The store writes the kit's round-trip spans and spans with tied sequence ids (hex ids with and without the top bit);
rows that version-6 code could hold but no longer writes are inserted as such: span ids that are not 16 lowercase hex
digits (in the compact format and as legacy JSON), and spans of attempts the attempts table does not know.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import sys
from typing import Any

from agentlightning import SqliteStore
from agentlightning._models import Span
from agentlightning.store import RetryPolicy
from agentlightning.store._codec_spans import encode_span
from agentlightning.testing._store_kit_records import round_trip_spans

_ODD_IDS = ["abc", "ABCDEF0123456789", "123", "0123456789abcdef0", "00000000000000ag", " 0f067aa0ba902b7"]


def _span(rollout_id: str, attempt_id: str, seq: int, span_id: str, **extra: Any) -> Span:
    values: dict[str, Any] = {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "sequence_id": seq,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "span_id": span_id,
        "parent_id": None,
        "name": f"span-{seq}-{span_id}",
        "start_time": 100.0 + seq,
        "end_time": 100.5 + seq,
        "attributes": {"agentlightning.span.kind": "tool", "agentlightning.rollout_id": rollout_id},
        "events": [],
        **extra,
    }
    return Span.model_construct(**values)  # ids that Span refuses: what an older writer could have stored


async def _write(path: str) -> None:
    rng = random.Random(6)
    store = SqliteStore(path, retry_policy=RetryPolicy(max_attempts=2))
    try:
        await store.enqueue_rollout({"q": 1}, rollout_id="ro-a")
        await store.enqueue_rollout({"q": 2}, rollout_id="ro-b")
        first = await store.dequeue_rollout(worker_id="w")
        assert first is not None
        await store.add_spans(round_trip_spans("ro-a", first.attempt.attempt_id))
        await store.finish_attempt("ro-a", first.attempt.attempt_id, "failed", "boom")
        second = await store.dequeue_rollout()
        b = await store.dequeue_rollout()
        assert second is not None and b is not None and second.rollout.rollout_id == "ro-a"
        for claim in (second, b):
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            # three spans per sequence id: the span id decides their order; ids with and without the top bit
            ids = [f"{rng.getrandbits(64):016x}" for _ in range(30)] + ["0" * 16, "f" * 16, "7fffffffffffffff"]
            await store.add_spans([Span.model_validate(_span(rid, aid, i // 3, sid).model_dump()) for i, sid in
                                   enumerate(ids)])  # fmt: skip
        await store.finish_attempt("ro-b", b.attempt.attempt_id, "succeeded")
        aid = first.attempt.attempt_id
    finally:
        await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    insert = "INSERT INTO spans (rollout_id, attempt_id, span_id, sequence_id, data) VALUES (?, ?, ?, ?, ?)"
    odd = [_span("ro-a", aid, 1, sid) for sid in _ODD_IDS]  # sequence id 1: ties with a hex id of the kit
    for i, span in enumerate(odd):
        data: Any = span.model_dump_json() if i % 2 else encode_span(span, {})
        conn.execute(insert, (span.rollout_id, span.attempt_id, span.span_id, span.sequence_id, data))
    for rid, attempt_id in (("ro-a", "at-orphan"), ("ro-gone", "at-gone")):
        for seq, sid in enumerate(("00000000000000ff", "zz")):
            span = _span(rid, attempt_id, seq, sid)
            conn.execute(insert, (rid, attempt_id, sid, seq, encode_span(span, {})))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode = DELETE")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
    print(json.dumps({"spans": conn.execute("SELECT COUNT(*) FROM spans").fetchone()[0]}))
    conn.close()


if __name__ == "__main__":
    asyncio.run(_write(sys.argv[1]))
