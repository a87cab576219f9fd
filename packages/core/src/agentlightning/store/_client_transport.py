"""The HTTP side of `StoreClient`: one aiohttp session per event loop, retries with backoff, error mapping."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar, overload

from pydantic import BaseModel

from agentlightning._connections import connection_went_stale
from agentlightning.store._base import (
    AttemptEndedError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RetryPolicy,
    StorageError,
    StoreError,
)
from agentlightning.store._boundary import StoreBoundary
from agentlightning.store._wire import API_PREFIX, ATTEMPT_ENDED

if TYPE_CHECKING:
    import aiohttp
    import yarl

__all__ = [
    "InvalidRequestError",
    "RetriedConflict",
    "StoreTransport",
    "StoreUnavailableError",
    "UnauthorizedError",
    "raise_for",
]

logger = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)
_T = TypeVar("_T")
_JSON_HEADERS = {"Content-Type": "application/json"}


class StoreUnavailableError(StoreError):
    """The server could not be reached (or kept answering 5xx) after every retry."""


class UnauthorizedError(StoreError):
    """The server refused the bearer token (HTTP 401)."""


def split_urls(url: str | Sequence[str]) -> tuple[str, ...]:
    """The store URLs of ``url``: one, several separated by commas, or a sequence of them (trailing ``/`` dropped).

    Raises:
        ValueError: None given, or one that is not ``http(s)://host[:port]``.
    """
    parts = url.split(",") if isinstance(url, str) else list(url)
    urls = tuple(part.strip().rstrip("/") for part in parts if part.strip())
    for one in urls:
        parsed = urllib.parse.urlsplit(one)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"store url must look like http://host:port, got {one!r}")
    if not urls:
        raise ValueError(f"store url must look like http://host:port, got {url!r}")
    return urls


class StoreTransport(StoreBoundary):
    """Connection pools, retries, failover between servers and error mapping of a `StoreClient` (its base class;
    use `StoreClient`).

    Args: as `StoreClient`.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None = None,
        timeout: float = 30.0,
        retries: int | None = None,
        backoff: float = 0.1,
        backoff_max: float = 3.0,
        retry_for: float = 60.0,
    ) -> None:
        self.urls = split_urls(url)
        """Every server of the store, the preferred one first (several: stateless servers over one database)."""
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if retries is not None and retries < 0:
            raise ValueError(f"retries must be >= 0 or None, got {retries}")
        if not retry_for >= 0:
            raise ValueError(f"retry_for must be >= 0 seconds, got {retry_for}")
        self._current = 0  # index in `urls` of the server requests go to (moves on when it fails)
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.retry_for = retry_for
        self._headers = dict(_JSON_HEADERS)
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._lock = threading.Lock()
        self._retry_policy: RetryPolicy | None = None
        # Parsed once and reused: aiohttp would otherwise parse the URL string and build a timeout per request.
        self._urls: dict[tuple[int, str], yarl.URL] = {}
        self._timeout: aiohttp.ClientTimeout | None = None
        self.resent = 0
        """Requests sent again at once because their kept-alive connection had been closed unanswered."""

    @property
    def url(self) -> str:
        """The server requests go to now (the first of `urls` until it fails)."""
        return self.urls[self._current]

    @property
    def _api(self) -> str:
        return self.url + API_PREFIX

    def _fail_over(self, failed: int) -> None:
        """Send the next requests to the server after ``failed`` in `urls` (when another request has not already).

        Every server of one store serves the same database and keeps nothing of its own, and every write carries an
        id the database remembers: a request retried on another server gets the answer the failed one would have
        given.
        """
        if len(self.urls) < 2:
            return
        with self._lock:
            if self._current != failed:
                return
            self._current = (failed + 1) % len(self.urls)
        logger.warning("store at %s failed: switching to %s", self.urls[failed], self.url)

    async def close(self) -> None:
        """Close the running loop's connection pool (and forget pools of loops that have ended).

        Pools of other loops that are still running are left alone (they may be mid-request); each loop that
        used the client closes its own. The client stays usable: a later call opens a new pool.
        """
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        with self._lock:
            mine = self._sessions.pop(current, None) if current is not None else None
            for stale in [lp for lp in self._sessions if lp.is_closed()]:
                self._sessions.pop(stale).detach()  # its loop is gone: nothing left to await on
        if mine is not None:
            await mine.close()

    # --- transport ----------------------------------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        import aiohttp  # imported on first use: the server side and most importers never need it

        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is not None and not session.closed:
            return session
        with self._lock:
            for stale in [lp for lp in self._sessions if lp.is_closed()]:
                self._sessions.pop(stale).detach()
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=30.0),
                headers=self._headers,
                skip_auto_headers=("User-Agent",),
            )
            self._sessions[loop] = session
        return session

    @overload
    async def _call(
        self, method: str, path: str, body: BaseModel | bytes | None, model: type[_M], extra_timeout: float = 0.0
    ) -> _M: ...

    @overload
    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | bytes | None,
        model: Callable[[bytes], _T],
        extra_timeout: float = 0.0,
    ) -> _T: ...

    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | bytes | None,
        model: type[_M] | Callable[[bytes], _T],
        extra_timeout: float = 0.0,
    ) -> _M | _T:
        """Send ``body`` (a model, or its JSON already made), retrying as configured; the answer is validated as
        ``model`` or read by it (a function).

        A function is for answers made of stored records, which the server's store validated when they entered
        it: they are read with `agentlightning._fast` (trusted construction) instead of validated again.
        """
        import aiohttp

        data = body if body is None or isinstance(body, bytes) else body.__pydantic_serializer__.to_json(body)
        timeout = self._timeout
        if extra_timeout or timeout is None or timeout.total != self.timeout:
            timeout = aiohttp.ClientTimeout(total=self.timeout + extra_timeout)
            if not extra_timeout:
                self._timeout = timeout
        delay = self.backoff
        last: str = ""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.retry_for
        max_tries = None if self.retries is None else self.retries + 1
        attempt = 0
        while True:
            if attempt:
                if (max_tries is not None and attempt >= max_tries) or loop.time() >= give_up:
                    break
                if attempt == 1:
                    logger.warning(
                        "store at %s: %s %s failed (%s); retrying for up to %.0f s",
                        self.url,
                        method,
                        path,
                        last,
                        self.retry_for,
                    )
                await asyncio.sleep(min(delay * (0.5 + random.random()), max(0.0, give_up - loop.time())))
                delay = min(delay * 2, self.backoff_max)
            attempt += 1
            server = self._current
            try:
                payload, status = await self._send(method, self._request_url(server, method, path), data, timeout)
            except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                # the third: the answer broke off (a server killed mid-answer); whether the request took effect is
                # unknown, as after a lost connection, and the store's request ids make the retry safe
                last = f"{type(exc).__name__}: {exc}"
                logger.debug("store %s %s failed (%s); try %d", method, path, last, attempt)
                self._fail_over(server)
                continue
            if status < 300:
                if attempt > 1:
                    logger.warning("store at %s answered %s %s again after %d tries", self.url, method, path, attempt)
                return model.model_validate_json(payload) if isinstance(model, type) else model(payload)
            if status >= 500 and status != 507:
                last = f"HTTP {status}: {_message(payload)}"
                logger.debug("store %s %s answered %s; try %d", method, path, last, attempt)
                self._fail_over(server)
                continue
            if status == 409 and attempt > 1 and _kind(payload) != ATTEMPT_ENDED:
                raise RetriedConflict(_message(payload))
            raise_for(status, payload)
        raise StoreUnavailableError(
            f"store at {', '.join(self.urls)} did not answer {method} {path} after {attempt} tries in "
            f"{self.retry_for:.0f} s: {last}"
        )

    def _request_url(self, server: int, method: str, path: str) -> yarl.URL:
        """``path`` of the API of ``urls[server]`` (POST paths are parsed once and kept; GET paths may carry an id)."""
        key = (server, path)
        url = self._urls.get(key)
        if url is None:
            url = _url(self.urls[server] + API_PREFIX + path)
            if method == "POST":
                self._urls[key] = url
        return url

    async def _send(
        self, method: str, url: yarl.URL, data: bytes | None, timeout: aiohttp.ClientTimeout
    ) -> tuple[bytes, int]:
        """One try: the answer's body and status. A request that met a kept-alive connection the server had closed
        is sent again at once on a fresh one (no answer was given; counted in ``resent``), not left to the retry
        policy's back-off and warning."""
        import aiohttp

        try:
            async with self._session().request(method, url, data=data, timeout=timeout) as resp:
                return await resp.read(), resp.status
        except aiohttp.ClientConnectionError as exc:
            if not connection_went_stale(exc):
                raise
        self.resent += 1
        async with self._session().request(method, url, data=data, timeout=timeout) as resp:
            return await resp.read(), resp.status


