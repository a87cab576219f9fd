"""A scripted, deterministic OpenAI-compatible model server on 127.0.0.1 for tests and benchmarks.

`ScriptedModelServer` serves ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` over real HTTP
(aiohttp in a background thread), with the vLLM-style extras the LLM proxy asks for: ``return_token_ids``
(top-level ``prompt_token_ids`` and per-choice ``token_ids``) and ``logprobs``. Its tokenizer is `ToyTokenizer`,
a byte-level tokenizer, so every id it reports is a real id of real text.

Chat prompt template (what ``prompt_token_ids`` encode)::

    [<|tools|>\\n{tools as compact JSON}\\n]        only when the request has tools
    <|{role}|>\\n{content}\\n                      per message; an assistant's tool calls are appended
                                                   as <tool_call>{"name": ..., "arguments": ...}</tool_call>
    <|assistant|>\\n                               the generation prompt

The generated text of a reply is its content followed by one ``<tool_call>...</tool_call>`` per tool call;
``token_ids`` are the ids of that text. Pseudo-logprobs are a fixed function of (token id, position).

Model versions: with ``model_version`` set (an int), every response body and every stream chunk carries a
top-level ``model_version`` (the wire field the LLM proxy records, `agentlightning.proxy.MODEL_VERSION_FIELD`) and
non-streamed answers the ``x-agentlightning-model-version`` header. The version is the server's ``model_version``
*when the request arrived* (its "weights" at generation time), so a test can change it while a held request waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agentlightning.testing._toy_tokenizer import ToyTokenizer, content_text, pseudo_logprob

__all__ = ["ScriptedModelServer", "ScriptedReply", "ServedCall", "ToyTokenizer"]

logger = logging.getLogger(__name__)


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


class ScriptedModelServer:
    """An OpenAI-compatible server on 127.0.0.1 that answers from a script.

    Args:
        script: A list of replies used in order (a request after the last one gets HTTP 500 saying the script
            is exhausted), a callable ``(request_body) -> ScriptedReply | str``, or ``None`` to echo the last
            user message. A ``str`` is shorthand for ``ScriptedReply(content=...)``.
        model: Name listed by ``/v1/models`` (responses echo the requested model).
        emit_token_ids: ``False`` imitates a backend that ignores ``return_token_ids`` (plain OpenAI).
        latency: Seconds to wait before answering each request.
        stream_chunk_chars: Characters of content per streamed chunk.
        model_version: Version reported on answers (see the module docs); ``None`` reports none (like vLLM).

    Use as a context manager (``with ScriptedModelServer() as server: server.url``) or ``start()``/``stop()``.
    ``requests`` lists every JSON body received, ``served`` what was answered. `hold` / `release` make requests
    wait (received, not answered) until released.
    """

    def __init__(
        self,
        script: Script = None,
        *,
        model: str = "toy-model",
        emit_token_ids: bool = True,
        latency: float = 0.0,
        stream_chunk_chars: int = 4,
        model_version: int | None = None,
    ) -> None:
        if stream_chunk_chars < 1:
            raise ValueError("stream_chunk_chars must be >= 1")
        self.tokenizer = ToyTokenizer()
        self.model = model
        self.emit_token_ids = emit_token_ids
        self.latency = latency
        self.stream_chunk_chars = stream_chunk_chars
        self.model_version = model_version
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []  # the Authorization header of each request, in order
        self.served: list[ServedCall] = []
        self._script = script
        self._script_index = 0
        self._failures: list[tuple[int, str | None]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._released: asyncio.Event | None = None
        self._held = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        """The bound port (after `start`)."""
        if self._port is None:
            raise RuntimeError("ScriptedModelServer is not started; call start() or use it as a context manager")
        return self._port

    @property
    def url(self) -> str:
        """Base URL without ``/v1``, e.g. ``http://127.0.0.1:54321``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI-client base URL: `url` + ``/v1``."""
        return f"{self.url}/v1"

    def start(self) -> ScriptedModelServer:
        """Start serving on a free port in a background thread; returns self."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # reported to start()
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="scripted-model-server", daemon=True)
        self._thread.start()
        ready.wait(timeout=30)
        if errors:
            self._thread = None
            raise RuntimeError(f"ScriptedModelServer failed to start: {errors[0]}") from errors[0]
        return self

    def stop(self) -> None:
        """Stop the server and its thread."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None
        self._loop = None
        self._port = None

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        self._released = asyncio.Event()
        if not self._held:
            self._released.set()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server  # pyright: ignore[reportPrivateUsage]
        sockets = getattr(server, "sockets", None) or []
        self._port = int(sockets[0].getsockname()[1])

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ test controls
    def fail_next(self, count: int = 1, status: int = 500, message: str | None = None) -> None:
        """Answer the next ``count`` requests with HTTP ``status`` (e.g. 500, 429) instead of a reply."""
        if count < 1 or not 400 <= status <= 599:
            raise ValueError(f"fail_next needs count >= 1 and a 4xx/5xx status, got count={count}, status={status}")
        with self._lock:
            self._failures.extend([(status, message)] * count)

    def hold(self) -> None:
        """Receive requests but answer none until `release` (the request is in `requests` meanwhile)."""
        self._set_held(True)

    def release(self) -> None:
        """Answer the requests held since `hold`, and every later one at once."""
        self._set_held(False)

    def _set_held(self, held: bool) -> None:
        self._held = held
        released, loop = self._released, self._loop
        if released is not None and loop is not None:
            loop.call_soon_threadsafe(released.clear if held else released.set)

    def set_script(self, script: Script) -> None:
        """Replace the script (and restart it from its first reply)."""
        with self._lock:
            self._script = script
            self._script_index = 0

    # ------------------------------------------------------------------ generation
    def _next_reply(self, body: dict[str, Any]) -> ScriptedReply:
        script = self._script
        if script is None:
            messages = body.get("messages")
            if isinstance(messages, list):
                users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
                text = content_text(users[-1].get("content")) if users else ""
            else:
                text = str(body.get("prompt", ""))
            return ScriptedReply(content=text)
        if callable(script):
            reply = script(body)
        else:
            with self._lock:
                if self._script_index >= len(script):
                    raise _ScriptExhausted(f"script exhausted: all {len(script)} scripted replies were used")
                reply = script[self._script_index]
                self._script_index += 1
        return ScriptedReply(content=reply) if isinstance(reply, str) else reply

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
    async def _pre(self, request: web.Request) -> tuple[dict[str, Any] | None, web.Response | None, int | None]:
        """The request body (or the error to answer) and the model version when it arrived."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None, _error(400, "request body is not valid JSON"), None
        if not isinstance(body, dict):
            return None, _error(400, "request body must be a JSON object"), None
        with self._lock:
            version = self.model_version
            self.requests.append(body)
            self.authorizations.append(request.headers.get("Authorization"))
            failure = self._failures.pop(0) if self._failures else None
        if self._released is not None:
            await self._released.wait()
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        if failure is not None:
            status, message = failure
            with self._lock:
                self.served.append(ServedCall(request.path, body, status=status))
            return (
                None,
                _error(status, message or f"injected failure (HTTP {status})", headers={"Retry-After": "0"}),
                None,
            )
        n = body.get("n", 1)
        if n != 1:
            return None, _error(400, f"ScriptedModelServer supports only n=1, got n={n!r}"), None
        return body, None, version

    async def _models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "test"}]}
        return web.json_response(data)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body, err, version = await self._pre(request)
        if err is not None or body is None:
            return err or _error(500, "unreachable")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' must be a non-empty list")
        prompt_ids = self.tokenizer.encode(self.tokenizer.render_chat(messages, body.get("tools")))
        try:
            gen = self._generate(self._next_reply(body), prompt_ids)
        except _ScriptExhausted as exc:
            return _error(500, str(exc))
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

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body, err, version = await self._pre(request)
        if err is not None or body is None:
            return err or _error(500, "unreachable")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = [int(t) for t in prompt]
        elif isinstance(prompt, str):
            prompt_ids = self.tokenizer.encode(prompt)
        else:
            return _error(400, "'prompt' must be a string or a list of token ids")
        try:
            gen = self._generate(self._next_reply(body), prompt_ids)
        except _ScriptExhausted as exc:
            return _error(500, str(exc))
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

        def lp_block(piece_ids: list[int], start: int) -> dict[str, Any]:
            toks = [self.tokenizer.token_text(t) for t in piece_ids]
            return {
                "tokens": toks,
                "token_logprobs": [pseudo_logprob(t, start + j) for j, t in enumerate(piece_ids)],
                "top_logprobs": [{} for _ in piece_ids],
                "text_offset": list(range(start, start + len(piece_ids))),
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
                    choice["logprobs"] = lp_block(piece_ids, pos)
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
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": lp_block(ids, 0) if want_lp else None}
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


class _ScriptExhausted(Exception):
    pass


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


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status, headers=headers)
