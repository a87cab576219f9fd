"""Reading token ids and logprobs out of backend responses, and assembling streamed responses.

Liberal in what it accepts (vLLM-compatible wire format):

* ``prompt_token_ids`` at the top level of the response / first chunk, or inside the choice (newer vLLM);
* ``token_ids`` inside the choice (for streams: the ids of that chunk's delta);
* logprobs in the OpenAI shape: ``choices[i].logprobs.content[j].logprob`` (chat) or
  ``choices[i].logprobs.token_logprobs`` (completions);
* ``model_version`` (a non-negative integer) at the top level of the response or of any stream chunk: the version
  of the weights that generated it, as the backend reports it (`MODEL_VERSION_FIELD`; our backends also send the
  `MODEL_VERSION_HEADER` header on non-streamed answers).

Only choice 0 is recorded (agents use ``n=1``); with ``n > 1`` a stream's chunks each carry one choice, picked out
by its ``index`` (vLLM streams the choices interleaved).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Literal, cast

try:  # orjson is faster when present; the stdlib is the fallback
    import orjson

    def loads(data: bytes | str) -> Any:
        """Parse JSON."""
        return orjson.loads(data)

    def dumps(obj: Any) -> bytes:
        """Serialise to JSON bytes."""
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - depends on the environment

    def loads(data: bytes | str) -> Any:
        """Parse JSON."""
        return json.loads(data)

    def dumps(obj: Any) -> bytes:
        """Serialise to JSON bytes."""
        return json.dumps(obj, separators=(",", ":")).encode()


__all__ = [
    "MODEL_VERSION_FIELD",
    "MODEL_VERSION_HEADER",
    "AgentView",
    "Extracted",
    "SSEParser",
    "StreamAssembler",
    "dumps",
    "extract",
    "finalize",
    "loads",
    "model_version_of",
    "without_token_fields",
]

Kind = Literal["chat", "completion"]

MODEL_VERSION_FIELD = "model_version"
"""Top-level field of a response body (and of every stream chunk) naming the weights version that generated it."""

MODEL_VERSION_HEADER = "x-agentlightning-model-version"
"""HTTP header with the same meaning, for backends that cannot change the body; the body field wins."""


def model_version_of(value: Any) -> int | None:
    """A reported model version if ``value`` is a non-negative integer (or its decimal text), else ``None``."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


@dataclass
class Extracted:
    """Token data found in one response.

    Attributes:
        prompt_token_ids: Prompt ids, or ``None`` when the backend sent none.
        response_token_ids: Generated ids, or ``None`` when the backend sent none.
        response_logprobs: One logprob per generated id, or ``None``.
        note: Why something was dropped (e.g. logprobs whose count does not match the ids).
        model_version: The weights version the backend reported in the body, or ``None``.
    """

    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    note: str | None = None
    model_version: int | None = None


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(map(isinstance, cast(list[Any], value), repeat(int))):
        return cast(list[int], value)
    return None


def _choice_logprobs(choice: dict[str, Any], kind: Kind) -> list[float] | None:
    block = choice.get("logprobs")
    if not isinstance(block, dict):
        return None
    block = cast(dict[str, Any], block)
    if kind == "chat" or "content" in block:
        content = block.get("content")
        if isinstance(content, list):
            return [float(item["logprob"]) for item in cast(list[dict[str, Any]], content)]
        return None
    values = block.get("token_logprobs")
    if isinstance(values, list):
        # the first prompt token of an echoed completion has no logprob; such entries count as 0.0
        return [float(v) if v is not None else 0.0 for v in cast(list[Any], values)]
    return None


def _first_choice(data: dict[str, Any]) -> dict[str, Any] | None:
    """The choice with index 0 (an entry without an index counts as 0), or ``None``."""
    choices = data.get("choices")
    if not isinstance(choices, list):
        return None
    for choice in cast(list[Any], choices):
        if isinstance(choice, dict) and cast(dict[str, Any], choice).get("index", 0) == 0:
            return cast(dict[str, Any], choice)
    return None


