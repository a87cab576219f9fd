"""The compact storage format of spans and LLM calls, shared by the SQLite and PostgreSQL stores.

A row keeps its ids in columns; its ``data`` is one of:

- **Legacy JSON** (SQLite schema 4 and older: text; PostgreSQL schema 1: text, bytes after migration, first byte
  ``{``): the record as ``model_dump_json`` wrote it. Still read; never rewritten.
- **Span, format 1** (first byte ``0x01``): see `agentlightning.store._codec_spans`.
- **LLM call, format 2** (first byte ``0x02``): raw deflate (with a preset dictionary of the JSON every chat
  completion repeats) of a header (array lengths), a JSON document of every
  other field, the token ids as little-endian uint32 (int64 when one does not fit) and the log-probs as float64
  bits. The response's per-token ``logprobs.content[*].logprob`` values, when they equal ``response_logprobs``
  bit for bit, are not written again. **Format 1** (first byte ``0x01``, written before) is the same with another
  preset dictionary (one that held an example's tool arguments); it is still read. The first byte selects the
  dictionary (`CALL_DICTIONARIES`), so a new dictionary is a new format and every older row stays readable.

Values that repeat across calls and spans are stored once, content-addressed, in a ``blobs`` table (key: the
first 16 bytes of BLAKE2b of the value's JSON): a request's ``tools``, its system messages, and any message
content, span attribute string or list whose JSON is at least `BLOB_MIN` bytes (a span that repeats a prompt the
proxy recorded shares its blob). Decoding returns exactly the JSON values that were encoded: same keys in the same
order, same numbers (float bits), same token ids.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic_core import from_json, to_json

from agentlightning._fast import calls_from_json
from agentlightning._models import LLMCall

__all__ = [
    "BLOB_MIN",
    "CALL_DICTIONARIES",
    "CALL_FORMAT",
    "FORMAT_1",
    "BlobFetch",
    "blob_ref",
    "blob_value",
    "decode_calls",
    "decode_rows",
    "encode_call",
    "fetch_blobs",
    "is_binary",
]

logger = logging.getLogger(__name__)

_R = TypeVar("_R")

BLOB_MIN = 256
"""A message content, span attribute string or list whose JSON is at least this long is stored once, by hash."""

BlobFetch = Callable[[list[bytes]], dict[bytes, bytes]]
"""Reads stored blobs by key (the backend's query); keys not found are left out."""

FORMAT_1 = 1
"""First byte of a record's ``data`` in format 1 (spans; LLM calls written before format 2)."""
CALL_FORMAT = 2
"""First byte of the ``data`` of the LLM calls this code writes (format 2: see `CALL_DICTIONARIES`)."""
_LEGACY = ord("{")
_CALL_HEAD = struct.Struct("<IIiI")  # prompt ids, response ids, log-probs (-1: None), JSON length
_WIDE = 1 << 31  # in the prompt-length slot: ids are int64
_JSON_IDS = 1 << 30  # ids too large for int64: kept in the JSON document
_LITTLE = sys.byteorder == "little"
_LOGPROB_KEYS = ["token", "logprob", "bytes", "top_logprobs"]
_CALL_FIELDS = tuple(LLMCall.model_fields)
_ABSENT = object()
# Deflate's preset dictionaries of LLM calls, by format byte: the JSON a chat completion's record repeats in every
# row, so even a short record compresses. Each is fixed forever for its format (a new dictionary is a new format).
# Format 1's held the calculator example's tool arguments; format 2's is only the OpenAI chat / LLMCall structure
# (with the record's fields as they are now, which also makes it ~2.5% smaller per call on the quickstart).
_CALL_ZDICT_2 = (
    b'{"token":"","bytes":null,"top_logprobs":[]},{"role":"system","content":"'
    b'"},{"role":"user","content":"'
    b'"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_","type":"function","function":{"name":"'
    b'","arguments":"{\\""}}]},{"role":"tool","tool_call_id":"call_","content":"'
    b'[{"response_id":"chatcmpl-","request":{"model":"","stream":false,"messages":[{"content":"","role":"user"}],'
    b'"max_completion_tokens":,"max_tokens":,"temperature":1.0,"top_p":1.0,"logprobs":true,"tools":null},'
    b'"response":{"id":"chatcmpl-","object":"chat.completion","created":17,"model":"","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"","tool_calls":null},"logprobs":{"content":[{"token":"",'
    b'"bytes":null,"top_logprobs":[]}]},"finish_reason":"stop"}],"usage":{"prompt_tokens":,"completion_tokens":,'
    b'"total_tokens":},"model_version":0},"model":"","model_version":0,"backend":"inproc://backend-",'
    b'"end_time":17,"error":null,"policy":null,"agent_name":""},[[["tools"],"'
)
# Format 1's, byte for byte: format 2's with the calculator's argument name where every call's arguments open, and
# without the `LLMCall` fields added after it was made (policy, agent name).
_CALL_ZDICT_1 = _CALL_ZDICT_2.replace(b'"arguments":"{\\""', b'"arguments":"{\\"expression\\": \\""').replace(
    b'"error":null,"policy":null,"agent_name":""}', b'"error":null}'
)
CALL_DICTIONARIES: dict[int, bytes] = {FORMAT_1: _CALL_ZDICT_1, CALL_FORMAT: _CALL_ZDICT_2}
"""Deflate's preset dictionary of each LLM-call format, by the format's first byte (never changed once written)."""


def _key(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def blob_ref(value: Any, blobs: dict[bytes, bytes], force: bool = False) -> str | None:
    """The hex key of ``value`` stored as a blob (added to ``blobs``), or ``None`` when it is small."""
    data = to_json(value)
    if not force and len(data) < BLOB_MIN:
        return None
    key = _key(data)
    blobs[key] = data
    return key.hex()


def blob_value(blobs: dict[bytes, Any], hex_key: str) -> Any:
    """The value stored as blob ``hex_key`` (`blob_ref`), from the fetched ``blobs``; ``ValueError`` if missing."""
    try:
        return blobs[bytes.fromhex(hex_key)]
    except KeyError:
        raise ValueError(f"stored value {hex_key} is missing from the blobs table") from None


# ----------------------------------------------------------------------------------------------------- calls


def _pack_ids(ids: list[int]) -> tuple[bytes, int]:
    if not ids or (min(ids) >= 0 and max(ids) < 1 << 32):
        packed = array("I", ids)
        flag = 0
    elif min(ids) >= -(1 << 63) and max(ids) < 1 << 63:
        packed = array("q", ids)
        flag = _WIDE
    else:
        return b"", _JSON_IDS
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes(), flag


def _unpack(typecode: str, data: bytes) -> list[Any]:
    values = array(typecode)
    values.frombytes(data)
    if not _LITTLE:
        values.byteswap()
    return values.tolist()


def _shared_request_parts(request: Any, blobs: dict[bytes, bytes], refs: list[Any]) -> None:
    """Replace the tools, system messages and long message contents of ``request`` by blob references."""
    if type(request) is not dict:
        return
    if request.get("tools") is not None:
        refs.append([["tools"], blob_ref(request["tools"], blobs, force=True)])
        request["tools"] = None
    messages = request.get("messages")
    if type(messages) is not list:
        return
    for index, message in enumerate(messages):
        if type(message) is not dict:
            continue
        if message.get("role") in ("system", "developer"):
            refs.append([["messages", index], blob_ref(message, blobs, force=True)])
            messages[index] = None
        elif type(content := message.get("content")) is str and len(content) >= BLOB_MIN // 2:
            hex_key = blob_ref(content, blobs)
            if hex_key is not None:
                refs.append([["messages", index, "content"], hex_key])
                message["content"] = None


def _strip_logprobs(response: Any, logprobs: list[float] | None) -> bool:
    """Drop ``choices[0].logprobs.content[*].logprob`` when it equals ``logprobs`` bit for bit (True if done)."""
    if logprobs is None or type(response) is not dict:
        return False
    choices = response.get("choices")
    if type(choices) is not list or not choices or type(choices[0]) is not dict:
        return False
    block = choices[0].get("logprobs")
    content = block.get("content") if type(block) is dict else None
    if type(content) is not list or len(content) != len(logprobs):
        return False
    for entry, logprob in zip(content, logprobs, strict=True):
        if type(entry) is not dict or list(entry) != _LOGPROB_KEYS:
            return False
        value = entry["logprob"]
        if type(value) is not float or struct.pack("<d", value) != struct.pack("<d", logprob):
            return False
    for entry in content:
        del entry["logprob"]
    return True


def encode_call(call: LLMCall, blobs: dict[bytes, bytes]) -> bytes:
    """The compact ``data`` of ``call``, in format `CALL_FORMAT` (call, rollout and attempt ids and start time are the
    row's columns)."""
    doc: dict[str, Any] = from_json(call.model_dump_json())
    for column in ("call_id", "rollout_id", "attempt_id", "start_time"):
        del doc[column]
    prompt: list[int] = doc.pop("prompt_token_ids")
    response_ids: list[int] = doc.pop("response_token_ids")
    logprobs: list[float] | None = doc.pop("response_logprobs")
    refs: list[Any] = []
    _shared_request_parts(doc["request"], blobs, refs)
    stripped = _strip_logprobs(doc["response"], logprobs)
    prompt_bytes, prompt_flag = _pack_ids(prompt)
    response_bytes, response_flag = _pack_ids(response_ids)
    if _JSON_IDS in (prompt_flag, response_flag):
        doc["ids"] = [prompt, response_ids]
        prompt_bytes = response_bytes = b""
        prompt_flag = response_flag = _JSON_IDS
    lp_bytes = b""
    if logprobs is not None:
        packed = array("d", logprobs)
        if not _LITTLE:
            packed.byteswap()
        lp_bytes = packed.tobytes()
    meta = to_json([doc, refs, stripped])
    head = _CALL_HEAD.pack(
        len(prompt) | prompt_flag,
        len(response_ids) | response_flag,
        -1 if logprobs is None else len(logprobs),
        len(meta),
    )
    packer = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, CALL_DICTIONARIES[CALL_FORMAT])
    body = packer.compress(head + meta + prompt_bytes + response_bytes + lp_bytes) + packer.flush()
    return bytes((CALL_FORMAT,)) + body


def _ids(count: int, data: bytes, offset: int) -> tuple[list[int], int]:
    width, typecode = (8, "q") if count & _WIDE else (4, "I")
    end = offset + (count & (_JSON_IDS - 1)) * width
    return _unpack(typecode, data[offset:end]), end


def _call_meta(row: Sequence[Any]) -> tuple[bytes, list[Any]]:
    """The decompressed body of a compact call row and its parsed JSON document ``[doc, refs, stripped]``."""
    data = bytes(row[4])
    zdict = CALL_DICTIONARIES.get(data[0])
    if zdict is None:
        raise ValueError(
            f"LLM call {row[0]!r} is stored in format {data[0]}, which this agentlightning-core does not read "
            f"(formats {', '.join(map(str, sorted(CALL_DICTIONARIES)))}; a newer version wrote it: upgrade)"
        )
    try:
        unpacker = zlib.decompressobj(-15, zdict)
        payload = unpacker.decompress(data[1:]) + unpacker.flush()
    except zlib.error as exc:
        raise ValueError(f"LLM call {row[0]!r} is corrupt in the store: {exc}") from None
    meta_len = _CALL_HEAD.unpack_from(payload)[3]
    return payload, from_json(payload[_CALL_HEAD.size : _CALL_HEAD.size + meta_len], allow_inf_nan=False)


def _call_values(row: Sequence[Any], payload: bytes, meta: list[Any], blobs: dict[bytes, Any]) -> dict[str, Any]:
    call_id, rollout_id, attempt_id, start_time, _ = row
    n_prompt, n_response, n_logprobs, meta_len = _CALL_HEAD.unpack_from(payload)
    offset = _CALL_HEAD.size + meta_len
    doc, refs, stripped = meta
    if n_prompt & _JSON_IDS:
        prompt, response_ids = doc.pop("ids")
    else:
        prompt, offset = _ids(n_prompt, payload, offset)
        response_ids, offset = _ids(n_response, payload, offset)
    logprobs = None if n_logprobs < 0 else _unpack("d", payload[offset : offset + 8 * n_logprobs])
    request = doc["request"]
    for path, hex_key in refs:
        target = request
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = blob_value(blobs, hex_key)
    if stripped and logprobs is not None:
        content = doc["response"]["choices"][0]["logprobs"]["content"]
        content[:] = [
            {"token": e["token"], "logprob": lp, "bytes": e["bytes"], "top_logprobs": e["top_logprobs"]}
            for e, lp in zip(content, logprobs, strict=True)
        ]
    values: dict[str, Any] = {}
    for name in _CALL_FIELDS:  # the model's field order, whatever fields a later version adds
        if name in doc:
            values[name] = doc[name]
        else:
            values[name] = {
                "call_id": call_id,
                "rollout_id": rollout_id,
                "attempt_id": attempt_id,
                "start_time": start_time,
                "request": request,
                "prompt_token_ids": prompt,
                "response_token_ids": response_ids,
                "response_logprobs": logprobs,
            }.get(name, _ABSENT)
            if values[name] is _ABSENT:
                del values[name]  # a field this row predates: the model's default (validation fills it in)
    return values


def decode_calls(rows: Sequence[Sequence[Any]], fetch: BlobFetch) -> list[LLMCall]:
    """LLM calls of rows ``(call_id, rollout_id, attempt_id, start_time, data)`` in either format.

    Raises:
        ValueError: A row cannot be read (a bad legacy document, a missing blob, a corrupt compressed body).
    """
    parts = [_call_meta(row) if is_binary(row[4]) else None for row in rows]
    keys = [bytes.fromhex(hex_key) for part in parts if part is not None for _, hex_key in part[1][1]]
    blobs = fetch_blobs(keys, fetch)
    values = [
        from_json(row[4], allow_inf_nan=False) if part is None else _call_values(row, part[0], part[1], blobs)
        for row, part in zip(rows, parts, strict=True)
    ]
    return calls_from_json(values)


# ----------------------------------------------------------------------------------------------------- shared


def is_binary(data: Any) -> bool:
    """Whether ``data`` is in a compact format (not a legacy JSON document: text, or bytes starting with ``{``)."""
    return not isinstance(data, str) and data[0] != _LEGACY


def fetch_blobs(keys: list[bytes], fetch: BlobFetch) -> dict[bytes, Any]:
    """Blob values (parsed JSON, one fresh copy per reference site is made by `blob_value`)."""
    if not keys:
        return {}
    return _Blobs(fetch(sorted(set(keys))))


class _Blobs(dict[bytes, Any]):
    """Raw blob JSON by key; each read parses a fresh copy, so two records never share one mutable value."""

    def __getitem__(self, key: bytes) -> Any:
        return from_json(super().__getitem__(key), allow_inf_nan=False)


def decode_rows(
    rows: Sequence[Sequence[Any]],
    decode: Callable[[Sequence[Sequence[Any]], BlobFetch], list[_R]],
    fetch: BlobFetch,
    what: str,
) -> list[_R]:
    """``decode(rows, fetch)``; when a row cannot be read, the others, the bad ones logged and skipped.

    Reads of a rollout must not fail because of one bad row: earlier versions stored NaN as ``null``, which the
    models now refuse. Losing that one record is logged as an error; the rest of the trace stays readable.
    """
    try:
        return decode(rows, fetch)
    except ValueError:
        pass
    out: list[_R] = []
    for row in rows:
        try:
            out += decode([row], fetch)
        except ValueError as exc:
            logger.error("skipped an unreadable %s in the store: %s", what, str(exc).replace("\n", " "))
    return out
