"""How the LLM proxy serves an agent API other than chat completions: translated to the backend's chat completions.

The agent's request is translated into a chat completion request before it is forwarded, so every backend serves it
the way it serves chat (the model's own chat template, its tool-call parser) and the proxy records the exact prompt
and response token ids as for a chat call. The chat answer is translated back into the agent's API. A `Translation`
carries that pair of translations through `agentlightning.proxy._forwarding.Forwarder.complete`; the call's
`LLMCall` keeps the agent's request and the answer the agent got (its ``id`` is the one the agent's spans name).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol, cast

from agentlightning.proxy._assemble import SSEParser, loads
from agentlightning.proxy._streaming import RecordFn, StreamState, refusal_of
from agentlightning.proxy._transport import UNREACHABLE, BackendReply

__all__ = ["Translation", "relay_translated"]


class Translation(Protocol):
    """One call of an agent API served through chat completions: its request translated, and how to answer it."""

    @property
    def request(self) -> dict[str, Any]:
        """The agent's request as it sent it (what the call's record keeps)."""
        ...

    @property
    def chat_request(self) -> dict[str, Any]:
        """The chat completion request the backend gets (the proxy adds its token-id options to a copy)."""
        ...

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The agent's answer for a whole chat completion (for a stream: the assembled one, after its events)."""
        ...

    def events(self, chunk: dict[str, Any]) -> bytes:
        """The agent's stream events (SSE bytes) for one chat completion chunk."""
        ...

    def closing(self, answer: dict[str, Any]) -> bytes:
        """The events that end the agent's stream, once ``answer`` (from `answer`) is recorded."""
        ...

    def failed(self, status: int, kind: str, message: str) -> bytes:
        """The event that ends the agent's stream with an error (its call could not be recorded)."""
        ...


async def relay_translated(
    resp: BackendReply, state: StreamState, record: RecordFn, translation: Translation
) -> AsyncIterator[bytes]:
    """The chat stream of ``resp`` as the agent's API's stream; recorded before its closing events.

    A chat stream that ends (``[DONE]``, or a finish reason and the end of the body) is closed the agent's way: its
    answer recorded first, then the closing events, or an error event if the record failed. A stream that breaks off
    gives the agent what was translated so far (the call is recorded with the error when the response closes).
    """
    parser = SSEParser()
    assembler = state.assembler
    try:
        async for chunk in resp.chunks():
            out: list[bytes] = []
            for _, data in parser.feed(chunk):
                if data is None:
                    continue
                if data.strip() == "[DONE]":
                    if out:
                        yield b"".join(out)
                        out = []
                    yield await _close(state, record, translation)
                    return
                with contextlib.suppress(ValueError):
                    parsed = loads(data)
                    if isinstance(parsed, dict):
                        parsed = cast(dict[str, Any], parsed)
                        assembler.feed(parsed)
                        out.append(translation.events(parsed))
            if out:
                yield b"".join(out)
        if assembler.finish_reason is not None:  # a complete stream without [DONE]
            yield await _close(state, record, translation)
    except UNREACHABLE as exc:
        state.error = f"stream from backend {state.backend} broke: {exc!r}"
    except (asyncio.CancelledError, GeneratorExit):
        state.error = "agent disconnected before the stream ended"
        raise


async def _close(state: StreamState, record: RecordFn, translation: Translation) -> bytes:
    """Record the assembled answer (a recorded call), then the closing events, or the error event if that failed."""
    answer = translation.answer(state.assembler.response())
    if state.meta is not None and not state.recorded:
        state.recorded = True
        failure = await record(state.meta, answer, state.assembler.extracted())
        if failure is not None:  # the agent must not see success for a call whose record is lost
            code, kind, message = refusal_of(failure)
            return translation.failed(code, kind, message)
    return translation.closing(answer)
