"""The OpenAI-compatible API of a `LocalBackend` as plain handlers: served over HTTP by ``_server.py``, or called
in-process by the LLM proxy of the same process (`OpenAIEndpoint.request`, an ``inproc://`` backend; see
`agentlightning.proxy.register_backend`), which answers byte for byte as the HTTP server does without its HTTP client,
server thread, event loop and web framework competing for the GIL with the decode thread.

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
import math
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from agentlightning.proxy import InProcessReply
from agentlightning_torch._backend import LocalBackend
from agentlightning_torch._chat import TemplateError
from agentlightning_torch._generate import GenerationResult, SamplingParams, StepCallback
from agentlightning_torch._wire import (
    BadRequest,
    ChatRequest,
    ChoiceStream,
    CompletionRequest,
    chat_message,
    keeps_special_tokens,
    logprob_content,
    logprob_entry,
    parse_body,
    response_text,
    sampling_params,
    usage,
)

__all__ = ["OpenAIEndpoint", "bad_request"]

_orjson_dumps: Callable[[Any], bytes] | None
try:  # the LLM proxy renders an in-process answer's body with its `dumps`, which is orjson's when installed
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - depends on the environment
    _orjson_dumps = None

logger = logging.getLogger(__name__)


def bad_request(status: int, message: str, param: str | None = None) -> JSONResponse:
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


async def _results(backend: LocalBackend, futures: list[Future[GenerationResult]]) -> list[GenerationResult]:
    """The choices' results; if the caller is cancelled (its client left), the backend stops generating them."""
    try:
        return [await asyncio.wrap_future(f) for f in futures]
    except asyncio.CancelledError:
        backend.cancel(futures)
        raise


class OpenAIEndpoint:
    """``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` and ``/health`` of ``backend``.

    Each handler returns the Starlette response the HTTP server sends; a `BadRequest` it raises is answered 400
    (`bad_request`). `request` answers the in-process proxy: a completion's JSON is handed over as its value, and
    rendered (to the HTTP server's bytes) only if the proxy reads the body.
    """

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.template = backend.template

    def models(self) -> JSONResponse:
        """The served model, with its context length."""
        backend = self.backend
        entry = {"id": backend.model_name, "object": "model", "created": 0, "owned_by": "agentlightning"}
        return JSONResponse({"object": "list", "data": [{**entry, "max_model_len": backend.max_context}]})

    def health(self) -> JSONResponse:
        """Liveness and the version being served."""
        return JSONResponse({"status": "ok", "model_version": self.backend.model_version})

    async def chat(self, raw: bytes) -> Response:
        """A chat completion (streamed as SSE with ``stream: true``)."""
        return _sent(await self._chat(raw))

    async def complete(self, raw: bytes) -> Response:
        """A text completion (not streamed)."""
        return _sent(await self._complete(raw))

    async def _chat(self, raw: bytes) -> Response | _Answer:
        backend, template = self.backend, self.template
        body: ChatRequest = parse_body(ChatRequest, raw)
        tools = body.tools if body.tool_choice != "none" else None
        keep_special = keeps_special_tokens(body.skip_special_tokens, tools)
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
        results = await _results(backend, _submit(backend, prompt, params, body.n, None))
        choices: list[dict[str, Any]] = []
        for index, result in enumerate(results):
            message, finish = chat_message(
                template, result, prompt, tools, body.include_reasoning, keep_special=keep_special
            )
            choice: dict[str, Any] = {"index": index, "message": message, "logprobs": None, "finish_reason": finish}
            if result.stop_reason is not None:
                choice["stop_reason"] = result.stop_reason
            if body.logprobs:
                choice["logprobs"] = {"content": logprob_content(template, result)}
            if body.return_token_ids:
                choice["token_ids"] = result.token_ids
            choices.append(choice)
        response = _envelope("chatcmpl", "chat.completion", body.model or backend.model_name, choices)
        response["usage"] = usage(prompt, results)
        if body.return_token_ids:
            response["prompt_token_ids"] = prompt
        return _versioned(response, results, body.logprobs)

    async def _complete(self, raw: bytes) -> _Answer:
        backend, template = self.backend, self.template
        body: CompletionRequest = parse_body(CompletionRequest, raw)
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
        results = await _results(backend, _submit(backend, prompt, params, body.n, None))
        choices: list[dict[str, Any]] = []
        for index, result in enumerate(results):
            choice: dict[str, Any] = {
                "index": index,
                "text": response_text(template, result, keep_special=not body.skip_special_tokens),
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
        response = _envelope("cmpl", "text_completion", body.model or backend.model_name, choices)
        response["usage"] = usage(prompt, results)
        return _versioned(response, results, body.logprobs is not None)

    async def request(self, method: str, path: str, body: bytes) -> InProcessReply:
        """Answer one request in-process exactly as the HTTP server would (the `InProcessBackend` protocol)."""
        try:
            response = await self._route(method, path, body)
        except BadRequest as error:
            response = bad_request(400, str(error), error.param)
        except Exception:  # what the HTTP server answers for a handler that raised
            logger.exception("the local backend failed on %s %s", method, path)
            response = PlainTextResponse("Internal Server Error", 500)
        if isinstance(response, _Answer):
            if _orjson_dumps is not None:  # the proxy renders it (as `_JSON` does) only if it reads the body
                headers = {"content-type": "application/json", **response.headers}
                return InProcessReply(200, headers, None, response.content)
            response = _sent(response)  # pragma: no cover - the proxy's stdlib `dumps` would escape non-ASCII
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in response.raw_headers}
        if isinstance(response, StreamingResponse):
            return InProcessReply(response.status_code, headers, _encoded(response.body_iterator))
        return InProcessReply(response.status_code, headers, bytes(response.body))

    async def _route(self, method: str, path: str, body: bytes) -> Response | _Answer:
        routes = _ROUTES.get(path)
        if routes is None:
            return JSONResponse({"detail": "Not Found"}, 404)
        name = routes.get("GET" if method == "HEAD" else method)
        if name is None:
            return JSONResponse({"detail": "Method Not Allowed"}, 405, headers={"allow": ", ".join(routes)})
        if name == "chat":
            return await self._chat(body)
        if name == "complete":
            return await self._complete(body)
        return self.models() if name == "models" else self.health()


