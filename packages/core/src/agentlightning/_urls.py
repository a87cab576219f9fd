"""The LLM proxy's per-rollout and per-slot URLs, built and parsed in this one place.

Agents reach the proxy at ``{endpoint}/rollout/{rollout_id}/attempt/{attempt_id}/v1``. Rollout and attempt ids
may hold any printable character (``task/7#2`` included), so each id is percent-encoded as one path segment when
the URL is built and decoded from the raw (still encoded) request path when it is parsed.

A runner's worker slot has a URL of its own, ``{endpoint}/slot/{key}/v1``, that stays the same from one rollout to
the next (the runner tells the proxy which attempt the slot runs; see `agentlightning.proxy.LLMProxy`), so an
agent's HTTP client, cached per base URL by most frameworks, is reused. Slot keys use ``[A-Za-z0-9._-]`` only.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

__all__ = [
    "check_slot_key",
    "parse_rollout_prefix",
    "parse_slot_prefix",
    "rollout_base_url",
    "rollout_prefix",
    "slot_base_url",
]

_SLOT_KEY = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def rollout_prefix(rollout_id: str, attempt_id: str) -> str:
    """The path prefix ``/rollout/{rollout_id}/attempt/{attempt_id}`` with both ids percent-encoded."""
    return f"/rollout/{quote(rollout_id, safe='')}/attempt/{quote(attempt_id, safe='')}"


def rollout_base_url(endpoint: str, rollout_id: str, attempt_id: str) -> str:
    """The OpenAI base URL of one attempt on the proxy at ``endpoint``: ``{endpoint}/rollout/.../attempt/.../v1``."""
    return f"{endpoint.rstrip('/')}{rollout_prefix(rollout_id, attempt_id)}/v1"


def parse_rollout_prefix(raw_prefix: str) -> tuple[str, str] | None:
    """``(rollout_id, attempt_id)`` of a raw (percent-encoded) path prefix built by `rollout_prefix`, else ``None``.

    Args:
        raw_prefix: The request path before ``/v1/...`` exactly as sent (ASGI ``raw_path``, not the decoded path:
            an encoded ``/`` inside an id must not split it).
    """
    parts = raw_prefix.split("/")
    if len(parts) == 5 and not parts[0] and parts[1] == "rollout" and parts[3] == "attempt" and parts[2] and parts[4]:
        rollout_id, attempt_id = unquote(parts[2]), unquote(parts[4])
        if rollout_id and attempt_id:
            return rollout_id, attempt_id
    return None


def check_slot_key(key: str) -> str:
    """``key`` if it is a valid slot key (1-128 of ``[A-Za-z0-9._-]``).

    Raises:
        ValueError: Otherwise.
    """
    if not _SLOT_KEY.match(key):
        raise ValueError(f"a slot key is 1-128 characters of [A-Za-z0-9._-], got {key!r}")
    return key


def slot_base_url(endpoint: str, key: str) -> str:
    """The OpenAI base URL of one runner slot on the proxy at ``endpoint``: ``{endpoint}/slot/{key}/v1``."""
    return f"{endpoint.rstrip('/')}/slot/{check_slot_key(key)}/v1"


def parse_slot_prefix(raw_prefix: str) -> str | None:
    """The slot key of a path prefix ``/slot/{key}``, else ``None``."""
    parts = raw_prefix.split("/")
    if len(parts) == 3 and not parts[0] and parts[1] == "slot" and _SLOT_KEY.match(parts[2]):
        return parts[2]
    return None
