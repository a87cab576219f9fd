"""An OpenAI-compatible HTTP server over `LocalBackend`, speaking vLLM's wire format for token ids.

With ``return_token_ids: true`` a chat response carries top-level ``prompt_token_ids`` and per choice
``token_ids`` (streams: ``prompt_token_ids`` in the first chunk, ``token_ids`` deltas per chunk), exactly as
vLLM returns them, so the LLM proxy records the same fields from either backend.

Every answer also says which weights produced it: a top-level ``model_version`` in the response body and in every
stream chunk that carries tokens, and the ``x-agentlightning-model-version`` header on non-streamed answers. The
backend swaps weights only between sequences, so one version generated every token of a choice. The LLM proxy
records it on the `LLMCall`.
"""

from __future__ import annotations

import asyncio
import dataclasses
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

from agentlightning_torch._backend import LocalBackend
from agentlightning_torch._chat import TemplateError
from agentlightning_torch._generate import GenerationResult, SamplingParams, StepCallback
from agentlightning_torch._wire import (
    BadRequest,
    ChatRequest,
    ChoiceStream,
    CompletionRequest,
    chat_message,
    logprob_entry,
    parse_body,
    response_text,
    sampling_params,
    usage,
)

__all__ = ["BackendServer", "create_app", "serve_backend"]

logger = logging.getLogger(__name__)


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


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
    # Runs in the worker thread while the sequence is in flight; weights never change then, so this is its version.
    version = backend.model_version
    loop.call_soon_threadsafe(events.put_nowait, (index, token, logprob, top, end, version))


def _submit(
    backend: LocalBackend, prompt: list[int], params: SamplingParams, count: int, events: asyncio.Queue[Any] | None
) -> list[Future[GenerationResult]]:
    """Queue ``count`` choices; with ``events``, each token is pushed as ``(choice, token, logprob, top, end, v)``.

    Raises:
        BadRequest: If the backend refuses the prompt (vocabulary, context or KV-cache bound).
    """
    loop = asyncio.get_running_loop()
    futures: list[Future[GenerationResult]] = []
    for index in range(count):
        choice_params = params
        if params.seed is not None and index:
            choice_params = dataclasses.replace(params, seed=params.seed + index)
        callback: StepCallback | None = None
        if events is not None:
            callback = functools.partial(_relay, loop, events, index, backend)
        try:
            futures.append(backend.submit(prompt, choice_params, callback))
        except ValueError as error:
            for future in futures:
                future.cancel()
            raise BadRequest(str(error), "messages") from error
    return futures


