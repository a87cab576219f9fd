"""How `TorchEngine` serves its policies: one `Serving` protocol, one implementation per way of serving, one factory.

The engine's server steps (core's `agentlightning.Engine`: ``start_servers``, ``drain_servers``, ``sync_weights``,
``iteration_metrics``, ``stop_servers``, ``policy_versions``) each call one step of the `Serving` that
`make_serving` picked from the config, once:

* `BackendServing`: one policy on the embedded `LocalBackend` (in-process, or over HTTP with ``backend_http``);
* `BackendPoliciesServing`: several policies on `LocalBackend` s: the LoRA adapters beside the frozen base, a backend
  of its own per full-weight policy, one in-process endpoint routing by the request's ``model``;
* `VLLMWeightsServing`: one policy on vLLM, its full weights synced and verified by log-probs;
* `VLLMLoRAServing`: several LoRA policies on vLLM's multi-LoRA serving, each adapter synced and verified.

trainer-verl has a `Serving` protocol of its own with the same steps (``agentlightning_verl.Serving``); a test
(``tests/test_serving_contract.py``) keeps the two alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from agentlightning_torch.training._policy_set import TrainedPolicies
    from agentlightning_torch.training._trainer_config import TorchTrainerConfig

__all__ = ["Serving", "make_serving"]


@runtime_checkable
class Serving(Protocol):
    """The inference servers of a `TorchEngine`, and how the trainer's weights get into them.

    Every step is the engine's own, delegated: ``start_servers`` → `start`, ``drain_servers`` → `drain`,
    ``sync_weights`` → `sync`, ``iteration_metrics`` → `metrics`, ``stop_servers`` → `stop`, ``policy_versions`` →
    `policy_versions`.
    """

    async def start(self, version: int) -> list[str]:
        """Start (or reach) the servers, serving the trainer's current weights as ``version``; returns their base
        URLs (an ``inproc://`` one for a backend served in-process). Starting again keeps the running servers."""
        ...

    async def drain(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until the servers generate nothing; returns the requests still running."""
        ...

    async def sync(self, version: int) -> None:
        """Load the trainer's updated weights into the servers, which report ``version`` for them from now on.

        Raises:
            RuntimeError: The servers are not started (vLLM: `VLLMError`), or vLLM's log-probs differ from the
                trainer's (`WeightSyncMismatch`, naming the version and policy).
        """
        ...

    def metrics(self) -> dict[str, float]:
        """Serving metrics since the previous call (batches and generation time, or the last sync's timings)."""
        ...

    async def stop(self) -> None:
        """Stop what `start` started (a vLLM server given by URL keeps running)."""
        ...

    def policy_versions(self) -> dict[str, int]:
        """Per policy, the version of the weights serving it, where the servers report none (vLLM's LoRA
        adapters); empty otherwise."""
        ...


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
    from agentlightning_torch.serving._local import BackendPoliciesServing, BackendServing, BackendSettings
    from agentlightning_torch.vllm._serving import VLLMLoRAServing, VLLMWeightsServing, vllm_model

    if config.backend == "vllm":
        model = vllm_model(config, tokenizer, vocab_size=int(getattr(policy.config, "vocab_size", len(tokenizer))))
        if trained is not None and trained.lora is not None:
            return VLLMLoRAServing(model, trained.lora)
        return VLLMWeightsServing(model, policy)
    backend = BackendSettings.of(config, tokenizer, generation_config)
    if trained is not None:
        return BackendPoliciesServing(backend, trained)
    lora = config.ppo.lora
    return BackendServing(backend, policy, serve_lora=lora is not None and lora.serve == "adapter")