def finalize(prompt: list[int] | None, ids: list[int] | None, logprobs: list[float] | None) -> Extracted:
    """Pair up ids and logprobs, dropping logprobs that cannot belong to the ids."""
    note = None
    if ids is None:
        logprobs = None  # without ids the logprobs cannot be trained on; the missing ids are reported instead
    elif logprobs is not None and len(logprobs) != len(ids):
        note = f"dropped {len(logprobs)} logprobs that do not match {len(ids or [])} response token ids"
        logprobs = None
    return Extracted(prompt, ids, logprobs, note)


def extract(data: dict[str, Any], kind: Kind) -> Extracted:
    """Token ids and logprobs of a non-streamed response."""
    choice = _first_choice(data) or {}
    prompt = _int_list(data.get("prompt_token_ids"))
    if prompt is None:
        prompt = _int_list(choice.get("prompt_token_ids"))
    extracted = finalize(prompt, _int_list(choice.get("token_ids")), _choice_logprobs(choice, kind))
    extracted.model_version = model_version_of(data.get(MODEL_VERSION_FIELD))
    return extracted


class SSEParser:
    """Splits a byte stream into server-sent events, keeping each event's raw bytes for pass-through."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[tuple[bytes, str | None]]:
        """Complete events in ``chunk`` (plus what was buffered) as ``(raw bytes, data or None)``."""
        self._buffer += chunk
        events: list[tuple[bytes, str | None]] = []
        while True:
            cut, sep_len = _find_event_end(self._buffer)
            if cut < 0:
                return events
            raw = self._buffer[: cut + sep_len]
            self._buffer = self._buffer[cut + sep_len :]
            events.append((raw, _event_data(raw[:cut])))

    def rest(self) -> bytes:
        """Bytes left after the last complete event (a stream cut short)."""
        rest, self._buffer = self._buffer, b""
        return rest


def _find_event_end(buffer: bytes) -> tuple[int, int]:
    best, best_len = -1, 0
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        pos = buffer.find(sep)
        if pos >= 0 and (best < 0 or pos < best):
            best, best_len = pos, len(sep)
    return best, best_len


def _event_data(raw: bytes) -> str | None:
    lines: list[str] = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(lines) if lines else None


@dataclass
class _ToolCall:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list[str])


class StreamAssembler:
    """Rebuilds the non-streamed response (and the token record) from stream chunks."""

    def __init__(self, kind: Kind) -> None:
        self.kind: Kind = kind
        self.id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.prompt_token_ids: list[int] | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.logprob_entries: list[Any] = []
        self.text: list[str] = []
        self.role = "assistant"
        self.tool_calls: dict[int, _ToolCall] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.extra: dict[str, Any] = {}
        self.model_version: int | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        """Take one parsed ``data:`` chunk."""
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        self.created = self.created or chunk.get("created")
        if self.prompt_token_ids is None:
            self.prompt_token_ids = _int_list(chunk.get("prompt_token_ids"))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if self.model_version is None:
            self.model_version = model_version_of(chunk.get(MODEL_VERSION_FIELD))
        for key in ("system_fingerprint", "service_tier"):
            if chunk.get(key) is not None:
                self.extra[key] = chunk[key]
        choice = _first_choice(chunk)
        if choice is None:
            return
        if self.prompt_token_ids is None:
            self.prompt_token_ids = _int_list(choice.get("prompt_token_ids"))
        ids = _int_list(choice.get("token_ids"))
        if ids is not None:
            self.token_ids = (self.token_ids or []) + ids
        logprobs = _choice_logprobs(choice, self.kind)
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + logprobs
            block = cast(dict[str, Any], choice["logprobs"])
            if self.kind == "chat":
                self.logprob_entries.extend(cast(list[Any], block.get("content") or []))
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if self.kind == "completion":
            if isinstance(choice.get("text"), str):
                self.text.append(choice["text"])
            return
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        delta = cast(dict[str, Any], delta)
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        for raw_call in cast(list[Any], delta.get("tool_calls") or []):
            if not isinstance(raw_call, dict):
                continue
            call = cast(dict[str, Any], raw_call)
            slot = self.tool_calls.setdefault(int(call.get("index", 0)), _ToolCall())
            slot.id = slot.id or call.get("id")
            slot.type = call.get("type") or slot.type
            function = cast(dict[str, Any], call.get("function") or {})
            if function.get("name"):
                slot.name += str(function["name"])
            if function.get("arguments"):
                slot.arguments.append(str(function["arguments"]))

    def extracted(self) -> Extracted:
        """Token data of the whole stream."""
        extracted = finalize(self.prompt_token_ids, self.token_ids, self.logprobs)
        extracted.model_version = self.model_version
        return extracted

    def response(self) -> dict[str, Any]:
        """The stream as the equivalent non-streamed response (without token-id fields)."""
        text = "".join(self.text)
        if self.kind == "completion":
            choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": self.finish_reason}
            obj = "text_completion"
        else:
            message: dict[str, Any] = {"role": self.role, "content": text if text or not self.tool_calls else None}
            if self.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": call.type,
                        "function": {"name": call.name, "arguments": "".join(call.arguments)},
                    }
                    for _, call in sorted(self.tool_calls.items())
                ]
            choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
            if self.logprob_entries:
                choice["logprobs"] = {"content": self.logprob_entries}
            obj = "chat.completion"
        data: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        data.update(self.extra)
        if self.model_version is not None:
            data[MODEL_VERSION_FIELD] = self.model_version
        data["choices"] = [choice]
        if self.usage is not None:
            data["usage"] = self.usage
        return data


def without_token_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A shallow copy of a response without the token-id fields (they are recorded in their own columns)."""
    out = {k: v for k, v in data.items() if k != "prompt_token_ids"}
    choices = data.get("choices")
    if isinstance(choices, list):
        out["choices"] = [
            {k: v for k, v in cast(dict[str, Any], c).items() if k not in ("token_ids", "prompt_token_ids")}
            if isinstance(c, dict)
            else c
            for c in cast(list[Any], choices)
        ]
    return out


