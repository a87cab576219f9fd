"""What the HTTP clients of the core (the LLM proxy's backend calls, the store client) share about connections."""

from __future__ import annotations

import errno

__all__ = ["connection_went_stale"]


def connection_went_stale(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection was closed by the server before any byte of the answer arrived.

    A kept-alive connection that the server closed (after an error answer, or at its idle timeout) can be handed out
    by the client's pool before the close is seen; the request sent on it fails this way without the server having
    answered it, so sending it once more on a fresh connection is safe.
    """
    import aiohttp  # the store client imports aiohttp on first use; so does this

    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError)):
        return True  # the second: the request could not be written, the connection was already lost
    return isinstance(exc, aiohttp.ClientOSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE)
