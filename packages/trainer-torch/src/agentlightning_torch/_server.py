"""An OpenAI-compatible HTTP server over `LocalBackend`, speaking vLLM's wire format for token ids.

With ``return_token_ids: true`` a chat response carries top-level ``prompt_token_ids`` and per choice
``token_ids`` (streams: ``prompt_token_ids`` in the first chunk, ``token_ids`` deltas per chunk), exactly as
vLLM returns them, so the LLM proxy records the same fields from either backend.

Every answer also says which weights produced it: a top-level ``model_version`` (the backend's version when the
batch ran) in the response body and in every stream chunk that carries tokens, and the
``x-agentlightning-model-version`` header on non-streamed answers. The LLM proxy records it on the `LLMCall`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentlightning_torch._backend import LocalBackend
from agentlightning_torch._generate import GenerationResult, SamplingParams, StepCallback
from agentlightning_torch._template import CalcChatTemplate
from agentlightning_torch._tokenizer import CharTokenizer

__all__ = ["BackendServer", "create_app", "serve_backend"]

logger = logging.getLogger(__name__)

_DEFAULT_MAX_TOKENS = 64


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=128)
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    return_token_ids: bool = False
    stop: str | list[str] | None = None


class _ChatRequest(_SamplingRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    logprobs: bool = False


class _CompletionRequest(_SamplingRequest):
    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _sampling(request: _SamplingRequest, prompt_length: int, backend: LocalBackend, top: int) -> SamplingParams:
    if request.stop:
        raise _BadRequest("stop sequences are not supported by the local backend; it stops at eos", "stop")
    room = backend.max_context - prompt_length
    if room < 1:
        raise _BadRequest(f"the prompt has {prompt_length} tokens; the model's context is {backend.max_context}")
    wanted = request.max_completion_tokens or request.max_tokens
    if wanted is not None and wanted > room:
        raise _BadRequest(
            f"max_tokens={wanted} plus the {prompt_length}-token prompt exceeds the model's context of "
            f"{backend.max_context} tokens",
            "max_tokens",
        )
    return SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        max_tokens=wanted or min(_DEFAULT_MAX_TOKENS, room),
        seed=request.seed,
        top_logprobs=top,
    )


def _relay(
    loop: asyncio.AbstractEventLoop,
    events: asyncio.Queue[Any],
    index: int,
    backend: LocalBackend,
    _row: int,
    token: int,
    logprob: float,
    top: Any,
    end: Any,
) -> None:
    # Runs in the worker thread during the batch (weights locked), so this is the version generating the token.
    version = backend.model_version
    loop.call_soon_threadsafe(events.put_nowait, (index, token, logprob, top, end, version))


def _submit(
    backend: LocalBackend, prompt: list[int], params: SamplingParams, count: int, events: asyncio.Queue[Any] | None
) -> list[Future[GenerationResult]]:
    """Queue ``count`` choices; with ``events``, each token is pushed as an event tuple.

    The tuple is ``(choice, token, logprob, top, end, version)``, ``version`` being the weights generating it.
    """
    loop = asyncio.get_running_loop()
    futures: list[Future[GenerationResult]] = []
    for index in range(count):
        choice_params = params
        if params.seed is not None and index:
            choice_params = SamplingParams(**{**params.__dict__, "seed": params.seed + index})
        callback: StepCallback | None = None
        if events is not None:
            callback = functools.partial(_relay, loop, events, index, backend)
        futures.append(backend.submit(prompt, choice_params, callback))
    return futures


class _Wire:
    """Builds response bodies for one backend."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.tokenizer: CharTokenizer = backend.tokenizer

    def token_text(self, token: int) -> str:
        return self.tokenizer.convert_ids_to_tokens([token])[0]

    def logprob_entry(self, token: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
        return {
            "token": self.token_text(token),
            "logprob": logprob,
            "bytes": None,
            "top_logprobs": [{"token": self.token_text(t), "logprob": v, "bytes": None} for t, v in top],
        }

    def usage(self, prompt: list[int], results: list[GenerationResult]) -> dict[str, int]:
        completion = sum(len(r.token_ids) for r in results)
        return {"prompt_tokens": len(prompt), "completion_tokens": completion, "total_tokens": len(prompt) + completion}


def _parse_body(model: type[BaseModel], body: bytes) -> Any:
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        first = error.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise _BadRequest(f"invalid request: {location}: {first['msg']}", location or None) from error


def create_app(backend: LocalBackend) -> FastAPI:
    """The FastAPI app serving ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` for ``backend``."""
    app = FastAPI(title="agentlightning local backend")
    wire = _Wire(backend)

    @app.exception_handler(_BadRequest)
    async def _bad_request(_request: Request, error: _BadRequest) -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
        return _error(400, str(error), error.param)

    @app.get("/v1/models")
    async def _models() -> dict[str, Any]:  # pyright: ignore[reportUnusedFunction]
        entry = {"id": backend.model_name, "object": "model", "created": 0, "owned_by": "agentlightning"}
        return {"object": "list", "data": [{**entry, "max_model_len": backend.max_context}]}

    @app.get("/health")
    async def _health() -> dict[str, Any]:  # pyright: ignore[reportUnusedFunction]
        return {"status": "ok", "model_version": backend.model_version}

    @app.post("/v1/chat/completions")
    async def _chat(request: Request) -> Response:  # pyright: ignore[reportUnusedFunction]
        body: _ChatRequest = _parse_body(_ChatRequest, await request.body())
        try:
            prompt = backend.template.render(body.messages, tools=body.tools, add_generation_prompt=True)
        except ValueError as error:
            raise _BadRequest(str(error), "messages") from error
        params = _sampling(body, len(prompt), backend, (body.top_logprobs or 0) if body.logprobs else 0)
        tools = body.tools if body.tool_choice != "none" else None
        if body.stream:
            events: asyncio.Queue[Any] = asyncio.Queue()
            futures = _submit(backend, prompt, params, body.n, events)
            stream = _chat_stream(wire, body, prompt, tools, futures, events)
            return StreamingResponse(stream, media_type="text/event-stream")
        results = [await asyncio.wrap_future(f) for f in _submit(backend, prompt, params, body.n, None)]
        choices: list[dict[str, Any]] = []
        for index, result in enumerate(results):
            parsed = backend.template.parse_response(result.token_ids, tools=tools)
            message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            finish = result.finish_reason
            if parsed.tool_calls and finish == "stop":
                message["tool_calls"] = parsed.tool_calls
                finish = "tool_calls"
            elif parsed.tool_calls:  # cut off by max_tokens: not a complete call
                message["content"] = backend.tokenizer.decode(result.token_ids)
            choice: dict[str, Any] = {"index": index, "message": message, "logprobs": None, "finish_reason": finish}
            if body.logprobs:
                content = [
                    wire.logprob_entry(t, lp, result.top_logprobs[i] if result.top_logprobs else [])
                    for i, (t, lp) in enumerate(zip(result.token_ids, result.logprobs, strict=True))
                ]
                choice["logprobs"] = {"content": content}
            if body.return_token_ids:
                choice["token_ids"] = result.token_ids
            choices.append(choice)
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model or backend.model_name,
            "choices": choices,
            "usage": wire.usage(prompt, results),
        }
        if body.return_token_ids:
            response["prompt_token_ids"] = prompt
        return _versioned(response, results)

    @app.post("/v1/completions")
    async def _complete(request: Request) -> Response:  # pyright: ignore[reportUnusedFunction]
        body: _CompletionRequest = _parse_body(_CompletionRequest, await request.body())
        if body.echo:
            raise _BadRequest("echo is not supported by the local backend", "echo")
        if body.stream:
            raise _BadRequest("streaming is supported on /v1/chat/completions only", "stream")
        if isinstance(body.prompt, str):
            try:
                prompt = backend.tokenizer.encode(body.prompt, add_bos=True)
            except ValueError as error:
                raise _BadRequest(str(error), "prompt") from error
        else:
            prompt = list(body.prompt)
        params = _sampling(body, len(prompt), backend, body.logprobs or 0)
        try:
            futures = _submit(backend, prompt, params, body.n, None)
        except ValueError as error:
            raise _BadRequest(str(error), "prompt") from error
        results = [await asyncio.wrap_future(f) for f in futures]
        choices: list[dict[str, Any]] = []
        for index, result in enumerate(results):
            choice: dict[str, Any] = {
                "index": index,
                "text": backend.tokenizer.decode(result.token_ids),
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
            if body.logprobs is not None:
                tokens = [wire.token_text(t) for t in result.token_ids]
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": result.logprobs,
                    "top_logprobs": [{wire.token_text(t): v for t, v in top} for top in result.top_logprobs] or None,
                    "text_offset": [sum(len(x) for x in tokens[:i]) for i in range(len(tokens))],
                }
            if body.return_token_ids:
                choice["prompt_token_ids"] = prompt
                choice["token_ids"] = result.token_ids
            choices.append(choice)
        response = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model or backend.model_name,
            "choices": choices,
            "usage": wire.usage(prompt, results),
        }
        return _versioned(response, results)

    return app


