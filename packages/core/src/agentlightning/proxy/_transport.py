"""How the LLM proxy reaches a backend: over HTTP (aiohttp), or in the same process without any HTTP at all.

A backend is named by a URL. ``http(s)://...`` backends are called with aiohttp. ``inproc://<name>`` backends are
`InProcessBackend` objects registered in this process with `register_backend`: an engine that serves its model in
the trainer's own process (the torch trainer's `LocalBackend`) hands the proxy such a URL, and each call is then a
function call on the proxy's event loop instead of a JSON-over-HTTP round trip through a second server in the same
process (client, server, its own event loop thread, and a web framework, all competing for the GIL with the decode
thread). Both answer through `BackendReply`, so forwarding, streaming, error mapping and recording are one code.

An in-process backend must answer exactly as its HTTP server does (status, body bytes, the headers the proxy reads:
``content-type``, ``retry-after``, the model-version header; streamed bodies in the same chunks). A JSON answer may be
handed over as its parsed value alone (`InProcessReply` with ``body=None``): its bytes are then rendered with the
proxy's `dumps` only if the proxy reads them, so an answer the proxy re-encodes or only records costs no encoding.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import aiohttp

from agentlightning._connections import connection_went_stale
from agentlightning.proxy._assemble import dumps

__all__ = [
    "IN_PROCESS_SCHEME",
    "BackendLost",
    "BackendReply",
    "InProcessBackend",
    "InProcessReply",
    "register_backend",
    "registered_backend",
    "unregister_backend",
]

IN_PROCESS_SCHEME = "inproc://"
"""URL scheme of the backends registered in this process with `register_backend`."""


class BackendLost(Exception):
    """An in-process backend could not be reached, or its streamed answer broke off (what a closed connection is
    over HTTP)."""


class BackendReply(Protocol):
    """A backend's answer as the proxy reads it, whichever way it came."""

    @property
    def status(self) -> int:
        """The HTTP status."""
        ...

    @property
    def content_type(self) -> str:
        """The media type without parameters (``application/json``)."""
        ...

    @property
    def parsed(self) -> Any:
        """The JSON value of the whole body when the backend handed it over (with the bytes, or instead of them),
        else ``None`` (parse `read`'s bytes then)."""
        ...

    def header(self, name: str) -> str | None:
        """A response header by its lower-case name."""
        ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (a stream)."""
        ...

    def release(self) -> None:
        """Give back what the answer holds (the connection, the backend's generator); safe to call twice."""
        ...

    def abort(self) -> None:
        """Stop a streamed answer from another task: the backend stops generating, `chunks` ends (the proxy aborts
        the calls of a cancelled rollout this way)."""
        ...


class InProcessBackend(Protocol):
    """A backend served in this process; see the module docs."""

    async def request(self, method: str, path: str, body: bytes) -> BackendReply:
        """Answer one request (``path`` such as ``/v1/chat/completions``) as the backend's HTTP server would.

        Raises:
            BackendLost: If the backend is gone (the proxy answers 502, as for a refused connection).
        """
        ...


class InProcessReply:
    """A `BackendReply` built in-process: a status, lower-case headers, and a body, an async iterator of chunks, or
    only the body's parsed JSON value.

    Args:
        status: The HTTP status.
        headers: Response headers, names in lower case (``content-length`` may be left out).
        body: The whole body, the stream of its chunks, or ``None`` when ``parsed`` stands for it: the body is then
            ``dumps(parsed)`` (UTF-8 JSON, compact), rendered once, on the first `read` or `chunks` (so ``parsed`` must
            not be changed before).
        parsed: The JSON value ``body`` is the encoding of, if the backend has it at hand (the proxy records it
            instead of parsing the bytes back); it must equal what parsing ``body`` gives.

    Raises:
        ValueError: If neither ``body`` nor ``parsed`` is given.
    """

    def __init__(
        self,
        status: int,
        headers: Mapping[str, str],
        body: bytes | AsyncIterator[bytes] | None,
        parsed: Any = None,
    ) -> None:
        if body is None and parsed is None:
            raise ValueError("an in-process reply needs its body, or the parsed JSON value that stands for it")
        self.status = status
        self.parsed = parsed
        self._headers = headers
        self._body = body
        self._aborted = False
        media = headers.get("content-type", "application/octet-stream")
        self.content_type = media.split(";", 1)[0].strip().lower()

    def header(self, name: str) -> str | None:
        """A response header by its lower-case name."""
        return self._headers.get(name)

    async def read(self) -> bytes:
        """The whole body (a stream is read to its end; a body given as ``parsed`` is rendered once).

        Raises:
            BackendLost: If the backend's stream broke off, or its ``parsed`` value is not JSON-serialisable.
        """
        body = self._body
        if body is None:
            try:
                body = self._body = dumps(self.parsed)
            except (TypeError, ValueError) as exc:  # orjson's JSONEncodeError is a TypeError
                raise BackendLost(f"the in-process backend answered a value that is not JSON: {exc!r}") from exc
        if isinstance(body, bytes):
            return body
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks; an exception from the backend becomes `BackendLost` (a broken connection over HTTP)."""
        body = self._body
        if body is None or isinstance(body, bytes):
            yield await self.read()
            return
        try:
            async for chunk in body:
                if self._aborted:  # `abort` cannot close the generator while this loop awaits it; stop here
                    raise BackendLost("the call was aborted (its rollout was cancelled)")
                yield chunk
        except (asyncio.CancelledError, GeneratorExit, BackendLost):
            raise
        except Exception as exc:
            raise BackendLost(f"the in-process backend failed while streaming: {exc!r}") from exc

    def release(self) -> None:
        """Close the backend's stream generator if it is still open (the agent left, or the stream broke)."""
        body = self._body
        if body is None or isinstance(body, bytes):
            return
        self._body = b""
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            task = asyncio.ensure_future(aclose())
            _closing.add(task)
            task.add_done_callback(_closing.discard)

    def abort(self) -> None:
        """End the stream at the backend's next chunk (then `release` closes its generator, which frees it)."""
        self._aborted = True


_closing: set[asyncio.Future[object]] = set()


class HttpReply:
    """A `BackendReply` over an aiohttp response."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.content_type = response.content_type
        self.parsed = None

    def header(self, name: str) -> str | None:
        """A response header (case-insensitive)."""
        return self._response.headers.get(name)

    async def read(self) -> bytes:
        """The whole body."""
        return await self._response.read()

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        return self._response.content.iter_any()

    def release(self) -> None:
        """Give the connection back."""
        self._response.release()

    def abort(self) -> None:
        """Close the connection: vLLM (any HTTP backend) aborts a request whose client hung up; `chunks` raises."""
        self._response.close()


# ---------------------------------------------------------------------------------------------- the registry

_registry: dict[str, InProcessBackend] = {}
_registry_lock = threading.Lock()
_names = itertools.count(1)


def register_backend(backend: InProcessBackend, name: str | None = None) -> str:
    """Make ``backend`` reachable by the LLM proxies of this process; returns its URL (``inproc://<name>``).

    Pass the URL to `LLMProxy` (or return it from `Engine.start_servers`) like any backend URL; call
    `unregister_backend` when the backend stops.

    Raises:
        ValueError: If ``name`` is already registered.
    """
    with _registry_lock:
        if name is None:
            name = f"backend-{next(_names)}"
        if name in _registry:
            raise ValueError(f"an in-process backend named {name!r} is already registered")
        _registry[name] = backend
    return IN_PROCESS_SCHEME + name


def unregister_backend(url: str) -> None:
    """Forget the in-process backend at ``url``; proxies then answer its calls 502 (unreachable). Idempotent."""
    with _registry_lock:
        _registry.pop(url.removeprefix(IN_PROCESS_SCHEME), None)


def registered_backend(url: str) -> InProcessBackend:
    """The in-process backend at ``url``.

    Raises:
        BackendLost: If none is registered under it (never was, or unregistered since).
    """
    backend = _registry.get(url.removeprefix(IN_PROCESS_SCHEME))
    if backend is None:
        raise BackendLost(f"no in-process backend is registered as {url} (it stopped, or runs in another process)")
    return backend


async def send(
    session: aiohttp.ClientSession | None,
    backend: str,
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float,
    on_resend: Callable[[], None] | None = None,
) -> BackendReply:
    """Send one request to ``backend`` (``path`` such as ``/v1/models``).

    A request whose connection turns out to have been closed before any answer (`connection_went_stale`) is sent
    once more; ``on_resend`` is called when that happens (the proxy counts it).

    Raises:
        aiohttp.ClientError, TimeoutError, BackendLost: The backend could not be reached or did not answer in time.
    """
    if backend.startswith(IN_PROCESS_SCHEME):
        async with asyncio.timeout(timeout):
            return await registered_backend(backend).request(method, path, body)
    assert session is not None, "LLM proxy app used without its lifespan (serve it with uvicorn or start())"
    try:
        return await _send_http(session, backend + path, method, body, headers)
    except aiohttp.ClientError as exc:
        if not connection_went_stale(exc):
            raise
    if on_resend is not None:
        on_resend()
    return await _send_http(session, backend + path, method, body, headers)


async def _send_http(
    session: aiohttp.ClientSession, url: str, method: str, body: bytes, headers: Mapping[str, str]
) -> BackendReply:
    if method == "GET":
        return HttpReply(await session.get(url, headers=headers))
    return HttpReply(await session.post(url, data=body, headers=headers))


UNREACHABLE = (aiohttp.ClientError, TimeoutError, BackendLost)
"""What `send` and reading a reply raise when the backend is unreachable or broke off."""
