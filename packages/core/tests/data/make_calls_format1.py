"""Writes ``calls_format1.json``: LLM-call rows in the compact format 1 (its preset dictionary held the calculator
example's tool arguments), for the test that format-1 rows still read after the dictionary changed.

Run with the code that wrote format 1 (agentlightning-core before format 2, e.g. at 75925fe), not the current code:

    PYTHONPATH=<checkout of 75925fe>/packages/core/src python packages/core/tests/data/make_calls_format1.py OUT.json

The file holds the rows as a store keeps them (``call_id, rollout_id, attempt_id, start_time, data`` with ``data`` in
hex), the blobs they reference (hex by hex key) and each call as ``model_dump_json`` wrote it (what must read back).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from agentlightning._models import LLMCall
from agentlightning.store._codec import encode_call
from agentlightning.testing._store_kit_records import round_trip_calls


def _tool_call(rollout_id: str, attempt_id: str) -> LLMCall:
    """A short call of the calculator's shape: the text the format-1 dictionary was made for."""
    arguments = '{"expression": "12 * (3 + 4)"}'
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_7", "type": "function", "function": {"name": "calc", "arguments": arguments}}],
    }
    return LLMCall(
        call_id="calc-call-1",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        response_id="chatcmpl-9",
        request={"model": "toy", "messages": [{"role": "user", "content": "12 * (3 + 4)?"}], "logprobs": True},
        response={"id": "chatcmpl-9", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]},
        prompt_token_ids=[5, 6, 7],
        response_token_ids=[8, 9],
        response_logprobs=[-0.5, -0.25],
        model="toy",
        model_version=1,
        start_time=1_700_000_004.0,
    )


def main(out: str) -> None:
    calls = [*round_trip_calls("ro-f1", "at-f1"), _tool_call("ro-f1", "at-f1")]
    blobs: dict[bytes, bytes] = {}
    rows: list[list[Any]] = []
    for call in calls:
        data = encode_call(call, blobs)
        assert data[0] == 1, "run this with the code that wrote format 1"
        rows.append([call.call_id, call.rollout_id, call.attempt_id, call.start_time, data.hex()])
    document = {
        "rows": rows,
        "blobs": {key.hex(): value.hex() for key, value in sorted(blobs.items())},
        "calls": [call.model_dump_json() for call in calls],
    }
    with open(out, "w") as file:
        json.dump(document, file, indent=1)
        file.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
