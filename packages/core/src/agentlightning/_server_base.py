"""What the served store and the LLM proxy share as HTTP servers (neither imports the other's server module).

`STORE_MAX_BODY_BYTES` is the store server's default request limit; the proxy sizes its own from it, so that the
record of any call it accepts fits in the store.
"""

from __future__ import annotations

__all__ = ["STORE_MAX_BODY_BYTES"]

STORE_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body a served store accepts by default (32 MiB); larger ones get 413."""
