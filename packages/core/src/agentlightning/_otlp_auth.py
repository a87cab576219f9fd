"""The credential a command agent sends its OpenTelemetry spans with: good for its own attempt only.

A runner gives each command it starts ``Authorization: Bearer agl-otlp.<ids>.<mac>`` for the store server's OTLP
route (``POST /v1/traces``), where ``<ids>`` is the attempt's rollout and attempt ids and ``<mac>`` an HMAC-SHA256 of
them keyed by the store's token. The server checks the MAC with its token, and that every span of the body belongs
to that attempt: the agent never sees the store's token, and cannot write spans into any other attempt (another
runner's included). Stateless, so any number of store servers over one database check it alike.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

__all__ = ["OTLP_CREDENTIAL_PREFIX", "attempt_credential", "attempt_of_credential"]

OTLP_CREDENTIAL_PREFIX = "agl-otlp."
"""How an attempt's OTLP credential starts (the store's own token never does: it has no dot)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _mac(secret: str, ids: str) -> str:
    return _b64(hmac.new(secret.encode(), b"agentlightning-otlp\0" + ids.encode(), hashlib.sha256).digest())


def attempt_credential(secret: str, rollout_id: str, attempt_id: str) -> str:
    """The bearer credential for spans of one attempt, keyed by the store's token ``secret``."""
    ids = _b64(json.dumps([rollout_id, attempt_id], separators=(",", ":")).encode())
    return f"{OTLP_CREDENTIAL_PREFIX}{ids}.{_mac(secret, ids)}"


def attempt_of_credential(secret: str, credential: str) -> tuple[str, str] | None:
    """``(rollout_id, attempt_id)`` that ``credential`` was made for with ``secret``, or ``None`` (not one, forged)."""
    if not credential.startswith(OTLP_CREDENTIAL_PREFIX):
        return None
    ids, _, mac = credential[len(OTLP_CREDENTIAL_PREFIX) :].partition(".")
    if not ids or not hmac.compare_digest(mac.encode(), _mac(secret, ids).encode()):
        return None
    try:
        decoded = json.loads(base64.urlsafe_b64decode(ids + "=" * (-len(ids) % 4)))
    except ValueError:
        return None
    if not (isinstance(decoded, list) and len(decoded) == 2 and all(isinstance(x, str) and x for x in decoded)):  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
        return None
    return decoded[0], decoded[1]  # pyright: ignore[reportUnknownVariableType]
