"""The LLM proxy: forwards agents' OpenAI-style calls (and Anthropic Messages calls, translated to chat) to inference
backends and records exact token ids.

See `LLMProxy` for routes, recording modes and pause/resume around weight updates. `rollout_base_url` and
`parse_rollout_prefix` build and parse the per-rollout URL (ids percent-encoded); `slot_base_url` and
`parse_slot_prefix` the stable URL of a runner slot (see `agentlightning.runner.SlotRegistrar`).
`register_backend` makes a backend served in this process reachable without HTTP (an ``inproc://`` URL).
"""

import agentlightning._serve_required  # noqa: F401  # pyright: ignore[reportUnusedImport]  # the install line first
from agentlightning._urls import (
    parse_rollout_prefix,
    parse_slot_prefix,
    rollout_base_url,
    rollout_prefix,
    slot_base_url,
)
from agentlightning.proxy._proxy import (
    CALL_ID_HEADER,
    MODEL_VERSION_FIELD,
    MODEL_VERSION_HEADER,
    LLMProxy,
    create_proxy_app,
)
from agentlightning.proxy._transport import (
    IN_PROCESS_SCHEME,
    BackendLost,
    BackendReply,
    InProcessBackend,
    InProcessReply,
    register_backend,
    registered_backend,
    unregister_backend,
)

__all__ = [
    "CALL_ID_HEADER",
    "IN_PROCESS_SCHEME",
    "MODEL_VERSION_FIELD",
    "MODEL_VERSION_HEADER",
    "BackendLost",
    "BackendReply",
    "InProcessBackend",
    "InProcessReply",
    "LLMProxy",
    "create_proxy_app",
    "parse_rollout_prefix",
    "parse_slot_prefix",
    "register_backend",
    "registered_backend",
    "rollout_base_url",
    "rollout_prefix",
    "slot_base_url",
    "unregister_backend",
]
