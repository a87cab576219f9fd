"""How the torch trainer serves its policy: the local backend, its OpenAI-compatible server, and its implementations
of core's serving contract (`agentlightning.loop.Serving`).

- `LocalBackend`: continuous-batching generation on one model (plus LoRA policies beside it), `generate_batch` below
  it; `OpenAIEndpoint` (vLLM's token-id wire format, also in-process for the proxy) and `serve_backend` /
  `BackendServer` (the same over HTTP).
- `BackendServing` (one policy) and `BackendPoliciesServing` (several: what they need of them is `ServedPolicies`),
  `BackendSettings` (how their backends are built). vLLM's servings are `agentlightning_torch.vllm`'s; the engine's
  `agentlightning_torch.training.make_serving` picks one.
"""

from agentlightning_torch.serving._backend import BackendStats, LocalBackend, RequestCancelled, merged_state_dict
from agentlightning_torch.serving._endpoint import OpenAIEndpoint
from agentlightning_torch.serving._generate import GenerationResult, SamplingParams, generate_batch
from agentlightning_torch.serving._local import (
    BackendPoliciesServing,
    BackendServing,
    BackendSettings,
    ServedPolicies,
)
from agentlightning_torch.serving._server import BackendServer, create_app, serve_backend

__all__ = [
    "BackendPoliciesServing",
    "BackendServer",
    "BackendServing",
    "BackendSettings",
    "BackendStats",
    "GenerationResult",
    "LocalBackend",
    "OpenAIEndpoint",
    "RequestCancelled",
    "SamplingParams",
    "ServedPolicies",
    "create_app",
    "generate_batch",
    "merged_state_dict",
    "serve_backend",
]
