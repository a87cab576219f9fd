"""A raw HTTP/1.1 server on loopback for tests that need a misbehaving peer (a close before the answer, an answer
that breaks off, a server that never answers): what a real server does only by chance, done every time."""

from __future__ import annotations

import asyncio
from typing import Self

__all__ = ["RawHttpServer", "read_request"]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """Read one request (head and ``content-length`` body) off ``reader``; returns its head.

    Raises:
        asyncio.IncompleteReadError: If the peer closed the connection first.
    """
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length")), 0)
    await reader.readexactly(length)
    return head


class RawHttpServer:
    """Serves connections on 127.0.0.1 with `handle`, which a test's subclass writes byte by byte.

    Use as ``async with Subclass(...) as server:``; ``server.url`` is ``http://127.0.0.1:PORT``.
    """

    url: str = ""
    _server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection; the subclass answers (or does not). The default closes it unanswered."""
        writer.close()
