"""The network rule every server of the project follows, for servers that other packages run.

Off loopback a server needs a bearer token of at least `MIN_TOKEN_LENGTH` characters (`check_bind_token`), and a
request carries it as ``Authorization: Bearer <token>`` (`bearer_matches`). The store, the LLM proxy and the
dashboard apply the same rule; so do the model servers that trainer packages run.
"""

from __future__ import annotations

from agentlightning._netauth import MIN_TOKEN_LENGTH, bearer_matches, check_bind_token, new_token

__all__ = ["MIN_TOKEN_LENGTH", "bearer_matches", "check_bind_token", "new_token"]
