"""LLM calls' compact formats: rows of every format ever written still read, and the preset dictionary of the
format written now holds only the structure of an OpenAI chat completion and of `LLMCall` (no example's data)."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentlightning import SqliteStore
from agentlightning._models import LLMCall
from agentlightning.store._codec import CALL_DICTIONARIES, CALL_FORMAT, FORMAT_1, decode_calls, encode_call
from agentlightning.testing._store_kit_records import round_trip_calls

FORMAT_1_ROWS = Path(__file__).parent / "data" / "calls_format1.json"  # made by data/make_calls_format1.py

# The words an OpenAI chat completion request / response and the store's own record use: what a dictionary of
# their shared structure may contain (anything else is some application's data).
CHAT_WORDS = {
    "arguments", "assistant", "backend", "bytes", "call", "chat", "chatcmpl", "choices", "completion",
    "completion_tokens", "content", "created", "false", "finish_reason", "function", "id", "index", "inproc",
    "logprob", "logprobs", "max_completion_tokens", "max_tokens", "message", "messages", "model", "name", "null",
    "object", "prompt_tokens", "request", "response", "role", "stop", "stream", "system", "temperature", "token",
    "tool", "tool_call_id", "tool_calls", "tools", "top_logprobs", "top_p", "total_tokens", "true", "type", "usage",
    "user",
}  # fmt: skip


def _format_1() -> dict[str, Any]:
    return json.loads(FORMAT_1_ROWS.read_text())


def _fetch(blobs: dict[str, str]) -> Any:
    stored = {bytes.fromhex(key): bytes.fromhex(value) for key, value in blobs.items()}
    return lambda keys: {key: stored[key] for key in keys if key in stored}


def test_the_format_written_now_has_a_dictionary_of_chat_structure_only() -> None:
    assert CALL_FORMAT != FORMAT_1  # the dictionary changed: a new format byte
    words = set(re.findall(r"[a-z]+(?:_[a-z]+)*", CALL_DICTIONARIES[CALL_FORMAT].decode().lower()))
    allowed = CHAT_WORDS | set(LLMCall.model_fields)
    assert words - allowed == set()
    assert b"expression" not in CALL_DICTIONARIES[CALL_FORMAT]  # the calculator example's tool argument


def test_calls_are_written_in_the_current_format_and_read_back() -> None:
    blobs: dict[bytes, bytes] = {}
    calls = round_trip_calls("ro-1", "at-1")
    rows = [(c.call_id, c.rollout_id, c.attempt_id, c.start_time, encode_call(c, blobs)) for c in calls]
    assert {row[4][0] for row in rows} == {CALL_FORMAT}
    got = decode_calls(rows, lambda keys: {k: blobs[k] for k in keys})
    assert [c.model_dump_json() for c in got] == [c.model_dump_json() for c in calls]


def test_format_1_rows_written_by_the_previous_code_still_read() -> None:
    document = _format_1()
    rows = [(*row[:4], bytes.fromhex(row[4])) for row in document["rows"]]
    assert {row[4][0] for row in rows} == {FORMAT_1}
    got = decode_calls(rows, _fetch(document["blobs"]))
    assert [c.model_dump_json() for c in got] == document["calls"]


async def test_a_store_file_with_format_1_and_current_rows_reads_both(tmp_path: Path) -> None:
    document = _format_1()
    store = SqliteStore(tmp_path / "store.db")
    try:
        conn = sqlite3.connect(tmp_path / "store.db")
        with conn:
            conn.executemany(
                "INSERT INTO llm_calls (call_id, rollout_id, attempt_id, start_time, data) VALUES (?, ?, ?, ?, ?)",
                [(*row[:4], bytes.fromhex(row[4])) for row in document["rows"]],
            )
            conn.executemany(
                "INSERT INTO blobs (key, data) VALUES (?, ?)",
                [(bytes.fromhex(k), bytes.fromhex(v)) for k, v in document["blobs"].items()],
            )
        conn.close()
        got = await store.query_llm_calls("ro-f1")
        assert [c.model_dump_json() for c in got] == document["calls"]
    finally:
        await store.close()


def test_a_call_of_an_unknown_format_is_refused_naming_the_format() -> None:
    call = round_trip_calls("ro-1", "at-1")[2]
    data = bytes((9,)) + encode_call(call, {})[1:]
    with pytest.raises(ValueError, match="format 9"):
        decode_calls([(call.call_id, "ro-1", "at-1", call.start_time, data)], lambda keys: {})


def test_each_format_keeps_its_dictionary_forever() -> None:
    # rows on disk decompress only with the exact bytes they were written with: a new dictionary is a new format
    pinned = {1: "2f2aa6be3fcd555c65082b71f1ef712c", 2: "bbd5703cf87d26c338deaf303085c145"}
    assert {f: hashlib.blake2b(d, digest_size=16).hexdigest() for f, d in CALL_DICTIONARIES.items()} == pinned