def create_app(backend: LocalBackend) -> FastAPI:
    """The FastAPI app serving ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` for ``backend``."""
    app = FastAPI(title="agentlightning local backend")
    template = backend.template

    @app.exception_handler(BadRequest)
    async def _bad_request(_request: Request, error: BadRequest) -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
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
        body: ChatRequest = parse_body(ChatRequest, await request.body())
        tools = body.tools if body.tool_choice != "none" else None
        try:
            prompt = template.render(
                body.messages, tools=body.tools, add_generation_prompt=True, template_kwargs=body.chat_template_kwargs
            )
        except (TemplateError, ValueError) as error:
            raise BadRequest(str(error), "messages") from error
        params = sampling_params(
            body, len(prompt), backend.max_context, (body.top_logprobs or 0) if body.logprobs else 0
        )
        if body.stream:
            events: asyncio.Queue[Any] = asyncio.Queue()
            futures = _submit(backend, prompt, params, body.n, events)
            stream = _chat_stream(backend, body, prompt, tools, futures, events)
            return StreamingResponse(stream, media_type="text/event-stream")
        results = [await asyncio.wrap_future(f) for f in _submit(backend, prompt, params, body.n, None)]
        choices: list[dict[str, Any]] = []
        for index, result in enumerate(results):
            message, finish = chat_message(template, result, prompt, tools, body.include_reasoning)
            choice: dict[str, Any] = {"index": index, "message": message, "logprobs": None, "finish_reason": finish}
            if result.stop_reason is not None:
                choice["stop_reason"] = result.stop_reason
            if body.logprobs:
                content = [
                    logprob_entry(template, t, lp, result.top_logprobs[i] if result.top_logprobs else [])
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
            "usage": usage(prompt, results),
        }
        if body.return_token_ids:
            response["prompt_token_ids"] = prompt
        return _versioned(response, results)

    @app.post("/v1/completions")
    async def _complete(request: Request) -> Response:  # pyright: ignore[reportUnusedFunction]
        body: CompletionRequest = parse_body(CompletionRequest, await request.body())
        if body.echo:
            raise BadRequest("echo is not supported by the local backend", "echo")
        if body.stream:
            raise BadRequest("streaming is supported on /v1/chat/completions only", "stream")
        if isinstance(body.prompt, str):
            try:
                prompt = template.encode_text(body.prompt)
            except ValueError as error:
                raise BadRequest(str(error), "prompt") from error
        else:
            prompt = list(body.prompt)
        params = sampling_params(body, len(prompt), backend.max_context, body.logprobs or 0)
        results = [await asyncio.wrap_future(f) for f in _submit(backend, prompt, params, body.n, None)]
        choices: list[dict[str, Any]] = []
        for index, result in enumerate(results):
            choice: dict[str, Any] = {
                "index": index,
                "text": response_text(template, result),
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
            if result.stop_reason is not None:
                choice["stop_reason"] = result.stop_reason
            if body.logprobs is not None:
                tokens = template.token_texts(result.token_ids)
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": result.logprobs,
                    "top_logprobs": [
                        dict(zip(template.token_texts([t for t, _ in top]), (v for _, v in top), strict=True))
                        for top in result.top_logprobs
                    ]
                    or None,
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
            "usage": usage(prompt, results),
        }
        return _versioned(response, results)

    return app


def _versioned(response: dict[str, Any], results: list[GenerationResult]) -> JSONResponse:
    """The response with the version of the weights that generated it (the oldest, should choices differ)."""
    versions = [r.model_version for r in results if r.model_version is not None]
    if not versions:
        return JSONResponse(response)
    if len(set(versions)) > 1:  # choices of one request admitted on both sides of a swap
        logger.warning("the choices of one request were generated by model versions %s", sorted(set(versions)))
    response["model_version"] = min(versions)
    return JSONResponse(response, headers={"x-agentlightning-model-version": str(min(versions))})


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _chat_stream(
    backend: LocalBackend,
    body: ChatRequest,
    prompt: list[int],
    tools: list[dict[str, Any]] | None,
    futures: list[Future[GenerationResult]],
    events: asyncio.Queue[Any],
) -> AsyncIterator[str]:
    """SSE chunks: a role chunk per choice, one chunk per token, optional usage, then ``[DONE]``.

    Text that may still become a tool call (or a reasoning block, or a stop string) is held back and settled when
    the choice ends (see `ChoiceStream`); token ids and logprobs are sent with every token regardless.
    """
    template = backend.template
    head: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.model or backend.model_name,
    }
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
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    streams = [ChoiceStream(template, prompt, tools, stop, body.include_reasoning) for _ in range(body.n)]
    open_choices = body.n
    while open_choices:
        index, token, logprob, top, end, version = await events.get()
        finish: str | None = None
        if end is None:
            delta = streams[index].push(token)
        else:
            open_choices -= 1
            result = await asyncio.wrap_future(futures[index])
            delta, finish = streams[index].finish(result)
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        if body.logprobs:
            choice["logprobs"] = {"content": [logprob_entry(template, token, logprob, top)]}
        if body.return_token_ids:
            choice["token_ids"] = [token]
        yield _sse({**head, "choices": [choice], "model_version": version})
    if body.stream_options and body.stream_options.get("include_usage"):
        results = [await asyncio.wrap_future(f) for f in futures]
        yield _sse({**head, "choices": [], "usage": usage(prompt, results)})
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