@dataclass(frozen=True)
class AgentView:
    """What the proxy asked the backend for on its own account (to record the call) and the agent did not.

    The agent gets its answer as the backend would have given it for the agent's own request: fields that only the
    proxy asked for are taken out of the response (and out of every stream chunk) before the agent sees them.
    """

    token_ids: bool = False
    """The agent did not ask for ``return_token_ids``: drop ``prompt_token_ids`` and the choices' ``token_ids``."""
    logprobs: bool = False
    """The agent did not ask for logprobs: the choices' ``logprobs`` become ``null`` (OpenAI's answer without them)."""

    @staticmethod
    def of(agent_request: dict[str, Any], kind: Kind) -> AgentView:
        """What to take out of the answers to ``agent_request`` when the proxy added its token-id options."""
        asked = agent_request.get("logprobs")
        # chat: a boolean; completions: a number of top logprobs (0 asks for the sampled token's own logprob)
        no_logprobs = not asked if kind == "chat" else asked is None or asked is False
        return AgentView(token_ids=not agent_request.get("return_token_ids"), logprobs=no_logprobs)

    def strip(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """A copy of a response or stream chunk without the added fields; ``None`` when it has none of them."""
        token_ids, logprobs = self.token_ids, self.logprobs
        out: dict[str, Any] | None = None
        if token_ids and "prompt_token_ids" in data:
            out = {k: v for k, v in data.items() if k != "prompt_token_ids"}
        choices = data.get("choices")
        if not isinstance(choices, list):
            return out
        stripped: list[Any] = []
        changed = False
        for choice in cast(list[Any], choices):
            if isinstance(choice, dict):
                fields = cast(dict[str, Any], choice)
                drop = token_ids and ("token_ids" in fields or "prompt_token_ids" in fields)
                nulled = logprobs and fields.get("logprobs") is not None
                if drop or nulled:
                    changed = True
                    fields = {k: v for k, v in fields.items() if not (token_ids and k in _ID_FIELDS)}
                    if nulled:
                        fields["logprobs"] = None
                choice = fields
            stripped.append(choice)
        if not changed:
            return out
        out = dict(data) if out is None else out
        out["choices"] = stripped
        return out


_ID_FIELDS = ("token_ids", "prompt_token_ids")
