"""Who may reach a served endpoint: the token rules and the browser rules shared by the store and the proxy.

Off loopback a server must have a bearer token of at least `MIN_TOKEN_LENGTH` characters. A web page in the
user's browser can reach a server on this machine too: `cross_site_refusal` turns away what only such a page sends
(a foreign ``Origin``, a foreign ``Host`` on loopback: DNS rebinding, a non-JSON write: a form post or a
``no-cors`` fetch). `bearer_matches` is the one bearer rule of both servers.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Sequence

__all__ = [
    "MIN_TOKEN_LENGTH",
    "TOKEN_HINT",
    "bearer_matches",
    "check_bind_token",
    "cross_site_refusal",
    "is_loopback",
    "is_wildcard",
    "new_token",
]

MIN_TOKEN_LENGTH = 16
"""Shortest token accepted for a server bound off loopback."""

TOKEN_HINT = 'make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
"""How to make a good token (appended to every refusal)."""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (``0.0.0.0``, ``::``): not an address anyone can connect to."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return host == ""


def check_bind_token(host: str, token: str | None, what: str, how: str) -> None:
    """Refuse to serve ``what`` on ``host`` with a missing or short token.

    Args:
        host: The address to bind.
        token: The bearer token clients must send (``None``: none).
        what: What is served, for the message (``"the store"``).
        how: How the user passes a token, for the message (``"--token or $AGL_STORE_TOKEN"``).

    Raises:
        ValueError: Off loopback without a token, or with one shorter than `MIN_TOKEN_LENGTH`.
    """
    if token is not None and len(token) < MIN_TOKEN_LENGTH and not is_loopback(host):
        raise ValueError(
            f"refusing to serve {what} on {host} with a {len(token)}-character token: use at least "
            f"{MIN_TOKEN_LENGTH} characters ({TOKEN_HINT})"
        )
    if not token and not is_loopback(host):
        raise ValueError(
            f"refusing to serve {what} on {host} without a token: anyone who can reach it could use it. "
            f"Pass {how}, or bind 127.0.0.1 ({TOKEN_HINT})"
        )


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe: it can travel in a dashboard URL's fragment).

    Never one that starts with ``-``: pasted after an option (``--store-token -x...``), argparse would take it for
    an option of its own ("expected one argument"); a URL-safe token starts so once in 64.
    """
    token = secrets.token_urlsafe(32)
    while token.startswith("-"):
        token = secrets.token_urlsafe(32)
    return token


def bearer_matches(authorization: str | bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>``.

    The scheme is matched in any case (RFC 7235: ``bearer`` and ``BEARER`` are ``Bearer``); the token exactly, in
    constant time.
    """
    if not authorization:
        return False
    raw = authorization if isinstance(authorization, bytes) else authorization.encode("latin-1", "replace")
    scheme, _, given = raw.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given, token.encode())


_WRITES = frozenset(("POST", "PUT", "PATCH", "DELETE"))
# JSON, and OTLP's protobuf (the store's /v1/traces): neither is a type a form post or a no-cors fetch can send.
_BODY_TYPES = frozenset((b"application/json", b"application/x-protobuf"))


def _host_name(host: bytes) -> str:
    """The name of a ``Host`` header (``[::1]:4747`` -> ``::1``, ``Localhost:1`` -> ``localhost``)."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


@functools.lru_cache(maxsize=256)  # parsing an address costs microseconds: once per name, not per request
def _local_name(name: str) -> bool:
    """Whether a ``Host`` name means this machine: ``localhost``, a loopback address or this machine's own name.

    A DNS-rebinding page can only name its own domain, so this machine's hostname (Debian maps it to 127.0.1.1)
    and ``0.0.0.0`` (what a server bound to every interface prints) are safe to accept.
    """
    return name in ("localhost", _HOSTNAME) or is_loopback(name) or (bool(name) and is_wildcard(name))


_HOSTNAME = socket.gethostname().lower()


@functools.lru_cache(maxsize=256)
def _loopback_address(address: str) -> bool:
    return is_loopback(address)


def cross_site_refusal(
    method: str,
    host: bytes,
    origin: bytes,
    content_type: bytes,
    has_body: bool,
    local: Sequence[object] | None,
) -> tuple[int, str] | None:
    """Why a request that a foreign web page could have sent is refused, as ``(status, one-line message)``.

    * A request that came in over loopback must name this machine in its ``Host`` (403): a page that rebinds its
      own domain to 127.0.0.1 still sends its domain. The port is not compared: the browser only reaches this port
      under a name with this port, and an SSH tunnel may forward another local port here.
    * An ``Origin`` (browsers send it on cross-origin requests and same-origin writes) must be this server's own,
      ``http(s)://<Host>`` (403); requests without one (every non-browser client) pass.
    * A write with a body must be ``Content-Type: application/json`` (or OTLP's ``application/x-protobuf``) (415): a
      form post or a ``no-cors`` fetch can only send ``text/plain``, form or multipart bodies.

    Args:
        method: The request method.
        host: The ``Host`` header (empty when absent).
        origin: The ``Origin`` header (empty when absent).
        content_type: The ``Content-Type`` header (empty when absent).
        has_body: Whether the request has a body (a non-zero ``Content-Length`` or a ``Transfer-Encoding``).
        local: The server's end of the connection (ASGI ``scope["server"]``), or ``None`` when unknown.

    Returns:
        ``None`` to let the request through.
    """
    if host and local and _loopback_address(str(local[0])):
        name = _host_name(host)
        if not _local_name(name):
            return 403, (
                f"refused: Host {host.decode('latin-1')!r} does not name this machine (a DNS-rebinding page?); "
                "use http://127.0.0.1:<port> or http://localhost:<port>"
            )
    if origin:
        scheme, sep, rest = origin.decode("latin-1").lower().partition("://")
        if not (sep and scheme in ("http", "https") and host and rest == host.decode("latin-1").lower()):
            return 403, (
                f"refused a cross-origin request from origin {origin.decode('latin-1')!r}: only this server's own "
                "pages may call it from a browser"
            )
    if has_body and method in _WRITES:
        media_type = content_type.split(b";", 1)[0].strip().lower()
        if media_type not in _BODY_TYPES:
            given = content_type.decode("latin-1") or "none"
            return 415, (
                f"send the body as JSON with 'Content-Type: application/json' (got {given!r}); "
                "curl: -H 'Content-Type: application/json'"
            )
    return None
