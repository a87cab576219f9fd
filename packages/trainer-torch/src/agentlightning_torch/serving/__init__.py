"""How the torch trainer serves its policy: the local backend, its OpenAI-compatible server, and the `Serving`
contract the engine delegates to.

- `LocalBackend`: continuous-batching generation on one model (plus LoRA policies beside it), `generate_batch` below
  it; `OpenAIEndpoint` (vLLM's token-id wire format, also in-process for the proxy) and `serve_backend` /
  `BackendServer` (the same over HTTP).
- `make_serving`, which picks one implementation of core's serving contract (`agentlightning.loop.Serving`) per way
  of serving: `BackendServing`, `BackendPoliciesServing` here, `agentlightning_torch.vllm.VLLMWeightsServing` and
  `agentlightning_torch.vllm.VLLMLoRAServing` through vLLM.
"""

from agentlightning_torch.serving._backend import BackendStats, LocalBackend, RequestCancelled, merged_state_dict
from agentlightning_torch.serving._endpoint import OpenAIEndpoint
from agentlightning_torch.serving._generate import GenerationResult, SamplingParams, generate_batch
from agentlightning_torch.serving._local import BackendPoliciesServing, BackendServing
from agentlightning_torch.serving._server import BackendServer, create_app, serve_backend
from agentlightning_torch.serving._serving import make_serving

__all__ = [
    "BackendPoliciesServing",
    "BackendServer",
    "BackendServing",
    "BackendStats",
    "GenerationResult",
    "LocalBackend",
    "OpenAIEndpoint",
    "RequestCancelled",
    "SamplingParams",
    "create_app",
    "generate_batch",
    "make_serving",
    "merged_state_dict",
    "serve_backend",
]