_ROUTES: dict[str, dict[str, str]] = {
    "/v1/chat/completions": {"POST": "chat"},
    "/v1/completions": {"POST": "complete"},
    "/v1/models": {"GET": "models"},
    "/health": {"GET": "health"},
}


async def _encoded(chunks: AsyncIterable[Any]) -> AsyncIterator[bytes]:
    """A streaming response's chunks as the HTTP server sends them (text encoded as UTF-8)."""
    try:
        async for chunk in chunks:
            yield chunk if isinstance(chunk, bytes) else str(chunk).encode("utf-8")
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def _envelope(prefix: str, kind: str, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """A response's fields around its choices (``usage`` follows them)."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }


class _JSON(JSONResponse):
    """Starlette's `JSONResponse` rendered with orjson when it is installed: the same JSON (UTF-8, compact; floats
    may be spelt differently, ``1e-05`` as ``0.00001``, with the same value), several times faster. orjson would
    write NaN and infinities as ``null`` where Starlette refuses them, so the content must hold finite floats only
    (`_versioned` checks the logprobs, the only floats an answer carries)."""

    def render(self, content: Any) -> bytes:
        if _orjson_dumps is None:  # pragma: no cover - depends on the environment
            return super().render(content)
        return _orjson_dumps(content)


@dataclasses.dataclass
class _Answer:
    """A completion's JSON answer (status 200) before it is rendered: the HTTP server sends it as a `_JSON`
    response (`_sent`); the in-process proxy takes ``content`` itself, and renders it only if it reads the body."""

    content: dict[str, Any]
    headers: dict[str, str]
    """Headers besides the content type, names in lower case."""


def _sent(answer: Response | _Answer) -> Response:
    """The response the HTTP server sends for a handler's answer."""
    if isinstance(answer, _Answer):
        return _JSON(answer.content, headers=answer.headers)
    return answer


def _finite(results: list[GenerationResult]) -> bool:
    """Whether every logprob (top logprobs included) is finite: a sum is finite only if all its terms are."""
    for result in results:
        if not math.isfinite(sum(result.logprobs)):
            return False
        if result.top_logprobs and not math.isfinite(sum(v for top in result.top_logprobs for _, v in top)):
            return False
    return True


def _versioned(response: dict[str, Any], results: list[GenerationResult], logprobs: bool) -> _Answer:
    """The response with the version of the weights that generated it (the oldest, should choices differ).

    Raises:
        ValueError: If ``logprobs`` (the response carries them) and one is NaN or infinite, which JSON cannot
            represent (answered 500, as Starlette's `JSONResponse` refuses such content).
    """
    if logprobs and not _finite(results):
        try:  # Starlette's own check (a sum of huge finite logprobs may overflow: that passes here)
            JSONResponse(response)
        except ValueError as error:
            raise ValueError(
                f"the model produced a NaN or infinite logprob, which JSON cannot carry: {error}"
            ) from error
    versions = [r.model_version for r in results if r.model_version is not None]
    if not versions:
        return _Answer(response, {})
    if len(set(versions)) > 1:  # choices of one request admitted on both sides of a swap
        logger.warning("the choices of one request were generated by model versions %s", sorted(set(versions)))
    response["model_version"] = min(versions)
    return _Answer(response, {"x-agentlightning-model-version": str(min(versions))})


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
    try:
        for index in range(body.n):
            chunk: dict[str, Any] = {
                **head,
                "choices": [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if index == 0 and body.return_token_ids:
                chunk["prompt_token_ids"] = prompt
            yield _sse(chunk)
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        keep_special = keeps_special_tokens(body.skip_special_tokens, tools)
        streams = [
            ChoiceStream(template, prompt, tools, stop, body.include_reasoning, keep_special=keep_special)
            for _ in range(body.n)
        ]
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
    finally:  # also when the stream is closed early (the client left, the call was aborted): stop generating it
        backend.cancel(futures)