class RetriedConflict(ConflictError):
    """A conflict seen on a retry: an earlier try may have succeeded before its answer was lost."""


def _url(text: str) -> yarl.URL:
    import yarl  # comes with aiohttp, imported with it on first use

    return yarl.URL(text)


def _message(payload: bytes) -> str:
    try:
        data = json.loads(payload)
    except ValueError:
        return payload[:500].decode(errors="replace")
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])  # pyright: ignore[reportUnknownArgumentType]
    return str(data)[:500]


def _kind(payload: bytes) -> str | None:
    """The ``error`` kind of an `ErrorResponse` body (``None``: not one)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    kind = data.get("error") if isinstance(data, dict) else None  # pyright: ignore[reportUnknownMemberType]
    return kind if isinstance(kind, str) else None


def raise_for(status: int, payload: bytes) -> None:
    message = _message(payload)
    if status == 404:
        raise NotFoundError(message)
    if status == 409 and _kind(payload) == ATTEMPT_ENDED:
        raise AttemptEndedError(message)
    if status == 409:
        raise ConflictError(message)
    if status == 401:
        raise UnauthorizedError(message)
    if status in (400, 413, 422):
        raise InvalidRequestError(message)
    if status == 507:
        raise StorageError(message)
    raise StoreError(f"store rejected the request (HTTP {status}): {message}")
