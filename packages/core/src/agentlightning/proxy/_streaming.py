"""Streaming through the proxy: relaying SSE bytes as they come while assembling the call to record."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from starlette.responses import StreamingResponse

from agentlightning.proxy._assemble import AgentView, Extracted, SSEParser, StreamAssembler, dumps, loads
from agentlightning.proxy._slots import ATTEMPT_FINISHED
from agentlightning.proxy._transport import UNREACHABLE, BackendReply

__all__ = ["Meta", "RecordFn", "StreamState", "TrackedStream", "relay"]

Meta = tuple[str, str, str, dict[str, Any], str, float, int | None, str | None, str | None]
"""call id, rollout, attempt, request, backend, start, model version known before the answer (header or admitted),
policy (with a `PolicyMap`) and agent name (from the agent header)"""


RecordFn = Callable[[Meta, dict[str, Any] | None, Extracted], Awaitable[str | None]]
"""Records a call; returns why it could not be stored, or ``None``."""


@dataclass
class StreamState:
    assembler: StreamAssembler
    meta: Meta | None
    backend: str
    recorded: bool = False
    error: str | None = None
    view: AgentView = field(default_factory=AgentView)
    """What to take out of each chunk before the agent sees it (the proxy's own token-id options)."""


class TrackedStream(StreamingResponse):
    """A streaming response that always reports its end, even when the agent leaves before it starts."""

    on_close: Callable[[], None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.on_close is not None:
                self.on_close()


LATE_CALL = "AttemptEndedError: "
"""How the failure of a call whose attempt had already ended starts (the store refused its record as late)."""


def refusal_of(failure: str) -> tuple[int, str, str]:
    """(HTTP status, error type, message) for a call whose record could not be stored (``failure``: why).

    A late call (its attempt already ended, whoever ended it) gets 409 ``attempt_finished``; an unknown rollout or
    attempt 404; any other failure 502.
    """
    if failure.startswith(LATE_CALL):
        return 409, ATTEMPT_FINISHED, f"this late call is refused and not recorded: {failure.removeprefix(LATE_CALL)}"
    status = 404 if failure.startswith("NotFoundError") else 502
    message = (
        "the LLM proxy could not record this call, so its answer is withheld (no training data is lost silently): "
        + failure
    )
    return status, "proxy_record_error", message


async def relay(resp: BackendReply, state: StreamState, record: RecordFn) -> AsyncIterator[bytes]:
    """Pass the backend's SSE bytes through event by event, feeding the assembler; record before ``[DONE]``."""
    parser = SSEParser()
    assembler, view = state.assembler, state.view
    try:
        async for chunk in resp.chunks():
            out: list[bytes] = []
            for raw, data in parser.feed(chunk):
                if data is not None and data.strip() == "[DONE]":
                    if out:
                        yield b"".join(out)
                        out = []
                    # record before the agent sees the end, so the record exists when its span ends
                    if state.meta is not None and not state.recorded:
                        state.recorded = True
                        failure = await record(state.meta, assembler.response(), assembler.extracted())
                        if failure is not None:  # end with an error event, not [DONE]: the agent must not see success
                            code, kind, message = refusal_of(failure)
                            error = {"error": {"message": message, "type": kind, "code": code}}
                            yield b"data: " + dumps(error) + b"\n\n"
                            return
                elif data is not None:
                    with contextlib.suppress(ValueError):
                        parsed = loads(data)
                        if isinstance(parsed, dict):
                            assembler.feed(cast(dict[str, Any], parsed))
                            stripped = view.strip(cast(dict[str, Any], parsed))
                            if stripped is not None:  # the event again, as data only, without the proxy's fields
                                raw = b"data: " + dumps(stripped) + b"\n\n"
                out.append(raw)
            if out:
                yield b"".join(out)
        rest = parser.rest()
        if rest:
            yield rest
    except UNREACHABLE as exc:
        state.error = f"stream from backend {state.backend} broke: {exc!r}"
    except (asyncio.CancelledError, GeneratorExit):
        state.error = "agent disconnected before the stream ended"
        raise
