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
from typing import Any

from aiohttp import web

from agentlightning.testing._model_answers import (
    Script,
    ScriptedAnswers,
    ScriptedReply,
    ScriptExhausted,
    ServedCall,
    error_answer,
)
from agentlightning.testing._toy_tokenizer import ToyTokenizer, content_text

__all__ = ["Script", "ScriptedModelServer", "ScriptedReply", "ServedCall", "ToyTokenizer"]

logger = logging.getLogger(__name__)


class ScriptedModelServer(ScriptedAnswers):
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
                    raise ScriptExhausted(f"script exhausted: all {len(script)} scripted replies were used")
                reply = script[self._script_index]
                self._script_index += 1
        return ScriptedReply(content=reply) if isinstance(reply, str) else reply

    # ------------------------------------------------------------------ admission
    async def _pre(self, request: web.Request) -> tuple[dict[str, Any] | None, web.Response | None, int | None]:
        """The request body (or the error to answer) and the model version when it arrived."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None, error_answer(400, "request body is not valid JSON"), None
        if not isinstance(body, dict):
            return None, error_answer(400, "request body must be a JSON object"), None
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
                error_answer(status, message or f"injected failure (HTTP {status})", headers={"Retry-After": "0"}),
                None,
            )
        n = body.get("n", 1)
        if n != 1:
            return None, error_answer(400, f"ScriptedModelServer supports only n=1, got n={n!r}"), None
        return body, None, version
