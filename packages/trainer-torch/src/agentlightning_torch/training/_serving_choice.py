"""How `TorchEngine` serves its policies: core's serving contract (`agentlightning.loop.Serving`), one implementation
per way of serving, one factory.

The engine's server steps (core's `agentlightning.Engine`: ``start_servers``, ``wait_servers_idle``,
``abort_servers``, ``sync_weights``, ``iteration_metrics``, ``stop_servers``, ``policy_versions``) each call one step
of the `Serving` that `make_serving` picked from the config, once:

* `BackendServing`: one policy on the embedded `LocalBackend` (in-process, or over HTTP with ``backend_http``);
* `BackendPoliciesServing`: several policies on `LocalBackend` s: the LoRA adapters beside the frozen base, a backend
  of its own per full-weight policy, one in-process endpoint routing by the request's ``model``;
* `VLLMWeightsServing`: one policy on vLLM, its full weights synced and verified by log-probs;
* `VLLMLoRAServing`: several LoRA policies on vLLM's multi-LoRA serving, each adapter synced and verified.

trainer-verl's servings implement the same protocol; ``tests/test_serving_contract.py`` runs every implementation
against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentlightning.loop import Serving
from agentlightning_torch.serving._local import BackendPoliciesServing, BackendServing, BackendSettings
from agentlightning_torch.vllm._serving import VLLMLoRAServing, VLLMModel, VLLMWeightsServing

if TYPE_CHECKING:
    import torch

    from agentlightning_torch.training._policy_set import TrainedPolicies
    from agentlightning_torch.training._trainer_config import TorchTrainerConfig

__all__ = ["backend_settings", "make_serving", "vllm_model"]


def make_serving(
    config: TorchTrainerConfig,
    *,
    policy: torch.nn.Module,
    trained: TrainedPolicies | None,
    tokenizer: Any,
    generation_config: Any = None,
) -> Serving:
    """The `Serving` for ``config`` (``backend``, ``policies``), serving ``policy`` (or the ``trained`` policies).

    Args:
        config: The trainer's settings.
        policy: The trained model (with policies: the frozen base the LoRA adapters wrap).
        trained: With ``config.policies``: every trained policy; else ``None``.
        tokenizer: The model's tokenizer.
        generation_config: The model folder's generation defaults (the local backend's sampling defaults).
    """
    if config.backend == "vllm":
        model = vllm_model(config, tokenizer, vocab_size=int(getattr(policy.config, "vocab_size", len(tokenizer))))
        if trained is not None and trained.lora is not None:
            return VLLMLoRAServing(model, trained.lora)
        return VLLMWeightsServing(model, policy)
    backend = backend_settings(config, tokenizer, generation_config)
    if trained is not None:
        return BackendPoliciesServing(backend, trained)
    lora = config.ppo.lora
    return BackendServing(backend, policy, serve_lora=lora is not None and lora.serve == "adapter")


def vllm_model(config: TorchTrainerConfig, tokenizer: Any, vocab_size: int) -> VLLMModel:
    """The `VLLMModel` of a ``backend="vllm"`` config."""
    return VLLMModel(
        config.vllm, config.model_dir, config.model_name, config.tool_parser, config.device, tokenizer, vocab_size
    )


def backend_settings(config: TorchTrainerConfig, tokenizer: Any, generation_config: Any) -> BackendSettings:
    """How ``config`` builds and reaches its `LocalBackend` s."""
    options = {
        "device": config.device,
        "max_batch_size": config.max_batch_size,
        "batch_wait_ms": config.batch_wait_ms,
        "max_batch_wait_ms": config.max_batch_wait_ms,
        "num_threads": config.num_threads,
        "seed": config.seed,
        "tool_parser": config.tool_parser,
    }
    return BackendSettings(tokenizer, generation_config, config.model_name, config.backend_http, options)
