"""The OpenAI wire answers of `ScriptedModelServer`: chat and text completions, streamed or not, and the model list.

Answers follow OpenAI's format with the vLLM-style extras the LLM proxy asks for (``return_token_ids``: top-level
``prompt_token_ids`` and per-choice ``token_ids``; ``logprobs``). `ScriptedAnswers` holds the handlers;
`ScriptedModelServer` (``_model_server.py``) supplies the script, the request checks and the serving.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from aiohttp import web

from agentlightning.testing._toy_tokenizer import ToyTokenizer, pseudo_logprob

__all__ = ["Script", "ScriptExhausted", "ScriptedAnswers", "ScriptedReply", "ServedCall", "error_answer"]


@dataclass(frozen=True)
class ScriptedReply:
    """What the scripted model answers to one request.

    Attributes:
        content: Assistant text (may be empty when the reply only calls tools).
        tool_calls: Tool calls as ``{"name": str, "arguments": dict | str, "id": str (optional)}``.
        finish_reason: Defaults to ``"tool_calls"`` when there are tool calls, else ``"stop"``.
    """

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None


@dataclass
class ServedCall:
    """One request the server answered (or failed on purpose), for assertions in tests.

    Attributes:
        path: Request path.
        request: The JSON body received.
        status: HTTP status returned.
        prompt_token_ids: Ids of the rendered prompt.
        token_ids: Ids generated.
        logprobs: Pseudo-logprob of each generated id.
        response_id: ``id`` of the response sent.
    """

    path: str
    request: dict[str, Any]
    status: int = 200
    prompt_token_ids: list[int] = field(default_factory=list[int])
    token_ids: list[int] = field(default_factory=list[int])
    logprobs: list[float] = field(default_factory=list[float])
    response_id: str | None = None


Script = Sequence["ScriptedReply | str"] | Callable[[dict[str, Any]], "ScriptedReply | str"] | None


@dataclass
class _Generated:
    reply: ScriptedReply
    prompt_ids: list[int]
    content_ids: list[int]
    tool_calls: list[dict[str, Any]]  # OpenAI-format tool calls
    tool_call_ids: list[list[int]]

    @property
    def token_ids(self) -> list[int]:
        ids = list(self.content_ids)
        for part in self.tool_call_ids:
            ids.extend(part)
        return ids


class ScriptedAnswers:
    """The handlers of ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``.

    A subclass supplies the state below, `_pre` (read and admit a request) and `_next_reply` (the script).
    """

    tokenizer: ToyTokenizer
    model: str
    emit_token_ids: bool
    stream_chunk_chars: int
    served: list[ServedCall]
    _lock: threading.Lock

    async def _pre(self, request: web.Request) -> tuple[dict[str, Any] | None, web.Response | None, int | None]:
        """The request body (or the error to answer) and the model version when it arrived."""
        raise NotImplementedError

    def _next_reply(self, body: dict[str, Any]) -> ScriptedReply:
        """The scripted reply to the request ``body`` (raises `ScriptExhausted` when a list script is used up)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ generation
    def _generate(self, reply: ScriptedReply, prompt_ids: list[int]) -> _Generated:
        tok = self.tokenizer
        tool_calls: list[dict[str, Any]] = []
        tool_ids: list[list[int]] = []
        for i, call in enumerate(reply.tool_calls or []):
            args = call.get("arguments", {})
            args_text = args if isinstance(args, str) else json.dumps(args)
            name = str(call["name"])
            tool_calls.append(
                {
                    "id": str(call.get("id") or f"call_{uuid.uuid4().hex[:12]}_{i}"),
                    "type": "function",
                    "function": {"name": name, "arguments": args_text},
                }
            )
            tool_ids.append(tok.encode(tok.render_tool_call(name, args_text)))
        return _Generated(reply, prompt_ids, tok.encode(reply.content or ""), tool_calls, tool_ids)

    def _chat_logprobs(self, ids: list[int], start: int) -> list[dict[str, Any]]:
        tok = self.tokenizer
        out: list[dict[str, Any]] = []
        for j, tid in enumerate(ids):
            lp = pseudo_logprob(tid, start + j)
            out.append({"token": tok.token_text(tid), "logprob": lp, "bytes": [tid - tok.offset], "top_logprobs": []})
        return out

    # ------------------------------------------------------------------ handlers
    async def _models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "test"}]}
        return web.json_response(data)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body, err, version = await self._pre(request)
        if err is not None or body is None:
            return err or error_answer(500, "unreachable")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error_answer(400, "'messages' must be a non-empty list")
        prompt_ids = self.tokenizer.encode(self.tokenizer.render_chat(messages, body.get("tools")))
        try:
            gen = self._generate(self._next_reply(body), prompt_ids)
        except ScriptExhausted as exc:
            return error_answer(500, str(exc))
        want_ids = bool(body.get("return_token_ids")) and self.emit_token_ids
        want_lp = bool(body.get("logprobs"))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        model = str(body.get("model") or self.model)
        finish = gen.reply.finish_reason or ("tool_calls" if gen.tool_calls else "stop")
        ids = gen.token_ids
        self._record(request.path, body, gen, rid)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
        }
        if body.get("stream"):
            return await self._stream_chat(request, body, gen, rid, model, finish, usage, want_ids, want_lp, version)
        message: dict[str, Any] = {"role": "assistant", "content": gen.reply.content if gen.reply.content else None}
        if gen.tool_calls:
            message["tool_calls"] = gen.tool_calls
        elif message["content"] is None:
            message["content"] = ""
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if want_lp:
            choice["logprobs"] = {"content": self._chat_logprobs(ids, 0)}
        if want_ids:
            choice["token_ids"] = ids
        data: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
        if want_ids:
            data["prompt_token_ids"] = prompt_ids
        return _json(data, version)

    async def _stream_chat(
        self,
        request: web.Request,
        body: dict[str, Any],
        gen: _Generated,
        rid: str,
        model: str,
        finish: str,
        usage: dict[str, int],
        want_ids: bool,
        want_lp: bool,
        version: int | None,
    ) -> web.StreamResponse:
        resp = _stream_response(version)
        await resp.prepare(request)
        created = int(time.time())
        position = 0

        def chunk(delta: dict[str, Any], ids: list[int], finish_reason: str | None = None) -> dict[str, Any]:
            nonlocal position
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            if want_lp and ids:
                choice["logprobs"] = {"content": self._chat_logprobs(ids, position)}
            if want_ids:
                choice["token_ids"] = ids
            position += len(ids)
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
            }

        first = chunk({"role": "assistant", "content": ""}, [])
        if want_ids:
            first["prompt_token_ids"] = gen.prompt_ids
        await _send(resp, first)
        content = gen.reply.content or ""
        step = self.stream_chunk_chars
        for i in range(0, len(content), step):
            piece = content[i : i + step]
            await _send(resp, chunk({"content": piece}, self.tokenizer.encode(piece)))
        for index, (call, call_ids) in enumerate(zip(gen.tool_calls, gen.tool_call_ids, strict=True)):
            head = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            await _send(resp, chunk({"tool_calls": [head]}, call_ids))
            args = call["function"]["arguments"]
            for i in range(0, len(args), step * 2):
                frag = {"index": index, "function": {"arguments": args[i : i + step * 2]}}
                await _send(resp, chunk({"tool_calls": [frag]}, []))
        await _send(resp, chunk({}, [], finish))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            await _send(
                resp,
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                },
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _completion_prompt(self, prompt: Any) -> list[int] | None:
        """The legacy completions API's ``prompt`` as token ids (a string or a list of ids), ``None`` if neither."""
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in cast(list[Any], prompt)):
            return [int(t) for t in cast(list[int], prompt)]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return None

    def _completion_logprobs(self, piece_ids: list[int], start: int) -> dict[str, Any]:
        """The legacy completions API's ``logprobs`` block of the tokens ``piece_ids`` at text offset ``start``."""
        return {
            "tokens": [self.tokenizer.token_text(t) for t in piece_ids],
            "token_logprobs": [pseudo_logprob(t, start + j) for j, t in enumerate(piece_ids)],
            "top_logprobs": [{} for _ in piece_ids],
            "text_offset": list(range(start, start + len(piece_ids))),
        }

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body, err, version = await self._pre(request)
        if err is not None or body is None:
            return err or error_answer(500, "unreachable")
        prompt_ids = self._completion_prompt(body.get("prompt"))
        if prompt_ids is None:
            return error_answer(400, "'prompt' must be a string or a list of token ids")
        try:
            gen = self._generate(self._next_reply(body), prompt_ids)
        except ScriptExhausted as exc:
            return error_answer(500, str(exc))
        want_ids = bool(body.get("return_token_ids")) and self.emit_token_ids
        want_lp = body.get("logprobs") is not None and body.get("logprobs") is not False
        rid = f"cmpl-{uuid.uuid4().hex}"
        model = str(body.get("model") or self.model)
        text = gen.reply.content or ""
        ids = gen.content_ids
        finish = gen.reply.finish_reason or "stop"
        self._record(request.path, body, gen, rid, ids_override=ids)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
        }

        if body.get("stream"):
            resp = _stream_response(version)
            await resp.prepare(request)
            created = int(time.time())
            pos = 0
            pieces = [text[i : i + self.stream_chunk_chars] for i in range(0, len(text), self.stream_chunk_chars)]
            for k, piece in enumerate(pieces or [""]):
                piece_ids = self.tokenizer.encode(piece)
                last = k == max(len(pieces), 1) - 1
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": piece,
                    "finish_reason": finish if last else None,
                    "logprobs": None,
                }
                if want_lp:
                    choice["logprobs"] = self._completion_logprobs(piece_ids, pos)
                if want_ids:
                    choice["token_ids"] = piece_ids
                data: dict[str, Any] = {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
                if want_ids and k == 0:
                    data["prompt_token_ids"] = prompt_ids
                pos += len(piece_ids)
                await _send(resp, data)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": finish,
            "logprobs": self._completion_logprobs(ids, 0) if want_lp else None,
        }
        if want_ids:
            choice["token_ids"] = ids
        data = {
            "id": rid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
        if want_ids:
            data["prompt_token_ids"] = prompt_ids
        return _json(data, version)

    def _record(
        self, path: str, body: dict[str, Any], gen: _Generated, rid: str, ids_override: list[int] | None = None
    ) -> None:
        ids = gen.token_ids if ids_override is None else ids_override
        call = ServedCall(
            path,
            body,
            prompt_token_ids=gen.prompt_ids,
            token_ids=ids,
            logprobs=[pseudo_logprob(t, j) for j, t in enumerate(ids)],
            response_id=rid,
        )
        with self._lock:
            self.served.append(call)


class ScriptExhausted(Exception):
    """A list script has no reply left."""


_VERSION_HEADER = "x-agentlightning-model-version"


class _VersionedStream(web.StreamResponse):
    """A stream whose every chunk carries the version of the weights generating it."""

    model_version: int | None = None


def _json(data: dict[str, Any], version: int | None) -> web.Response:
    if version is None:
        return web.json_response(data)
    return web.json_response({**data, "model_version": version}, headers={_VERSION_HEADER: str(version)})


def _stream_response(version: int | None) -> web.StreamResponse:
    resp = _VersionedStream(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    resp.model_version = version
    return resp


async def _send(resp: web.StreamResponse, data: dict[str, Any]) -> None:
    version = resp.model_version if isinstance(resp, _VersionedStream) else None
    if version is not None:
        data = {**data, "model_version": version}
    await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")


def error_answer(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status, headers=headers)
