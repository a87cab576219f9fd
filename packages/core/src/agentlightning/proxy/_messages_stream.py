"""A streamed chat completion, relayed as Anthropic's Messages event stream.

The chat path relays the backend's chunks (recording the call before it passes ``[DONE]`` on); this turns them into
the events the ``anthropic`` SDK parses, in their order::

    message_start
    content_block_start / content_block_delta (text_delta, thinking_delta, input_json_delta) / content_block_stop
    ... one block after the other: thinking, text, then each tool call
    message_delta (stop_reason, stop_sequence, usage)
    message_stop

``message_stop`` is sent only for ``[DONE]`` (so the call's record exists before the agent sees the end) or a stream
that ended on a finish reason; a stream that broke off, or whose record could not be stored, ends with an ``error``
event instead, which the SDK raises.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

from agentlightning.proxy._assemble import SSEParser, dumps, loads
from agentlightning.proxy._messages import anthropic_error, stop_reason, usage_of

__all__ = ["message_events"]


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **payload}) + b"\n\n"


class _Translator:
    """The state of one stream: the block being written, the finish reason and usage seen so far."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.started = False
        self.index = -1
        self.open: str | None = None  # "text", "thinking", or "tool_use"
        self.tool_blocks: dict[int, int] = {}  # the chat tool call's index -> its block's index
        self.finish: str | None = None
        self.matched: Any = None
        self.usage: Any = None

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if not self.started:
            self.started = True
            message = {
                "id": chunk.get("id") or f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                "model": chunk.get("model"), "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }  # fmt: skip
            out.append(_event("message_start", {"message": message}))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = cast(list[Any], choices)[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict) or cast(dict[str, Any], choice).get("index", 0) != 0:
            return out
        choice = cast(dict[str, Any], choice)
        if choice.get("finish_reason") is not None:
            self.finish, self.matched = choice["finish_reason"], choice.get("stop_reason")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(cast(dict[str, Any], delta), out)
        return out

    def _delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self._ensure("thinking", {"type": "thinking", "thinking": "", "signature": ""}, out)
            out.append(self._delta_event({"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._ensure("text", {"type": "text", "text": ""}, out)
            out.append(self._delta_event({"type": "text_delta", "text": text}))
        for raw in cast(list[Any], delta.get("tool_calls") or []):
            if not isinstance(raw, dict):
                continue
            call = cast(dict[str, Any], raw)
            function = cast(dict[str, Any], call.get("function") or {})
            position = int(call.get("index", 0))
            if position not in self.tool_blocks:
                block = {"type": "tool_use", "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                         "name": function.get("name") or "", "input": {}}  # fmt: skip
                self._start("tool_use", block, out)
                self.tool_blocks[position] = self.index
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                index = self.tool_blocks[position]
                delta_event = {"index": index, "delta": {"type": "input_json_delta", "partial_json": arguments}}
                out.append(_event("content_block_delta", delta_event))

    def _delta_event(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self.index, "delta": delta})

    def _ensure(self, kind: str, block: dict[str, Any], out: list[bytes]) -> None:
        if self.open != kind:
            self._start(kind, block, out)

    def _start(self, kind: str, block: dict[str, Any], out: list[bytes]) -> None:
        self._stop(out)
        self.index += 1
        self.open = kind
        out.append(_event("content_block_start", {"index": self.index, "content_block": block}))

    def _stop(self, out: list[bytes]) -> None:
        if self.open is not None:
            out.append(_event("content_block_stop", {"index": self.index}))
            self.open = None

    def close(self) -> list[bytes]:
        """The events that end the message: the last block's stop, ``message_delta`` and ``message_stop``."""
        out: list[bytes] = [] if self.started else self.feed({})
        self._stop(out)
        reason, sequence = stop_reason(self.finish, self.matched, self.stops)
        usage = usage_of(self.usage)
        delta = {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage}
        out.append(_event("message_delta", delta))
        out.append(_event("message_stop", {}))
        return out


def _error_event(status: int, message: str) -> bytes:
    return b"event: error\ndata: " + anthropic_error(status, message) + b"\n\n"


async def message_events(chunks: AsyncIterator[bytes], stops: list[str]) -> AsyncIterator[bytes]:
    """Anthropic's events for the chat stream ``chunks`` (the proxy's relay: already recorded at ``[DONE]``)."""
    parser = SSEParser()
    translator = _Translator(stops)
    ended = False
    try:
        async for chunk in chunks:
            out: list[bytes] = []
            for _, data in parser.feed(chunk):
                if data is None or ended:
                    continue
                if data.strip() == "[DONE]":
                    out += translator.close()
                    ended = True
                    continue
                try:
                    parsed = loads(data)
                except ValueError:
                    continue
                if not isinstance(parsed, dict):
                    continue
                parsed = cast(dict[str, Any], parsed)
                failure = parsed.get("error")
                if isinstance(failure, dict) and "choices" not in parsed:  # the call could not be recorded, or broke
                    failure = cast(dict[str, Any], failure)
                    code = failure.get("code")
                    out.append(_error_event(code if isinstance(code, int) else 500, str(failure.get("message"))))
                    ended = True
                    continue
                out += translator.feed(parsed)
            if out:
                yield b"".join(out)
        if not ended:
            if translator.finish is not None:  # a complete stream without [DONE]
                yield b"".join(translator.close())
            else:
                yield _error_event(502, "the backend's stream ended before the answer was complete")
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