def _versioned(response: dict[str, Any], results: list[GenerationResult]) -> JSONResponse:
    """The response with the version of the weights that generated it (the oldest, should choices differ)."""
    versions = [r.model_version for r in results if r.model_version is not None]
    if not versions:
        return JSONResponse(response)
    response["model_version"] = min(versions)
    return JSONResponse(response, headers={"x-agentlightning-model-version": str(min(versions))})


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _chat_stream(
    wire: _Wire,
    body: _ChatRequest,
    prompt: list[int],
    tools: list[dict[str, Any]] | None,
    futures: list[Future[GenerationResult]],
    events: asyncio.Queue[Any],
) -> AsyncIterator[str]:
    """SSE chunks: a role chunk per choice, one chunk per token, optional usage, then ``[DONE]``.

    When the calculator tool is declared, text that may still become ``CALC(...)`` is held back; it is sent as a
    ``tool_calls`` delta at the end if it is a call, or flushed as content as soon as it cannot be one.
    """
    backend = wire.backend
    template = backend.template
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time())}
    head["model"] = body.model or backend.model_name
    watch_calls = isinstance(template, CalcChatTemplate) and template.declares_tool(tools)
    for index in range(body.n):
        chunk: dict[str, Any] = {
            **head,
            "choices": [
                {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ],
        }
        if index == 0 and body.return_token_ids:
            chunk["prompt_token_ids"] = prompt
        yield _sse(chunk)
    generated: list[list[int]] = [[] for _ in range(body.n)]
    held: list[str] = ["" for _ in range(body.n)]
    flushed = [False] * body.n
    open_choices = body.n
    while open_choices:
        index, token, logprob, top, end, version = await events.get()
        generated[index].append(token)
        delta: dict[str, Any] = {}
        piece = wire.tokenizer.decode([token])
        if watch_calls and not flushed[index]:
            held[index] += piece
            text = held[index]
            if not ("CALC(".startswith(text) or text.startswith("CALC(")):
                delta["content"], flushed[index] = text, True
        elif piece:
            delta["content"] = piece
        finish = end
        if end is not None:
            open_choices -= 1
            parsed = template.parse_response(generated[index], tools=tools)
            if watch_calls and not flushed[index]:
                if parsed.tool_calls and end == "stop":
                    delta["tool_calls"] = [{"index": 0, **call} for call in parsed.tool_calls]
                    finish = "tool_calls"
                elif held[index]:
                    delta["content"] = held[index]
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        if body.logprobs:
            choice["logprobs"] = {"content": [wire.logprob_entry(token, logprob, top)]}
        if body.return_token_ids:
            choice["token_ids"] = [token]
        yield _sse({**head, "choices": [choice], "model_version": version})
    if body.stream_options and body.stream_options.get("include_usage"):
        results = [f.result() for f in futures]
        yield _sse({**head, "choices": [], "usage": wire.usage(prompt, results)})
    yield "data: [DONE]\n\n"


class BackendServer:
    """Runs the OpenAI-compatible app for a backend with uvicorn in a background thread on 127.0.0.1.

    Args:
        backend: The backend to serve (started by `start` if it is not running).
        host: Interface to bind.
        port: Port to bind; 0 picks a free one.
    """

    def __init__(self, backend: LocalBackend, host: str = "127.0.0.1", port: int = 0) -> None:
        self.backend = backend
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:PORT`` (the OpenAI base URL is `base_url`)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``{url}/v1``."""
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> BackendServer:
        """Start the backend worker and the HTTP server; returns when the server accepts connections.

        Raises:
            RuntimeError: If the server did not come up within ``timeout`` seconds.
        """
        if self._server is not None:
            return self
        self.backend.start()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(create_app(self.backend), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="agentlightning-backend-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the backend HTTP server did not start on {self.url}")
            time.sleep(0.01)
        logger.info("local backend serving %s at %s", self.backend.model_name, self.base_url)
        return self

    def stop(self) -> None:
        """Stop the HTTP server and the backend worker."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._server, self._thread = None, None
        self.backend.stop()

    def __enter__(self) -> BackendServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_backend(backend: LocalBackend, host: str = "127.0.0.1", port: int = 0) -> BackendServer:
    """Start serving ``backend`` over HTTP and return the running `BackendServer` (call ``.stop()`` when done)."""
    return BackendServer(backend, host, port).start()
