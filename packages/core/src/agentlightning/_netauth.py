"""Who may reach a served endpoint: loopback detection and the token rules shared by the store and the proxy.

Off loopback a server must have a bearer token of at least `MIN_TOKEN_LENGTH` characters; on loopback a token is
optional (any local user can reach it, which is the single-machine default).
"""

from __future__ import annotations

import hmac
import ipaddress

__all__ = [
    "MIN_TOKEN_LENGTH",
    "TOKEN_HINT",
    "bearer_matches",
    "check_bind_token",
    "is_loopback",
    "is_wildcard",
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


def bearer_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (constant-time comparison)."""
    return hmac.compare_digest((authorization or "").encode("latin-1", "replace"), f"Bearer {token}".encode())
